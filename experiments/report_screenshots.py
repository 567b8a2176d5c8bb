"""Screenshots of report.html for the docs (docs/img/report_default.png and
docs/img/report_halved_noise.png): the default audit and the README's planted bug
(`dp.bug=halved_noise dp.noise_multiplier=10`), rendered by headless Chromium (Debian's chromium
and chromium-driver, through selenium: pip install -c requirements/dev.txt -e ".[dev]").

    python experiments/report_screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from dpaudit.experiment import run_audit

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 1900) -> None:
    """The top ``height`` pixels of ``page`` at ``width``, as a PNG."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.binary_location = "/usr/bin/chromium"
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        browser.get(page.as_uri())
        browser.save_screenshot(str(png))
    finally:
        browser.quit()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        default, bug = Path(tmp, "default"), Path(tmp, "bug")
        run_audit(output_dir=default, progress=False)
        run_audit(output_dir=bug, dp={"bug": "halved_noise", "noise_multiplier": 10.0},
                  progress=False)
        for out, name in ((default, "report_default.png"), (bug, "report_halved_noise.png")):
            screenshot(out / "report.html", IMG / name)
            print(f"{IMG / name}: {(out / 'report.html').stat().st_size / 1e6:.2f} MB page",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
