"""Labelled, non-overlapping time segments and the two operations attribution needs.

Times are integer microseconds so that sums are exact: the six components must add up
to the job's wall time to the microsecond, which floating-point seconds cannot promise.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

US_PER_S = 1_000_000


def to_us(seconds: float) -> int:
    return round(seconds * US_PER_S)


def to_s(us: int) -> float:
    return us / US_PER_S


@dataclass(slots=True)
class Timeline:
    """Sorted, disjoint segments `[starts[i], ends[i])` each labelled with a phase name.

    Adjacent segments with the same label are merged on append, which keeps a long run
    of back-to-back effective steps as one segment.
    """

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    def add(self, start: int, end: int, label: str) -> None:
        if end <= start:
            return
        if self.labels and self.labels[-1] == label and self.ends[-1] == start:
            self.ends[-1] = end
            return
        self.starts.append(start)
        self.ends.append(end)
        self.labels.append(label)

    def __len__(self) -> int:
        return len(self.starts)

    def segments(self) -> Iterable[tuple[int, int, str]]:
        return zip(self.starts, self.ends, self.labels, strict=True)

    def totals(self, lo: int | None = None, hi: int | None = None) -> dict[str, int]:
        """Microseconds per label, optionally only inside `[lo, hi)`."""
        out: dict[str, int] = {}
        if lo is None and hi is None:
            for s, e, label in self.segments():
                out[label] = out.get(label, 0) + (e - s)
            return out
        low = -(2**63) if lo is None else lo
        high = 2**63 if hi is None else hi
        i = bisect_right(self.ends, low)  # the first segment that ends after `low`
        while i < len(self.starts) and self.starts[i] < high:
            s = max(self.starts[i], low)
            e = min(self.ends[i], high)
            if e > s:
                label = self.labels[i]
                out[label] = out.get(label, 0) + (e - s)
            i += 1
        return out

    def first_start(self, label: str, at_or_after: int = -(2**63)) -> int | None:
        """Start (clipped to `at_or_after`) of the first `label` time at or after a moment."""
        i = bisect_right(self.ends, at_or_after)
        while i < len(self.starts):
            if self.labels[i] == label:
                return max(self.starts[i], at_or_after)
            i += 1
        return None


def resolve_overlaps(
    intervals: list[tuple[int, int, str]],
    rank: Callable[[str], int],
    tie: Callable[[str], int],
) -> Timeline:
    """Flatten overlapping labelled intervals into a timeline.

    Where several are active, the lowest `rank(label)` wins; among equal ranks the one
    that started last (the innermost) wins, then the lowest `tie(label)`. Explicit phases
    are few (tens per attempt), so a plain sweep is fast enough.
    """
    out = Timeline()
    if not intervals:
        return out
    ordered = sorted(intervals)
    points = sorted({p for s, e, _ in ordered for p in (s, e)})
    active: list[tuple[int, int, str]] = []
    nxt = 0
    for p, q in itertools.pairwise(points):
        while nxt < len(ordered) and ordered[nxt][0] <= p:
            active.append(ordered[nxt])
            nxt += 1
        active = [iv for iv in active if iv[1] > p]
        if not active:
            continue
        best = min(active, key=lambda iv: (rank(iv[2]), -iv[0], tie(iv[2]), iv[2]))
        out.add(p, q, best[2])
    return out


def paint(base: Timeline, overlay: Timeline, replaceable: Callable[[str], bool]) -> Timeline:
    """Lay `overlay` over `base`: overlay labels replace base labels where allowed.

    Both timelines are sorted and disjoint; this is one linear merge. Overlay time that
    falls outside every base segment is dropped (base covers the whole job).
    """
    if not overlay.starts:
        return base
    out = Timeline()
    o_starts, o_ends, o_labels = overlay.starts, overlay.ends, overlay.labels
    n_over = len(o_starts)
    j = 0
    for s, e, label in base.segments():
        if not replaceable(label):
            out.add(s, e, label)
            continue
        while j < n_over and o_ends[j] <= s:
            j += 1
        cur = s
        k = j
        while k < n_over and o_starts[k] < e:
            os_ = max(o_starts[k], s)
            oe = min(o_ends[k], e)
            if os_ > cur:
                out.add(cur, os_, label)
            out.add(os_, oe, o_labels[k])
            cur = oe
            k += 1
        if cur < e:
            out.add(cur, e, label)
    return out
