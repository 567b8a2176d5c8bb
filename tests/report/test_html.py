"""report.html (one per audit) and sweep.html (dpaudit-aggregate --html): self-contained pages
whose numbers are results.json's, checked as text here and in a real headless Chromium (Debian's
chromium + chromedriver through selenium; skipped with the reason where none is installed)."""

import base64
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpaudit.experiment import run_audit
from dpaudit.experiment.judging.outputs import STATUS_WORDS, report_blocks
from dpaudit.report.files import cell_text
from dpaudit.report.numbers import lower, point, upper

# the default audit, small (its canaries inserted like an example too, a few hundred)
TINY = {"dp": {"steps": 20}, "canary": {"count": 200, "lower_side": 300}, "progress": False}
BUG = {"dp": {"steps": 20, "noise_multiplier": 10.0, "bug": "halved_noise"},
       "canary": {"count": 200, "lower_side": 300}, "progress": False, "fail_on_bug": False}


def _bound_cells(result: dict) -> list[list[str]]:
    """The bounds table's rows as the console (and so the page) shows them."""
    (block,) = [b for b in report_blocks(result) if b["id"] == "bounds"]
    return [[cell_text(v) for v in row.values()] for row in block["table"]]


@pytest.fixture(scope="module")
def default_audit(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("default")
    run_audit(output_dir=out, **TINY)
    return out


def test_the_audit_page_is_self_contained_and_holds_results_numbers(default_audit):
    page = (default_audit / "report.html").read_text()
    result = json.loads((default_audit / "results.json").read_text())
    assert page.startswith("<!DOCTYPE html>") and len(page.encode()) < 2_000_000
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # no network
    assert page.count("data:image/png;base64,") == len(result["plots"])
    v = result["verdict"]
    assert f"{v['claimed_epsilon']:.3f}" in page and html.escape(v["message"]) in page
    section = page[page.index('<section id="bounds">'):]
    section = section[:section.index("</section>")]
    cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", section)]
    expected = _bound_cells(result)
    assert cells == [c for row in expected for c in row]  # the console's cells, in order
    order = [page.index(f'id="{i}"') for i in ("bracket", "verdict", "message", "premises",
                                               "lower_side", "threat", "claim", "bounds",
                                               "stress_test",
                                               "white_box", "plots", "canaries", "timing",
                                               "provenance")]
    assert order == sorted(order)  # the bracket, then the console's order after the banner
    assert page.count(html.escape(v["message"])) == 1  # the message, once
    # the page opens with the user's epsilon on a line: the claim between the certified
    # lower side (the canaries inserted like an example) and the measured upper side
    td = v["training_data"]
    bracket = page[page.index('<figure id="bracket">'):page.index("</figure>")]
    assert "<svg" in bracket and f"claimed {point(td['epsilon_claimed'])}" in bracket
    assert f"verified &lt;= {upper(td['epsilon_upper'])}" in bracket
    # one formatter: the banner rounds the upper side as the picture does (up)
    banner = page[page.index('id="verdict"'):]
    assert f"verified &lt;= {upper(td['epsilon_upper'])}" in banner[:banner.index("</div>")]
    assert f"certified &gt;= {lower(td['epsilon_lower'])}" in bracket
    assert td["epsilon_lower"] == td["lower"]["epsilon"] and td["lower"]["canaries"] == [300, 300]


def _browser():
    """A headless Chromium driven by selenium, or skip saying what is missing."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("no chromium / chromedriver (Debian: apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,1600"):
        opts.add_argument(arg)
    opts.binary_location = chromium
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def _check_in_browser(browser, page: Path) -> dict:
    """Open ``page`` offline; every image loaded, no console error, prints to PDF."""
    from selenium.webdriver.common.print_page_options import PrintOptions

    browser.get(page.as_uri())
    images = browser.execute_script(
        "return Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)")
    assert images and all(images), page
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    pdf = base64.b64decode(browser.print_page(PrintOptions()))
    assert pdf.startswith(b"%PDF-") and len(pdf) > 10_000
    return {"banner": browser.find_element("id", "verdict").text
            if browser.find_elements("id", "verdict") else None,
            "cells": browser.execute_script(
                "const t = document.querySelector('#bounds table');"
                "return t ? Array.from(t.tBodies[0].rows).map(r => Array.from(r.cells)"
                ".map(c => c.textContent)) : null")}


@pytest.mark.slow
def test_pages_in_a_real_browser(tmp_path, default_audit):
    """The default audit, a planted bug, an own-loop report and a 6-job sweep: each page
    opens without network, shows its verdict, holds results.json's numbers, loads every
    image, logs no console error and prints to PDF."""
    browser = _browser()
    try:
        bug = tmp_path / "bug"
        run_audit(output_dir=bug, **{k: v for k, v in BUG.items() if k != "fail_on_bug"})
        sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
        from own_loop_models import own_loop_audit

        own = tmp_path / "own"
        own_loop_audit("linear", output_dir=str(own), quiet=True)
        for out, status in ((default_audit, "consistent"), (bug, "privacy_bug"),
                            (own, None)):
            result = json.loads((out / "results.json").read_text())
            seen = _check_in_browser(browser, out / "report.html")
            # the banner leads with the user's claim's status (issue 64), then their epsilon
            v = result["verdict"]
            assert seen["banner"].startswith(STATUS_WORDS[v["status"]]), seen["banner"]
            assert f"your epsilon {point(v['training_data']['epsilon_claimed'])} (PRV" in \
                seen["banner"]
            assert status is None or result["verdict"]["status"] == status
            assert seen["cells"] == _bound_cells(result)
        sweep = tmp_path / "sweep"
        cmd = [sys.executable, "-m", "dpaudit", "-m", f"hydra.sweep.dir={sweep}", "dp.steps=20",
               "canary.count=200", "canary.lower_side=300", "progress=false",
               "dp.noise_multiplier=1,2,3,4,6,8"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        subprocess.run([sys.executable, "-m", "dpaudit.tasks.aggregate", "--html", str(sweep)],
                       check=True, capture_output=True, timeout=300)
        summary = json.loads((sweep / "sweep_summary.json").read_text())
        _check_in_browser(browser, sweep / "sweep.html")
        rows = browser.execute_script(
            "return Array.from(document.querySelector('#jobs table').tBodies[0].rows)"
            ".map(r => [r.cells[0].textContent, r.cells[0].querySelector('a').href,"
            " r.cells[3].textContent])")
        assert [r[0] for r in rows] == [j["job"] for j in summary["jobs"]] == list("012345")
        assert [r[2] for r in rows] == [cell_text(j["eps_certified"]) for j in summary["jobs"]]
        for job, href, _ in rows:  # each links to its job's own page, which opens
            assert href.endswith(f"/{job}/report.html")
            _check_in_browser(browser, sweep / job / "report.html")
    finally:
        browser.quit()


def test_the_page_keeps_the_cells_the_console_cuts(default_audit, capsys):
    from dpaudit.experiment.judging.outputs import console_table

    page = html.unescape((default_audit / "report.html").read_text())
    result = json.loads((default_audit / "results.json").read_text())
    long = [b["assumption"] for b in result["bounds"] if len(b.get("assumption") or "") > 48]
    checked = ["; ".join(c["checked"]) for c in result["white_box"]["checks"].values()
               if len("; ".join(c["checked"])) > 60]
    assert long and checked
    for text in long + checked:
        assert text in page  # the whole row, as in results.json
    table = console_table(result)
    assert all(text not in table for text in long + checked)  # the console cuts them
    assert f"{long[0][:45]}..." in table


def test_a_p_value_that_underflows_is_never_printed_as_zero():
    from dpaudit.experiment.judging.outputs import white_box_blocks
    from dpaudit.report.files import p_cell, p_text

    assert p_text(0.0) == "p < 1e-300" and p_cell(0.0) == "< 1e-300"
    assert p_text(3.2e-8) == "p = 3.2e-08" and p_cell(0.5) == "0.5"
    check = {"name": "noise_scale", "kind": "certified (statistical)", "rejected": True,
             "p_value": 0.0, "checked": ["a"]}
    (block,) = white_box_blocks({"checks": {"noise_scale": check}})
    assert block["table"][0]["p"] == "< 1e-300"
