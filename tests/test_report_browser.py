"""The smoke run's report.html in headless Chromium: every figure renders, no console
error, no network request, a non-blank screenshot (kept as an artifact).

Needs Debian's chromium (/usr/bin/chromium) and the playwright package; never
`playwright install`. Without them the test skips locally and fails in CI (CI=true).
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


def test_smoke_report_in_chromium(smoke_report: Path, request: pytest.FixtureRequest) -> None:
    from playwright.sync_api import sync_playwright

    artifacts = Path(os.environ.get("FA_BENCH_ARTIFACTS") or smoke_report.parent)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report-smoke.png"
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(smoke_report.as_uri(), wait_until="load")
            figs = page.evaluate(
                "Array.from(document.querySelectorAll('.plotly-figure')).map(d => "
                "[d.id, (d.data || []).length, d.querySelectorAll('.main-svg').length])"
            )
            dark_font = _dark_font_colour(browser, smoke_report)
            png = page.screenshot(path=str(shot), full_page=True)
            colours = page.evaluate(_COLOURS_JS, "data:image/png;base64," + _b64(png))
        finally:
            browser.close()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nreport screenshot (CI artifact): {shot}")
    request.node.user_properties.append(("screenshot", str(shot)))

    ids = [f[0] for f in figs]
    assert {"fig-tflops", "fig-speedup", "fig-roofline"} <= set(ids), ids
    assert all(n_traces > 0 and svgs > 0 for _, n_traces, svgs in figs), figs
    assert errors == []
    assert requests == [smoke_report.as_uri()]  # the page itself, nothing from the network
    assert colours > 20, f"screenshot looks blank ({colours} colours): {shot}"
    assert dark_font == "#e6edf3"  # figures follow the dark colour scheme


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _dark_font_colour(browser: object, report: Path) -> str:
    page = browser.new_page(color_scheme="dark")
    page.goto(report.as_uri(), wait_until="load")
    colour = page.evaluate("document.getElementById('fig-tflops').layout.font.color")
    page.close()
    return colour
