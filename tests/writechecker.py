"""The write checker: overlapping writers and lost acknowledged pages, from what a run left.

What it owns
------------
Pure functions over two records of a fault-injection run (no I/O, no clock):

- the nodes' **write trace** (``pagesift.core.replication.writetrace``: one line
  ``<CLOCK_MONOTONIC ns> <node id> <epoch> <offset>`` per write group a primary
  committed, every node of the run appending to one file), read by ``parse``;
- what the **client saw acknowledged** (the documents it read back from whichever node
  answered, job by job) against the **surviving primary's documents** at the end.

``check`` returns a ``Verdict`` with the counts a test asserts and the bench reports.

Definitions
-----------
- A **tenure** is every traced write of one (node, epoch): one primary's reign. Its
  interval is [first stamp, last stamp].
- Two tenures **overlap** when their intervals intersect (``a.first <= b.last`` and
  ``b.first <= a.last``). In a correct history, writers follow one another: each
  primary's last write precedes its successor's first, and epochs rise with time. If
  the intervals of two tenures intersect, then one of them wrote at an instant at
  which the other had written already and wrote again later: two nodes (or two epochs)
  were accepting writes in overlapping intervals, the split brain the failsafe must
  never allow. This is the brief's "each wrote inside the other's interval" made
  total: it also flags a writer that starts and stops inside another's interval.
- A tenure is **stale** when it starts after a tenure of a HIGHER epoch ended (no
  overlap, but a deposed primary writing later at its old epoch: it missed its fence).
- Writes are **discarded** when a primary committed offsets that its successor (the
  next tenure in time) wrote over: the successor's first offset is at or below them.
  Async replication allows this (the unreplicated tail of a killed primary), so it is
  a figure, not a failure; a page the client saw and the end lacks is the failure.
- A page is **lost** when the client saw it acknowledged (a document of job J) and the
  surviving primary's documents of J lack it at the end; a job the client saw
  started and the end does not have counts every page it saw as lost.

Why it is sound
---------------
One host has one CLOCK_MONOTONIC for every process, so the stamps of both nodes are
on one axis; each stamp is taken after the group is durable, so an interval only
ever starts later and ends later than the writes' acceptance by the commit's own
duration (milliseconds), far below the time a standby takes to wait out a grant,
win the lease and promote: a correct hand-over never shows up as an overlap, and two
writers that both kept writing for longer than one commit do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Write:
    """One traced write: when (CLOCK_MONOTONIC ns), by whom, at which epoch and offset."""

    ns: int
    node: str
    epoch: int
    offset: int


@dataclass(frozen=True, slots=True)
class Tenure:
    """Every traced write of one (node, epoch)."""

    node: str
    epoch: int
    first_ns: int
    last_ns: int
    first_offset: int
    last_offset: int
    writes: int

    def overlaps(self, other: Tenure) -> bool:
        return self.first_ns <= other.last_ns and other.first_ns <= self.last_ns

    def label(self) -> str:
        return f"{self.node}@{self.epoch}"


@dataclass(frozen=True, slots=True)
class Verdict:
    tenures: tuple[Tenure, ...]
    overlaps: tuple[tuple[Tenure, Tenure], ...]
    stale: tuple[Tenure, ...]
    discarded: int  # writes a successor wrote over (a figure: async mode allows them)
    lost: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # job -> pages

    @property
    def lost_pages(self) -> int:
        return sum(len(pages) for pages in self.lost.values())

    @property
    def ok(self) -> bool:
        return not self.overlaps and not self.stale and not self.lost

    def explain(self) -> str:
        """The violations, one per line ("" when there are none)."""
        lines = [
            f"overlapping writers: {a.label()} [{a.first_ns}, {a.last_ns}] and "
            f"{b.label()} [{b.first_ns}, {b.last_ns}]"
            for a, b in self.overlaps
        ]
        lines += [f"stale writer: {t.label()} wrote after a higher epoch" for t in self.stale]
        lines += [f"lost in job {job}: {list(pages[:5])}" for job, pages in self.lost.items()]
        return "\n".join(lines)


def parse(text: str) -> list[Write]:
    """The trace's lines as ``Write``\\ s; a line that is not four fields raises
    ValueError (each line is one atomic append: a torn line means a broken trace)."""
    out: list[Write] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 4:
            raise ValueError(f"trace line {number}: {line!r} is not 'ns node epoch offset'")
        ns, node, epoch, offset = fields
        out.append(Write(int(ns), node, int(epoch), int(offset)))
    return out


def tenures(writes: Iterable[Write]) -> list[Tenure]:
    """One ``Tenure`` per (node, epoch), in the order of their first write."""
    groups: dict[tuple[str, int], list[Write]] = {}
    for w in writes:
        groups.setdefault((w.node, w.epoch), []).append(w)
    out = [
        Tenure(
            node=node,
            epoch=epoch,
            first_ns=min(w.ns for w in ws),
            last_ns=max(w.ns for w in ws),
            first_offset=min(w.offset for w in ws),
            last_offset=max(w.offset for w in ws),
            writes=len(ws),
        )
        for (node, epoch), ws in groups.items()
    ]
    return sorted(out, key=lambda t: (t.first_ns, t.last_ns))


def overlapping(reigns: Sequence[Tenure]) -> list[tuple[Tenure, Tenure]]:
    """Every pair of tenures whose intervals intersect."""
    return [(a, b) for i, a in enumerate(reigns) for b in reigns[i + 1 :] if a.overlaps(b)]


def stale(reigns: Sequence[Tenure]) -> list[Tenure]:
    """Tenures that began after a tenure of a higher epoch had ended."""
    return [t for t in reigns if any(o.epoch > t.epoch and o.last_ns < t.first_ns for o in reigns)]


def discarded(writes: Iterable[Write], reigns: Sequence[Tenure]) -> int:
    """Writes of each tenure at or above its successor's first offset."""
    by_reign: dict[tuple[str, int], list[int]] = {}
    for w in writes:
        by_reign.setdefault((w.node, w.epoch), []).append(w.offset)
    total = 0
    for before, after in itertools.pairwise(reigns):
        offsets = by_reign[(before.node, before.epoch)]
        total += sum(1 for o in offsets if o >= after.first_offset)
    return total


def lost(
    acknowledged: Mapping[str, Iterable[str]], final: Mapping[str, Iterable[str]]
) -> dict[str, tuple[str, ...]]:
    """Per job, the pages the client saw acknowledged that the end does not hold."""
    out: dict[str, tuple[str, ...]] = {}
    for job, seen in acknowledged.items():
        missing = tuple(sorted(set(seen) - set(final.get(job, ()))))
        if missing:
            out[job] = missing
    return out


def check(
    writes: Sequence[Write],
    acknowledged: Mapping[str, Iterable[str]] | None = None,
    final: Mapping[str, Iterable[str]] | None = None,
) -> Verdict:
    """Everything above over one run."""
    reigns = tenures(writes)
    return Verdict(
        tenures=tuple(reigns),
        overlaps=tuple(overlapping(reigns)),
        stale=tuple(stale(reigns)),
        discarded=discarded(writes, reigns),
        lost=lost(acknowledged or {}, final or {}),
    )
