"""Summarise `mutmut results --all true` (read on stdin): the score and the mutants left.

Score = killed / all mutants; a timeout counts as killed (the mutant made the tests hang,
which a test run notices), "no tests" and "survived" count against it. The survivors are
printed by module so that bench/RESULTS.md can say of each why it is equivalent.
"""

from __future__ import annotations

import collections
import re
import sys

KILLED = {"killed", "timeout"}
LINE = re.compile(r"^\s*(?P<name>\S+):\s*(?P<status>.+?)\s*$")


def main() -> int:
    status_by_mutant: dict[str, str] = {}
    for raw in sys.stdin:
        match = LINE.match(raw)
        if match:
            status_by_mutant[match["name"]] = match["status"]
    if not status_by_mutant:
        print("mutation: no results (did mutmut run?)", file=sys.stderr)
        return 1
    counts = collections.Counter(status_by_mutant.values())
    killed = sum(n for status, n in counts.items() if status in KILLED)
    total = len(status_by_mutant)
    print(f"mutants {total}: " + ", ".join(f"{s} {n}" for s, n in sorted(counts.items())))
    print(f"score {killed}/{total} = {100.0 * killed / total:.1f}% killed")
    left: dict[str, list[str]] = collections.defaultdict(list)
    for name, status in sorted(status_by_mutant.items()):
        if status not in KILLED:
            module = name.split(".x", 1)[0]
            left[module].append(f"{name} ({status})")
    for module, names in sorted(left.items()):
        print(f"\n{module}: {len(names)} not killed")
        for name in names:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
