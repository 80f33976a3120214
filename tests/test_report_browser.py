"""The smoke run's report.html in headless Chromium: every figure renders, no console
error, no network request, a non-blank screenshot (kept as an artifact).

Needs Debian's chromium (/usr/bin/chromium) and the playwright package; never
`playwright install`. Without them the test skips locally and fails in CI (CI=true).

Any other page gets the same checks, plus every section a run's page must have, with
`FA_BENCH_REPORT_PAGES` (paths joined by the OS path separator), e.g. the pages
copied back from the H200:

    FA_BENCH_REPORT_PAGES=std/report.html:tel/report.html pytest tests/test_report_browser.py
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest
from conftest import FAST
from typer.testing import CliRunner

from fa_bench.cli import app

CHROMIUM = os.environ.get("FA_BENCH_CHROMIUM", "/usr/bin/chromium")
# No background traffic: this machine's network is closed, and the test counts requests.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _need_browser() -> None:
    missing = []
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        missing.append(f"chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[test]')")
    if missing:
        why = "browser test needs " + " and ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why + "; CI must run it")
        pytest.skip(why)


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_browser()
    out = tmp_path_factory.mktemp("smoke") / "run"
    result = CliRunner().invoke(app, ["run", "-s", "smoke", "--out", str(out), *FAST])
    assert result.exit_code == 0, result.output
    assert (out / "report.html").is_file(), result.output
    return out / "report.html"


# Counts the distinct colours of a PNG drawn on a canvas: a blank page has one.
_COLOURS_JS = """async (src) => {
  const img = new Image(); img.src = src; await img.decode();
  const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
  const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data; const seen = new Set();
  for (let i = 0; i < d.length; i += 4 * 97) seen.add(d[i] << 16 | d[i + 1] << 8 | d[i + 2]);
  return seen.size;
}"""


@pytest.mark.slow
def test_smoke_report_in_chromium(smoke_report: Path, request: pytest.FixtureRequest) -> None:
    figs, _ = _check_page(smoke_report, "report-smoke.png", request)
    assert {"fig-tflops", "fig-speedup", "fig-roofline"} <= {f[0] for f in figs}


# What every run's page shows; telemetry, bandwidth, throttling and per-GPU sections come
# only with their data.
SECTIONS = {
    "header",
    "section-tflops",
    "section-memory",
    "section-speedup",
    "section-roofline",
    "section-failures",
    "section-cases",
    "section-environment",
}
PAGES = [p for p in os.environ.get("FA_BENCH_REPORT_PAGES", "").split(os.pathsep) if p]


@pytest.mark.skipif(not PAGES, reason="no FA_BENCH_REPORT_PAGES given")
@pytest.mark.parametrize("page_path", PAGES)
def test_given_report_in_chromium(page_path: str, request: pytest.FixtureRequest) -> None:
    _need_browser()
    page = Path(page_path).resolve()
    figs, sections = _check_page(page, f"report-{page.parent.name}-{page.stem}.png", request)
    assert SECTIONS <= set(sections), sorted(sections)
    empty = [name for name, chars in sections.items() if chars == 0]
    assert not empty, empty
    if "section-telemetry" in sections:
        assert {"fig-bandwidth", "fig-telemetry"} <= {f[0] for f in figs}


_SECTIONS_JS = (
    "Object.fromEntries(Array.from(document.querySelectorAll('header, section'))"
    ".map(s => [s.id || s.tagName.toLowerCase(), s.innerText.trim().length]))"
)


def _check_page(
    report: Path, shot_name: str, request: pytest.FixtureRequest
) -> tuple[list, dict[str, int]]:
    """Open `report` offline; assert figures drawn, no errors, no network, a non-blank
    screenshot; return the figures [id, traces, svgs] and the sections {id: text chars}."""
    from playwright.sync_api import sync_playwright

    artifacts = Path(os.environ.get("FA_BENCH_ARTIFACTS") or report.parent)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / shot_name
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(report.as_uri(), wait_until="load")
            figs = page.evaluate(
                "Array.from(document.querySelectorAll('.plotly-figure')).map(d => "
                "[d.id, (d.data || []).length, d.querySelectorAll('.main-svg').length])"
            )
            sections = page.evaluate(_SECTIONS_JS)
            dark_font = _dark_font_colour(browser, report)
            png = page.screenshot(path=str(shot), full_page=True)
            colours = page.evaluate(_COLOURS_JS, "data:image/png;base64," + _b64(png))
        finally:
            browser.close()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nreport screenshot (CI artifact): {shot}")
    request.node.user_properties.append(("screenshot", str(shot)))

    assert figs and all(n_traces > 0 and svgs > 0 for _, n_traces, svgs in figs), figs
    assert errors == []
    assert requests == [report.as_uri()]  # the page itself, nothing from the network
    assert colours > 20, f"screenshot looks blank ({colours} colours): {shot}"
    assert dark_font == "#e6edf3"  # figures follow the dark colour scheme
    return figs, sections


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _dark_font_colour(browser: object, report: Path) -> str:
    page = browser.new_page(color_scheme="dark")
    page.goto(report.as_uri(), wait_until="load")
    colour = page.evaluate("document.getElementById('fig-tflops').layout.font.color")
    page.close()
    return colour
