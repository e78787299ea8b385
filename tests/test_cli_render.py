"""The CLI's rendering flags (``pagesift.cli.render``): the ``--action`` syntax as a
table, the flags as ScrapeOptions, a bad spec a usage error naming it; ``scrape
--engine http --json`` against an in-process node (no browser needed) shows the engine;
``export --dir --format screenshot`` writes the images; and ``scrape --engine browser
--format screenshot --out FILE`` writes a real PNG from a node with the default browser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from aiohttp import web
from google.protobuf import duration_pb2

from pagesift.cli import amain, build_parser, main
from pagesift.cli.common import describe
from pagesift.cli.export import DirSink
from pagesift.cli.jobs import batch_request, crawl_request, scrape_options
from pagesift.cli.render import (
    parse_action,
    parse_viewport,
    parse_wait_for,
    save_screenshot,
    screenshot_line,
)
from pagesift.v1 import jobs_pb2
from tests.helpers import in_process_node, serve_handler

A = jobs_pb2.Action
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ms(n: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(n)
    return d


ACTIONS: list[tuple[str, jobs_pb2.Action]] = [
    ("wait:500", A(wait=jobs_pb2.WaitAction(duration=ms(500)))),
    ("wait:#list li", A(wait=jobs_pb2.WaitAction(selector="#list li"))),
    ("wait:a:hover", A(wait=jobs_pb2.WaitAction(selector="a:hover"))),
    ("click:button.more", A(click=jobs_pb2.ClickAction(selector="button.more"))),
    ("write:a: b c", A(write=jobs_pb2.WriteAction(text="a: b c"))),
    ("press:Enter", A(press=jobs_pb2.PressAction(key="Enter"))),
    ("press:Control+A", A(press=jobs_pb2.PressAction(key="Control+A"))),
    ("scroll", A(scroll=jobs_pb2.ScrollAction(direction=jobs_pb2.SCROLL_DIRECTION_DOWN))),
    ("scroll:down", A(scroll=jobs_pb2.ScrollAction(direction=jobs_pb2.SCROLL_DIRECTION_DOWN))),
    ("scroll:up", A(scroll=jobs_pb2.ScrollAction(direction=jobs_pb2.SCROLL_DIRECTION_UP))),
    ("scroll:end", A(scroll=jobs_pb2.ScrollAction(until_end=True))),
    ("scroll:end:30", A(scroll=jobs_pb2.ScrollAction(until_end=True, max_steps=30))),
    ("js:return document.title", A(execute_javascript=jobs_pb2.ExecuteJavascriptAction(
        script="return document.title"))),
    ("screenshot", A(screenshot=jobs_pb2.ScreenshotOptions())),
    ("screenshot:full", A(screenshot=jobs_pb2.ScreenshotOptions(full_page=True))),
]  # fmt: skip

BAD_ACTIONS = [
    "",
    "wait",
    "wait:",
    "click",
    "click:",
    "write:",
    "press:",
    "js:",
    "hover:#a",
    "scroll:left",
    "scroll:down:3",
    "scroll:end:many",
    "screenshot:jpeg",
    "WAIT:500",
]


@pytest.mark.parametrize(("spec", "action"), ACTIONS, ids=[s for s, _ in ACTIONS])
def test_each_action_spec_parses_to_its_action(spec: str, action: jobs_pb2.Action) -> None:
    assert parse_action(spec) == action


@pytest.mark.parametrize("spec", BAD_ACTIONS)
def test_a_malformed_action_spec_is_refused_naming_it(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_action(spec)
    assert f"bad --action {spec!r}" in str(info.value)


def test_wait_for_is_milliseconds_or_a_selector_and_viewport_is_w_by_h() -> None:
    assert parse_wait_for("1500") == jobs_pb2.WaitFor(duration=ms(1500))
    assert parse_wait_for("#root > *") == jobs_pb2.WaitFor(selector="#root > *")
    assert parse_viewport("1280x800") == jobs_pb2.Viewport(width=1280, height=800)
    assert parse_viewport("390X844") == jobs_pb2.Viewport(width=390, height=844)
    for bad in ("1280", "x800", "1280x", "wide x tall", "-1x5"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_viewport(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_wait_for(" ")


def test_the_rendering_flags_fill_the_options_of_scrape_batch_and_crawl() -> None:
    flags = [
        "--engine", "browser", "--wait-for", "#app li", "--wait-until", "networkidle",
        "--action", "click:#more", "--action", "wait:250", "--action", "screenshot:full",
        "--mobile", "--viewport", "390x844", "--locale", "fr-FR", "--timezone",
        "Europe/Paris", "--format", "markdown,screenshot", "--screenshot-full",
        "--screenshot-jpeg=70",
    ]  # fmt: skip
    options = crawl_request(build_parser().parse_args(["crawl", "http://x/", *flags])).options
    assert options.engine == jobs_pb2.FETCH_ENGINE_BROWSER
    assert options.wait_for == jobs_pb2.WaitFor(selector="#app li")
    assert options.wait_until == jobs_pb2.WAIT_UNTIL_NETWORKIDLE
    assert list(options.actions) == [
        parse_action("click:#more"),
        parse_action("wait:250"),
        parse_action("screenshot:full"),
    ]
    assert options.mobile and (options.locale, options.timezone) == ("fr-FR", "Europe/Paris")
    assert options.viewport == jobs_pb2.Viewport(width=390, height=844)
    assert list(options.formats) == [jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_SCREENSHOT]
    assert options.screenshot == jobs_pb2.ScreenshotOptions(
        full_page=True, format=jobs_pb2.IMAGE_FORMAT_JPEG, quality=70
    )
    batch = batch_request(build_parser().parse_args(["batch", "http://x/", *flags])).options
    assert batch == options
    plain = scrape_options(build_parser().parse_args(["scrape", "http://x/"]))
    assert plain == jobs_pb2.ScrapeOptions()  # nothing set: the server's defaults
    jpeg = scrape_options(build_parser().parse_args(["scrape", "http://x/", "--screenshot-jpeg"]))
    assert (jpeg.screenshot.format, jpeg.screenshot.quality) == (jobs_pb2.IMAGE_FORMAT_JPEG, 0)
    http = scrape_options(build_parser().parse_args(["scrape", "http://x/", "--engine", "http"]))
    assert http.engine == jobs_pb2.FETCH_ENGINE_HTTP


@pytest.mark.parametrize(
    "argv",
    [
        ["scrape", "http://x/", "--action", "hover:#a"],
        ["crawl", "http://x/", "--action", "scroll:sideways"],
        ["batch", "http://x/", "--engine", "chrome"],
        ["scrape", "http://x/", "--viewport", "big"],
        ["scrape", "http://x/", "--wait-until", "idle"],
        ["scrape", "http://x/", "--screenshot-jpeg=101"],
    ],
)
def test_a_bad_rendering_flag_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    if "--action" in argv:
        assert f"bad --action {argv[-1]!r}" in err


def test_out_needs_the_screenshot_format(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["scrape", "http://127.0.0.1:9/", "--out", "x.png", "--connect-timeout", "0"]
    assert main([*argv, "--server", "127.0.0.1:9"]) == 2
    assert "--out FILE (the image) goes with --format screenshot" in capsys.readouterr().err


def test_out_writes_the_image_bytes_and_nothing_without_a_screenshot(tmp_path: Path) -> None:
    shot = jobs_pb2.Screenshot(
        data=PNG_MAGIC + b"x", content_type="image/png", width=1280, height=800
    )
    save_screenshot(jobs_pb2.Document(screenshot=shot), tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes() == PNG_MAGIC + b"x"
    assert screenshot_line(jobs_pb2.Document(screenshot=shot)) == (
        "screenshot: image/png 1280x800, 9 bytes"
    )
    with pytest.raises(OSError) as info:
        save_screenshot(jobs_pb2.Document(), tmp_path / "b.png")
    assert not (tmp_path / "b.png").exists()
    failure = describe(info.value)
    assert failure.exit == 5 and "has no screenshot" in failure.message


def test_export_dir_writes_each_screenshot_as_an_image_file(tmp_path: Path) -> None:
    sink = DirSink(tmp_path / "out", "screenshot", 0)
    png = jobs_pb2.Screenshot(data=PNG_MAGIC + b"png", content_type="image/png")
    jpeg = jobs_pb2.Screenshot(data=b"\xff\xd8\xffjpeg", content_type="image/jpeg")
    sink.write(0, jobs_pb2.Document(url="http://h/a", screenshot=png))
    sink.write(1, jobs_pb2.Document(url="http://h/b", screenshot=jpeg))
    sink.write(2, jobs_pb2.Document(url="http://h/a?x", screenshot=jpeg))
    sink.write(3, jobs_pb2.Document(url="http://h/c"))  # not rendered: an empty file, counted
    sink.close()
    index = [json.loads(line) for line in (tmp_path / "out/index.jsonl").read_text().splitlines()]
    paths = [e["path"] for e in index]
    assert paths == ["h/a.png", "h/b.jpg", "h/a%3Fx.jpg", "h/c.png"]
    assert (tmp_path / "out/h/a.png").read_bytes() == PNG_MAGIC + b"png"
    assert (tmp_path / "out/h/b.jpg").read_bytes() == b"\xff\xd8\xffjpeg"
    assert sink.empty == 1


# ---------------------------------------------------------------- against a node

PAGE = (
    "<html><head><title>Catalogue</title></head><body><h1>Catalogue</h1>"
    "<p>Static text the server sends.</p><div id='late'></div>"
    "<script>document.getElementById('late').textContent = 'Inserted by script';</script>"
    "</body></html>"
)


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def test_scrape_engine_http_prints_the_document_with_the_engine_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serve_handler(_page) as port, in_process_node(tmp_path) as node:
        url = f"http://127.0.0.1:{port}/"
        server = ["--server", node.address]
        assert await amain(["scrape", url, "--engine", "http", "--json", *server]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert "# Catalogue" in doc["markdown"] and "Inserted by script" not in doc["markdown"]
        assert doc["engine"] == "FETCH_ENGINE_HTTP"
        assert doc["screenshot"] is None

        argv = ["scrape", url, "--engine", "http", "--format", "screenshot", *server]
        assert await amain(argv) == 3  # the server refuses it, naming the field
        assert "options.formats[0]: needs a browser engine" in capsys.readouterr().err

        assert await amain(["scrape", url, "--engine", "http", *server]) == 0
        out = capsys.readouterr()
        assert "# Catalogue" in out.out and "[http]" in out.err


@pytest.mark.browser
async def test_scrape_engine_browser_writes_the_screenshot_to_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shot = tmp_path / "shot.png"
    async with serve_handler(_page) as port, in_process_node(tmp_path / "node") as node:
        url = f"http://127.0.0.1:{port}/"
        argv = ["scrape", url, "--engine", "browser", "--format", "markdown,screenshot"]
        argv += ["--out", str(shot), "--json", "--server", node.address]
        assert await amain(argv) == 0, capsys.readouterr()
        doc = json.loads(capsys.readouterr().out)
    assert doc["engine"] == "FETCH_ENGINE_BROWSER"
    assert "Inserted by script" in doc["markdown"]
    assert doc["screenshot"]["content_type"] == "image/png"
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 100
