"""The crawl bench's per-site parts: the CPU split of the server by process
(``bench.crawl.cpu_split``), ``--site`` parsing, and the CPU-per-stage table
(``bench.crawlstages.measure``) on a small site of real HTML files.

The split runs on a real process tree: a root (the "node main process") burns CPU and
starts a fake forkserver (a Python process whose ``argv[0]`` names the forkserver) that
runs short-lived "workers" one after another, each burning a known amount and reaped by
it, so their CPU is only in its reaped counters, and an "other" child (no forkserver in
its command line). The stage table runs every stage for real (a real ``WorkerPool(2)``
for the hand-off) and, with one function taken away, reports that row as missing while
the others are measured.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import crawlstages
from bench.crawl import cpu_split, parse_sites

BURN = textwrap.dedent(
    """
    import time
    def burn(s):
        t = time.process_time() + s
        while time.process_time() < t:
            pass
    """
)
WORKERS = 4
WORKER_CPU = 0.15

FORKSERVER = BURN + textwrap.dedent(
    f"""
    import subprocess, sys
    child = {BURN!r} + "burn({WORKER_CPU})"
    for _ in range({WORKERS}):
        subprocess.run(["fake-forkserver-worker", "-c", child],
                       executable={sys.executable!r}, check=True, timeout=60)
    print("workers done", flush=True)
    sys.stdin.readline()
    """
)

OTHER = BURN + "import sys\nburn(0.2)\nprint('other done', flush=True)\nsys.stdin.readline()\n"

ROOT = BURN + textwrap.dedent(
    f"""
    import subprocess, sys
    sys.stdin.readline()  # the window is open
    burn(0.3)
    kids = [
        subprocess.Popen([name, "-c", code], executable={sys.executable!r},
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for name, code in (("python-forkserver", {FORKSERVER!r}), ("helper", {OTHER!r}))
    ]
    for kid in kids:
        assert kid.stdout.readline().strip().endswith("done")
    print("done", flush=True)
    sys.stdin.readline()  # the window is closed
    for kid in kids:
        kid.stdin.write("bye\\n"); kid.stdin.flush(); kid.wait(timeout=60)
    """
)


def test_cpu_split_puts_reaped_workers_under_workers() -> None:
    root = subprocess.Popen(
        [sys.executable, "-c", ROOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert root.stdin is not None and root.stdout is not None
    others0: dict[str, float] = {}
    others1: dict[str, float] = {}
    try:
        before = cpu_split(root.pid, others0)
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline().strip() == "done"
        after = cpu_split(root.pid, others1)
        root.stdin.write("bye\n")
        root.stdin.flush()
        root.wait(timeout=60)
    finally:
        if root.poll() is None:
            root.kill()
            root.wait(timeout=10)
    split = {k: after[k] - before[k] for k in after}
    tick = 0.02  # /proc/<pid>/stat counts 10 ms ticks: a tick either side
    assert split["main"] >= 0.3 - tick
    # every worker was reaped before the second reading: only the forkserver's cutime has them
    assert split["workers"] >= WORKERS * WORKER_CPU - WORKERS * tick
    assert split["other"] >= 0.2 - tick
    assert split["main"] < split["workers"]  # the workers' CPU is not the main process's
    assert set(others1) == {"helper"}  # the other child, by its argv[0]
    assert others1["helper"] - others0.get("helper", 0.0) == pytest.approx(split["other"])


def test_parse_sites_keeps_order_and_refuses_unknown_names() -> None:
    assert parse_sites("python, django,python") == ["python", "django"]
    assert parse_sites("postgres") == ["postgres"]
    with pytest.raises(SystemExit):
        parse_sites("django,nosuchsite")


PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Page {i}</title><meta name="description" content="about {i}"></head>
<body><nav><a href="/">home</a></nav><main><h1>Heading {i}</h1>
<p>Some <b>text</b> with a <a href="other-{i}.html">link</a>.</p>
<ul><li>one</li><li>two</li></ul><style>p {{ color: red }}</style></main></body></html>
"""


APP = """<!doctype html><html><head><title>App</title></head><body>
<noscript>Please enable JavaScript to use this app.</noscript><div id="root"></div>
<script src="app.js"></script></body></html>
"""


def _site(tmp_path: Path, pages: int = 5) -> Path:
    for i in range(pages):
        sub = tmp_path / f"d{i % 2}"
        sub.mkdir(exist_ok=True)
        (sub / f"p{i}.html").write_text(PAGE.format(i=i))
    (tmp_path / "index.html").write_text(PAGE.format(i="index"))
    (tmp_path / "app.html").write_text(APP)
    (tmp_path / "notes.txt").write_text("not html")
    return tmp_path


def test_measure_times_every_stage_and_the_floor_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(crawlstages, "HANDOFF_CALLS", 40)
    crawl = {
        "pages": 10,
        "main_cpu_s": 0.05,
        "workers_cpu_s": 0.03,
        "other_cpu_s": 0.01,
        "other_cpu_s_by_program": {"chromium": 0.01},
    }
    report = crawlstages.measure("tiny", _site(tmp_path), passes=1, crawl=crawl)
    data = report["json"]
    assert data["pages"] == 7  # the .html files only
    stages = data["stages"]
    for key in ("floor", "shape", "parse", "head", "links", "clean", "markdown", "extract"):
        assert stages[key]["cpu_ms_per_page"] is not None, stages[key]
        assert stages[key]["cpu_ms_per_page"] > 0, key
        assert stages[key]["errors"] == 0
    for key in ("auto", "decode", "handoff_caller", "handoff_workers"):
        assert stages[key]["cpu_ms_per_page"] is not None, stages[key]
    assert stages["handoff_caller"]["pages"] == 40  # calls a pass
    assert stages["auto"]["note"].startswith("AUTO sends 1 of 7 pages to a browser: app.html (")
    assert stages["crawl_main"]["cpu_ms_per_page"] == pytest.approx(5.0)
    assert stages["crawl_workers"]["cpu_ms_per_page"] == pytest.approx(3.0)
    assert stages["crawl_other"]["cpu_ms_per_page"] == pytest.approx(1.0)
    assert "(chromium)" in stages["crawl_other"]["label"]
    assert stages["crawl_total"]["cpu_ms_per_page"] == pytest.approx(9.0)
    floor = stages["floor"]["cpu_ms_per_page"]
    assert data["crawl_over_floor"] == pytest.approx(9.0 / floor)
    assert "Crawl CPU/page over the extraction floor" in report["markdown"]


def test_a_missing_function_is_one_na_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pagesift.primary.extract import htmlhead

    monkeypatch.setattr(crawlstages, "HANDOFF_CALLS", 10)
    monkeypatch.delattr(htmlhead, "read_head")
    report = crawlstages.measure("tiny", _site(tmp_path, 2), passes=1)
    stages = report["json"]["stages"]
    assert stages["head"]["cpu_ms_per_page"] is None
    assert stages["head"]["why"] == "missing: pagesift.primary.extract.htmlhead.read_head"
    assert "n/a (missing: pagesift.primary.extract.htmlhead.read_head)" in report["markdown"]
    assert stages["links"]["cpu_ms_per_page"] is not None  # the others still measured
    assert report["json"]["parts_sum_ms"] is None  # a part is missing: no sum
    assert stages["crawl_total"]["why"] == "no pagesift crawl measured"
    assert "crawl_other" not in stages
    assert report["json"]["crawl_over_floor"] is None
