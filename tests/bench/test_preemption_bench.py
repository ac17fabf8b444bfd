"""bench/preemption.py as a person runs it: `--tenants FILE` takes any valid tenants file
(shares and jobs derived from it), bad input is one line and exit 1, never a traceback.
The figures themselves are bench/RESULTS.md's; here only that every fleet runs and reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

#: Tenant sets unlike the bundled one: other names (so no synthetic jobs by name), two to
#: five tenants, limits below the synthetic jobs' 16 GPUs, one tenant that may hold nothing.
TWO = """
[tenants.prod]
priority = 9
quota_gpus = 6
borrow_limit_gpus = 2
min_run_s = 0

[tenants.dev]
priority = 1
quota_gpus = 2
borrow_limit_gpus = 6
grace_s = 30
min_run_s = 0

[scheduling]
checkpoint_wait_price = 0.5
"""
FIVE = """
[tenants.a]
priority = 50
quota_gpus = 4
[tenants.b]
priority = 40
quota_gpus = 2
borrow_limit_gpus = 2
[tenants.c]
priority = 30
quota_gpus = 0
[tenants.search]
priority = 20
quota_gpus = 2
borrow_limit_gpus = 4
[tenants.e]
priority = 10
quota_gpus = 0
borrow_limit_gpus = 8
min_run_s = 0
[scheduling]
capacity_gpus = 12
"""


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "preemption.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)


@pytest.mark.parametrize("text", [TWO, FIVE], ids=["two", "five"])
def test_any_tenants_file_runs(tmp_path: Path, text: str) -> None:
    f = tmp_path / "tenants.toml"
    f.write_text(text, encoding="utf-8")
    done = bench("--tenants", str(f), "--seeds", "1-2", "--hours", "6", "--prices", "0,1",
                 "--jobs", "1")
    assert (done.returncode, done.stderr) == (0, "")
    out = done.stdout
    assert f"## fleet tenants.toml: {f}" in out
    assert "the price of a wait" in out and "prices meeting it on every fleet" in out
    for name in ("prod", "dev") if text is TWO else ("a", "b", "search", "e"):
        assert f"\n  {name} " in out
    if text is TWO:  # the file's own price is the default
        assert "stage_aware (0.5)" in out


@pytest.mark.parametrize(("args", "says"), [
    (["--tenants", "{bad}"], "tenant 'x': priority: \"high\" is not a whole number"),
    (["--tenants", "{missing}"], "not found"),
    (["--seeds", "one"], "--seeds: 'one' is not whole numbers >= 0"),
    (["--prices", "0,x"], "--prices: '0,x' is not comma-separated numbers"),
    (["--price", "-1"], "--price: -1.0 is not a number in [0, 1e+06]"),
    (["--load", "0"], "--load: 0.0 is not a number > 0"),
])
def test_bad_input_is_one_line_and_exit_1(tmp_path: Path, args: list[str], says: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[tenants.x]\npriority = "high"\nquota_gpus = 1\n', encoding="utf-8")
    args = [a.format(bad=bad, missing=tmp_path / "nope.toml") for a in args]
    done = bench(*args, "--fleet", "small-busy") if "--tenants" not in args else bench(*args)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("preemption.py: ") and says in done.stderr
