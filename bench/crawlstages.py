"""CPU per stage of pagesift's HTML path, in-process, over a crawl site's HTML files.

Owns the stage table of the crawl section (``bench.crawl`` calls ``measure`` after its
runs; ``python -m bench.crawlstages --site python`` runs it alone and writes
``bench/out/crawlstages-<site>.md`` and ``.json``). For each of the site's ``.html``
files, read from disk (the bytes nginx would send), it times each stage of what pagesift
does to a page with ``time.process_time`` around the stage's call alone: the stage's
input (a parsed tree, the cleaned HTML) is made outside the timed span. A stage's figure
is the sum over the files / the number of files, best of ``passes`` passes.

The stages, each through the repo's public functions, looked up by name when measured
(another engineer is changing them): a function that is not there makes its row
"n/a (missing: module.name)", a function that fails on every page "n/a (failed: ...)";
neither stops the other rows.

- the extraction floor: ``htmlclean.to_markdown`` of the raw page, the conversion alone
  (issue 30's goal: the crawl's whole CPU per page at most ``FLOOR_GOAL`` times it);
- ``htmlshape.check_shape``, the lexbor parse, ``htmlhead.read_head``,
  ``htmllinks.links``, ``htmlclean.content_root`` + ``clean``, ``to_markdown`` of the
  cleaned HTML, and the whole ``html.extract`` (default ``Wanted()``);
- AUTO's ``autorender.needs_render(body, "text/html")``; ``content.decode`` +
  ``content.meta_refresh``;
- the worker hand-off: a ``workers.WorkerPool(2)`` running ``handoff_echo`` (module
  level here, so the forkserver imports it by path: the ``__main__`` guard keeps that
  import inert) with the page text, two calls in flight, the pages repeated up to
  ``HANDOFF_CALLS`` calls a pass so ``/proc/<pid>/stat``'s 10 ms ticks stay small per
  call; the calling process's CPU (``process_time``) and the workers' (their
  ``/proc/<pid>/stat`` utime + stime) per call.

Beside them the table shows what a crawl measured (``crawl``: the pagesift run
``bench.crawl`` reports, or the last ``crawl-<site>.json`` when run alone): CPU per page
of the node's main process and of its extraction workers. Nothing here talks to a
network; the worker pool is the only child process, closed before ``measure`` returns.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import MB, OUT_DIR, machine_facts, markdown_table, say, write_json
from bench.tools import DOC_SITES, doc_root

FLOOR_GOAL = 1.3  # issue 30: the crawl's CPU per page at most this times the floor
HANDOFF_CALLS = 2000  # worker calls per hand-off pass at least (pages repeated)
WARM_BURSTS = 600  # bursts of 8 calls at most to get the pool's two workers started,
WARM_TIMEOUT = 60.0  # and seconds (0.1 s apart: a start may be slow on a busy machine)
HANDOFF_TIMEOUT = 600.0  # seconds one hand-off pass may take at most
BASE = "http://127.0.0.1/"  # the pages' URL prefix (links resolve against it)
_CLK_TCK = os.sysconf("SC_CLK_TCK")

_EXTRACT = "pagesift.primary.extract"
_ENGINE = "pagesift.primary.engine"


class Missing(Exception):
    """A stage's function is not in the repo (any more): its dotted name."""


def _resolve(path: str) -> Any:
    """The object at dotted ``path`` (``package.module.name``), or ``Missing``."""
    module, _, name = path.rpartition(".")
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise Missing(path) from None
    got = getattr(mod, name, None)
    if got is None:
        raise Missing(path)
    return got


def handoff_echo(text: str) -> int:
    """The worker hand-off's call: as little work as a call can be (the text's length)."""
    return len(text)


@dataclass(frozen=True, slots=True)
class Page:
    url: str
    body: bytes
    text: str


# a stage's (prepare, call): the untimed input of a page, and the timed call on it
Built = tuple[Callable[[Page], Any], Callable[[Any], object]]


@dataclass(slots=True)
class Stage:
    """One row: ``ms`` per page (None when n/a, with ``why``), the pages it failed on."""

    key: str
    label: str
    ms: float | None = None
    errors: int = 0
    why: str = ""
    pages: int = 0
    note: str = ""  # what the stage found, said under the table

    def cell(self) -> str:
        return f"{self.ms:.3f}" if self.ms is not None else f"n/a ({self.why})"


def load_pages(root: Path, max_files: int = 0) -> list[Page]:
    """The ``.html`` files under ``root`` (sorted; at most ``max_files``, 0 = all), their
    text decoded as the crawl would (``content.decode``, else UTF-8 with replacement)."""
    try:
        decode: Callable[..., str] | None = _resolve(f"{_ENGINE}.content.decode")
    except Missing:
        decode = None
    pages: list[Page] = []
    for path in sorted(root.rglob("*.html")):
        if not path.is_file():
            continue
        body = path.read_bytes()
        text = decode(body, None, html=True) if decode else body.decode("utf-8", "replace")
        pages.append(Page(BASE + path.relative_to(root).as_posix(), body, text))
        if max_files and len(pages) >= max_files:
            break
    return pages


# ---------------------------------------------------------------------------- timing


def _timed(
    key: str,
    label: str,
    pages: list[Page],
    passes: int,
    build: Callable[[], Built],
) -> Stage:
    """Time ``call(prepare(page))`` (the call alone) over ``pages``, best of ``passes``.
    ``build`` resolves the stage's functions (``Missing`` makes the row n/a)."""
    stage = Stage(key, label, pages=len(pages))
    try:
        prepare, call = build()
    except Missing as exc:
        stage.why = f"missing: {exc}"
        return stage
    except Exception as exc:  # its input could not be made (a changed signature)
        stage.why = f"failed: {type(exc).__name__}: {exc}"[:120]
        return stage
    best = math.inf
    last_error = ""
    for _ in range(passes):
        total = 0.0
        errors = 0
        for page in pages:
            try:
                arg = prepare(page)
            except Exception as exc:  # its input could not be made
                errors += 1
                last_error = f"{type(exc).__name__}: {exc}"[:120]
                continue
            t0 = time.process_time()
            try:
                call(arg)
            except Exception as exc:  # a page the stage refuses (or a changed signature)
                errors += 1
                last_error = f"{type(exc).__name__}: {exc}"[:120]
            total += time.process_time() - t0
        best = min(best, total)
        stage.errors = errors
    if pages and stage.errors == len(pages):
        stage.why = f"failed: {last_error}"
        return stage
    stage.ms = best * 1000 / len(pages) if pages else None
    if stage.ms is None:
        stage.why = "no pages"
    return stage


def _same(page: Page) -> Page:
    return page


def _in_process(pages: list[Page], passes: int) -> list[Stage]:
    """Every in-process stage's row, in the table's order."""

    def floor() -> Built:
        to_markdown = _resolve(f"{_EXTRACT}.htmlclean.to_markdown")
        return _same, lambda p: to_markdown(p.text, p.url)

    def shape() -> Built:
        check_shape = _resolve(f"{_EXTRACT}.htmlshape.check_shape")
        return _same, lambda p: check_shape(p.text)

    def parse() -> Built:
        parser = _resolve("selectolax.lexbor.LexborHTMLParser")
        return _same, lambda p: parser(p.text)

    def parsed(use: Callable[[Any, Page], object]) -> Callable[[], Built]:
        """A stage that reads a fresh tree of the page (parsed untimed)."""

        def build() -> Built:
            parser = _resolve("selectolax.lexbor.LexborHTMLParser")
            return (lambda p: (parser(p.text), p)), (lambda tp: use(tp[0], tp[1]))

        return build

    def head() -> Built:
        read_head = _resolve(f"{_EXTRACT}.htmlhead.read_head")
        return parsed(lambda tree, _p: read_head(tree))()

    def links() -> Built:
        links_of = _resolve(f"{_EXTRACT}.htmllinks.links")
        return parsed(lambda tree, p: links_of(tree, p.url))()

    def cleaner() -> Callable[[Any], str]:
        content_root = _resolve(f"{_EXTRACT}.htmlclean.content_root")
        clean = _resolve(f"{_EXTRACT}.htmlclean.clean")

        def run(tree: Any) -> str:
            root = content_root(tree, False)
            return str(clean(root, False)) if root is not None else ""

        return run

    def cleaning() -> Built:
        run = cleaner()
        return parsed(lambda tree, _p: run(tree))()

    def markdown() -> Built:
        to_markdown = _resolve(f"{_EXTRACT}.htmlclean.to_markdown")
        parser = _resolve("selectolax.lexbor.LexborHTMLParser")
        run = cleaner()
        cleaned = {p.url: run(parser(p.text)) for p in pages}  # once, untimed
        return (lambda p: (cleaned[p.url], p.url)), (lambda cu: to_markdown(cu[0], cu[1]))

    def extract() -> Built:
        extract_fn = _resolve(f"{_EXTRACT}.html.extract")
        return _same, lambda p: extract_fn(p.text, p.url)

    def auto() -> Built:
        needs_render = _resolve(f"{_ENGINE}.autorender.needs_render")
        return _same, lambda p: needs_render(p.body, "text/html")

    def decoding() -> Built:
        decode = _resolve(f"{_ENGINE}.content.decode")
        meta_refresh = _resolve(f"{_ENGINE}.content.meta_refresh")
        return _same, lambda p: meta_refresh(decode(p.body, None, html=True))

    table: list[tuple[str, str, Callable[[], Built]]] = [
        ("floor", "extraction floor: `htmlclean.to_markdown` of the raw page", floor),
        ("shape", "shape check `htmlshape.check_shape`", shape),
        ("parse", "lexbor parse `LexborHTMLParser`", parse),
        ("head", "head `htmlhead.read_head`", head),
        ("links", "links `htmllinks.links`", links),
        ("clean", "cleaning `htmlclean.content_root` + `clean`", cleaning),
        ("markdown", "markdown of the cleaned html `htmlclean.to_markdown`", markdown),
        ("extract", "whole `html.extract` (default `Wanted()`)", extract),
        ("auto", 'AUTO `autorender.needs_render(body, "text/html")`', auto),
        ("decode", "`content.decode` + `content.meta_refresh`", decoding),
    ]
    out = []
    for key, label, build in table:
        say(f"crawlstages: {key} ({passes} passes over {len(pages)} pages)")
        out.append(_timed(key, label, pages, passes, build))
    auto_row = next(s for s in out if s.key == "auto")
    if auto_row.ms is not None:
        auto_row.note = _render_note(pages)
    return out


def _render_note(pages: list[Page]) -> str:
    """Which pages AUTO sends to a browser (once more, untimed), and why."""
    needs_render = _resolve(f"{_ENGINE}.autorender.needs_render")
    chosen = []
    for page in pages:
        try:
            why = needs_render(page.body, "text/html")
        except Exception:  # counted by the timed pass already
            continue
        if why:
            chosen.append(f"{page.url.removeprefix(BASE)} ({why})")
    shown = "; ".join(chosen[:5]) + ("; ..." if len(chosen) > 5 else "")
    return f"AUTO sends {len(chosen)} of {len(pages)} pages to a browser" + (
        f": {shown}" if chosen else ""
    )


# ---------------------------------------------------------------------------- hand-off


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from ``/proc/<pid>/stat`` (0 once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    rest = raw[raw.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / _CLK_TCK


def _cycle(pages: list[Page], calls: int) -> Iterator[str]:
    for i in range(calls):
        yield pages[i % len(pages)].text


async def _handoff_pass(pool: Any, pages: list[Page], calls: int) -> tuple[float, float]:
    """One pass: ``calls`` calls, two in flight; (caller CPU s, workers CPU s)."""
    todo = _cycle(pages, calls)

    async def lane() -> None:
        for text in todo:
            await pool.run(handoff_echo, text)

    pids = pool.pids()
    w0 = sum(proc_cpu_seconds(p) for p in pids)
    c0 = time.process_time()
    async with asyncio.timeout(HANDOFF_TIMEOUT):
        await asyncio.gather(lane(), lane())
    caller = time.process_time() - c0
    if pool.pids() != pids:
        raise RuntimeError(f"the workers changed during the pass ({pids} -> {pool.pids()})")
    return caller, sum(proc_cpu_seconds(p) for p in pids) - w0


def _handoff(pages: list[Page], passes: int) -> list[Stage]:
    caller = Stage("handoff_caller", "worker hand-off `WorkerPool(2)`: calling process")
    workers = Stage("handoff_workers", "worker hand-off `WorkerPool(2)`: workers")
    try:
        pool_class = _resolve(f"{_ENGINE}.workers.WorkerPool")
    except Missing as exc:
        caller.why = workers.why = f"missing: {exc}"
        return [caller, workers]
    # by its module path, also when this file runs as __main__ (the forkserver imports it)
    echo = importlib.import_module("bench.crawlstages").handoff_echo
    calls = max(HANDOFF_CALLS, len(pages))
    say(f"crawlstages: worker hand-off ({passes} passes of {calls} calls)")

    async def run() -> tuple[float, float]:
        pool = pool_class(2)
        try:
            # both workers started and warm before the timed passes: bursts of calls (the
            # lazy pool starts its second worker while calls wait) and time for that start
            # to finish, bounded in count and time
            deadline = time.monotonic() + WARM_TIMEOUT
            for _ in range(WARM_BURSTS):
                await asyncio.gather(*(pool.run(echo, "warm") for _ in range(8)))
                if len(pool.pids()) == 2 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            if len(pool.pids()) != 2:
                raise RuntimeError(f"expected 2 workers, have {pool.pids()}")
            best_caller = best_workers = math.inf
            for _ in range(passes):
                c, w = await _handoff_pass(pool, pages, calls)
                best_caller, best_workers = min(best_caller, c), min(best_workers, w)
            return best_caller, best_workers
        finally:
            pool.close()

    try:
        c, w = asyncio.run(run())
    except Exception as exc:
        caller.why = workers.why = f"failed: {type(exc).__name__}: {exc}"[:160]
        return [caller, workers]
    caller.ms, workers.ms = c * 1000 / calls, w * 1000 / calls
    caller.pages = workers.pages = calls
    return [caller, workers]


# ---------------------------------------------------------------------------- report


def _crawl_rows(crawl: dict[str, Any] | None) -> tuple[list[Stage], float | None]:
    """The rows a crawl measured, and its CPU ms per page (None without a crawl). The
    "other descendants" row (e.g. a browser AUTO started) only when there were some."""
    main = Stage("crawl_main", "crawl: node main process (fetch, AUTO, record, store)")
    workers = Stage("crawl_workers", "crawl: extraction workers")
    total = Stage("crawl_total", "crawl: total (all of the node's processes)")
    pages = int(crawl.get("pages", 0)) if crawl else 0
    if crawl is None or not pages or "main_cpu_s" not in crawl:
        for row in (main, workers, total):
            row.why = "no pagesift crawl measured"
        return [main, workers, total], None
    cpu = {
        "main": float(crawl["main_cpu_s"]),
        "workers": float(crawl["workers_cpu_s"]),
        "other": float(crawl.get("other_cpu_s", 0.0)),
    }
    rows = [main, workers]
    if cpu["other"] > 0:
        programs = ", ".join(sorted(crawl.get("other_cpu_s_by_program") or {})) or "exited"
        rows.append(Stage("crawl_other", f"crawl: other descendants ({programs})"))
    rows.append(total)
    for row in rows:
        key = row.key.removeprefix("crawl_")
        row.ms = (sum(cpu.values()) if key == "total" else cpu[key]) * 1000 / pages
        row.pages = pages
    return rows, total.ms


def measure(
    site: str, root: Path, passes: int = 3, crawl: dict[str, Any] | None = None, max_files: int = 0
) -> dict[str, Any]:
    """The stage table of ``site`` (files under ``root``): ``{"json": ..., "markdown": ...}``.
    ``crawl``: the pagesift run whose main/worker CPU split goes beside the stages."""
    if passes < 1:
        raise ValueError("need at least one pass")
    pages = load_pages(root, max_files)
    if not pages:
        raise RuntimeError(f"no .html files under {root}")
    mb = sum(len(p.body) for p in pages) / MB
    say(f"crawlstages: {site}: {len(pages)} pages, {mb:.1f} MB of HTML, {passes} passes")
    stages = _in_process(pages, passes) + _handoff(pages, passes)
    crawl_rows, crawl_ms = _crawl_rows(crawl)
    by_key = {s.key: s for s in stages}
    floor = by_key["floor"].ms
    parts = [by_key[k].ms for k in ("shape", "parse", "head", "links", "clean", "markdown")]
    parts_sum = (
        sum(p for p in parts if p is not None) if all(p is not None for p in parts) else None
    )
    ratio = crawl_ms / floor if crawl_ms is not None and floor else None

    rows: list[list[object]] = []
    for s in [*stages, *crawl_rows]:
        share = f"{s.ms / floor:.2f}" if s.ms is not None and floor else ""
        rows.append([s.label, s.cell(), share, s.errors or ""])
    if parts_sum is not None:
        share = f"{parts_sum / floor:.2f}" if floor else ""
        rows.insert(
            7, ["sum of shape ... markdown (extract's parts)", f"{parts_sum:.3f}", share, ""]
        )
    md = [
        f"### CPU per stage: {DOC_SITES[site][0] if site in DOC_SITES else site}",
        "",
        f"In-process over the site's {len(pages)} .html files ({mb:.1f} MB), "
        f"`time.process_time` around each stage's call alone, best of {passes} passes; "
        f"the worker hand-off: {by_key['handoff_caller'].pages or HANDOFF_CALLS} calls a pass, "
        "two in flight, workers' CPU from /proc/<pid>/stat. The crawl rows: the reported "
        "pagesift run's CPU split by process (main pid vs its descendants).",
        "",
        markdown_table(["stage", "CPU ms/page", "x floor", "pages failed"], rows),
        "",
    ]
    for s in stages:
        if s.note:
            md += [s.note + ".", ""]
    if ratio is not None:
        verdict = "meets" if ratio <= FLOOR_GOAL else "misses"
        md.append(
            f"Crawl CPU/page over the extraction floor: **{ratio:.2f}x** "
            f"({crawl_ms:.2f} / {floor:.3f} ms; goal <= {FLOOR_GOAL}x: {verdict} it)."
        )
    else:
        md.append("Crawl CPU/page over the extraction floor: n/a (no crawl or no floor).")
    md.append("")
    data = {
        "site": site,
        "root": str(root),
        "pages": len(pages),
        "html_mb": mb,
        "passes": passes,
        "stages": {
            s.key: {
                "label": s.label,
                "cpu_ms_per_page": s.ms,
                "pages": s.pages,
                "errors": s.errors,
                "why": s.why,
                "note": s.note,
            }
            for s in [*stages, *crawl_rows]
        },
        "parts_sum_ms": parts_sum,
        "crawl_over_floor": ratio,
        "floor_goal": FLOOR_GOAL,
    }
    return {"json": data, "markdown": "\n".join(md)}


def last_crawl(site: str) -> dict[str, Any] | None:
    """The pagesift run of the last ``crawl-<site>.json``, if there is one."""
    path = OUT_DIR / f"crawl-{site}.json"
    try:
        result = json.loads(path.read_text())["results"]["pagesift"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result if isinstance(result, dict) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.crawlstages", description=__doc__)
    ap.add_argument("--site", default="django", help=f"one of {', '.join(DOC_SITES)}")
    ap.add_argument("--passes", type=int, default=3, help="passes per stage; best reported")
    ap.add_argument("--files", type=int, default=0, help="most .html files; 0 = all")
    args = ap.parse_args(argv)
    if args.site not in DOC_SITES:
        ap.error(f"--site must be one of {', '.join(DOC_SITES)}")
    if not 1 <= args.passes <= 20 or args.files < 0:
        ap.error("need 1 <= --passes <= 20 and --files >= 0")
    crawl = last_crawl(args.site)
    report = measure(args.site, doc_root(DOC_SITES[args.site][1]), args.passes, crawl, args.files)
    command = shlex.join([".venv/bin/python", "-m", "bench.crawlstages", *sys.argv[1:]])
    facts = machine_facts()
    source = f"crawl rows from {OUT_DIR / f'crawl-{args.site}.json'}" if crawl else "no crawl rows"
    md = (
        report["markdown"]
        + f"\nMachine: {facts['nproc']} CPUs, Python {facts['python']}; {facts['date']}; "
        + f"{source}.\n\nCommand: `{command}`\n"
    )
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"crawlstages-{args.site}"
    write_json(out.with_suffix(".json"), {**report["json"], "command": command, "machine": facts})
    out.with_suffix(".md").write_text(md)
    print(md, flush=True)
    say(f"crawlstages: wrote {out}.md and {out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
