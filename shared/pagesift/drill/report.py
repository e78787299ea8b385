"""How a drill's verdict is printed: the ``--json`` shapes and the text lines.

Owns ``run_json``/``summary_json`` (with ``--json`` the drill prints exactly one object,
``{"runs": [run_json...], "summary": summary_json}``) and ``run_lines``/``summary_line``
(the text report). Pure: each takes a ``RunReport``/``Summary`` and returns values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagesift.drill.verdict import RunReport, Summary

MAX_LISTED = 10  # URLs listed per site-check finding


def run_json(r: RunReport) -> dict[str, Any]:
    h = r.webhooks
    return {
        "run": r.run,
        "mode": r.mode,
        "auto": r.auto,
        "kill": r.kill,
        "killed": r.killed,
        "survivor": r.survivor,
        "job_id": r.job_id,
        "kill_after_pages": r.kill_after_pages,
        "rto_s": r.rto_s,
        "read_only_after_s": r.read_only_after_s,
        "lag_at_kill": r.lag_at_kill,
        "discarded": r.discarded,
        "pages_shown": r.pages_shown,
        "pages_lost": r.pages_lost,
        "duplicates": r.duplicates,
        "site": None
        if r.site is None
        else {
            "expected": r.site.expected,
            "missing": list(r.site.missing[:MAX_LISTED]),
            "unexpected": list(r.site.unexpected[:MAX_LISTED]),
        },
        "job_state": r.job_state,
        "webhook_events_lost": h.lost,
        "webhook_events_resent": h.resent,
        "webhook_events": {
            "expected": h.expected,
            "received": h.received,
            "lost": h.lost,
            "resent": h.resent,
            "in_flight_resent": h.in_flight_resent,
            "undone": h.undone,
            "bad_signatures": h.bad_signatures,
            "signatures_verified": h.verified,
        },
        "digests_equal": r.digests_equal,
        "digest_offset": r.digest_offset,
        "resync": r.resync,
        "rejoined": r.rejoined,
        "allowed": r.allowed,
        "passed": r.passed,
        "failures": list(r.failures),
    }


def summary_json(s: Summary) -> dict[str, Any]:
    return {
        "runs": s.runs,
        "passed": s.passed,
        "all_passed": s.all_passed,
        "rto_median_s": s.rto_median_s,
        "rto_worst_s": s.rto_worst_s,
        "pages_lost": s.pages_lost,
        "webhook_events_resent": s.webhook_events_resent,
    }


def drill_json(reports: Sequence[RunReport], summary: Summary) -> dict[str, Any]:
    return {"runs": [run_json(r) for r in reports], "summary": summary_json(summary)}


def _seconds(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f} s"


def run_lines(r: RunReport, total: int) -> list[str]:
    """The text report of one run."""
    h = r.webhooks
    how = "the witness elects" if r.auto else "manual runbook"
    victim = "etcd" if r.kill == "witness" else r.killed
    lines = [
        f"run {r.run}/{total}: kill {r.kill} ({victim}), {r.mode} replication, {how}, "
        f"after {r.kill_after_pages} pages shown: {'PASSED' if r.passed else 'FAILED'}"
    ]
    if r.kill == "witness":
        lines.append(
            f"  writes      refused {_seconds(r.read_only_after_s)} after the kill, "
            f"unavailable for {_seconds(r.rto_s)}"
        )
    else:
        lines.append(f"  rto         {_seconds(r.rto_s)} (kill -> first write accepted by "
                     f"{r.survivor})")  # fmt: skip
    lag = r.lag_at_kill
    lag_s = "?" if lag.get("seconds") is None else f"{lag['seconds']:.3f} s"
    lines.append(
        f"  lag at kill {lag.get('offsets', '?')} offsets ({lag_s}); "
        f"discarded on rejoin: {'?' if r.discarded is None else r.discarded}"
    )
    site = ""
    if r.site is not None:
        site = (
            f"; site: {r.site.expected - len(r.site.missing)}/{r.site.expected} present"
            + (f", missing {', '.join(r.site.missing[:3])}" if r.site.missing else "")
            + (f", unexpected {', '.join(r.site.unexpected[:3])}" if r.site.unexpected else "")
        )
    lines.append(
        f"  pages       {r.pages_lost} lost of {r.pages_shown} shown; "
        f"{r.duplicates} duplicated{site}; job {r.job_state}"
    )
    sig = "signatures ok" if h.verified and not h.bad_signatures else (
        f"{h.bad_signatures} BAD signatures" if h.bad_signatures else "signatures not checked"
    )  # fmt: skip
    lines.append(
        f"  webhooks    {h.received} received for {h.expected} events: {h.lost} lost, "
        f"{h.resent} re-sent after acknowledgement, {h.in_flight_resent} in flight re-sent, "
        f"{h.undone} about undone writes; {sig}"
    )
    digest = (
        "equal" if r.digests_equal else "DIFFERENT" if r.digests_equal is False else "not taken"
    )
    at = f" at offset {r.digest_offset}" if r.digest_offset is not None else ""
    lines.append(f"  digests     {digest}{at}")
    if r.kill != "witness":
        lines.append(f"  rejoin      {r.rejoined or r.killed}: {r.resync}")
    elif r.rejoined:
        lines.append(f"  rejoin      {r.rejoined} follows the newly elected primary: {r.resync}")
    if r.mode == "async":
        lines.append(
            f"  lag window  allowed {r.allowed} lost pages + re-sent events "
            f"(writes the standby had not applied); saw {r.pages_lost + h.resent}"
        )
    lines.extend(f"  FAILED: {why}" for why in r.failures)
    return lines


def summary_line(s: Summary) -> str:
    verdict = "all passed" if s.all_passed else f"{s.runs - s.passed} FAILED"
    return (
        f"summary: {s.runs} run(s), {verdict}; rto median {_seconds(s.rto_median_s)}, "
        f"worst {_seconds(s.rto_worst_s)}; {s.pages_lost} pages lost, "
        f"{s.webhook_events_resent} acknowledged events re-sent"
    )
