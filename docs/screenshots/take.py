"""Take the README's screenshots of the web page: `.venv/bin/python docs/screenshots/take.py`.

Starts the embedded service (`conduit serve` on a free loopback port, a temporary CONDUIT_HOME,
whatever model CONDUIT_MODEL names or the builtin default), uploads three generated PDFs in the
page, asks a 3-page question (top k 3) over all of them, opens its details and saves
`answer.png`; then "Compare with full prefill" and saves `compare.png`. Shots are of the whole
page at a laptop width (the window grows to the page's height), header included.

Before the question is asked in the page, the same question is asked once per policy over the
HTTP API, so that the figures shown are those of a warm process (no first-call set-up) with the
pages' KV in the memory tier, as a user sees them from the second question on. Needs Debian's
`chromium` and `chromium-driver` (`make system-deps`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.pdfs import text_pdf  # noqa: E402 - the repository root is on the path only now
from tests.service.conftest import start_server, stop_server  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
QUESTION = "How often must the pressure valve be inspected?"
DOCUMENTS = {
    "safety-manual.pdf": [
        "Safety manual. The pressure valve must be inspected every fourteen days by a "
        "certified technician, and after every pressure alarm.",
        "Valve replacement. A pressure valve that fails its inspection is replaced within "
        "two days; the spare valves are kept in the pump room.",
        "Pressure alarms. After an alarm the line stops until a technician has inspected "
        "the valve and the gauges.",
    ],
    "maintenance-log.pdf": [
        "Maintenance log, March. Pressure valve PV-3 inspected on day 2 and day 16; seals "
        "replaced on day 16.",
        "Maintenance log, April. Pump P-1 overhauled; the pressure valve inspection was moved "
        "to day 3 after the alarm on day 1.",
    ],
    "quarterly-report.pdf": [
        "Quarterly report. Revenue grew in the northern region thanks to new retail stores.",
        "Operations. Unplanned downtime fell by a third after the valve inspection schedule "
        "was tightened.",
        "Outlook. Two new plants open next year in the southern region.",
    ],
}
WAIT_S = 600


def browser(width: int) -> WebDriver:
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        raise SystemExit("needs Debian's chromium and chromium-driver: make system-deps")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},900", "--force-device-scale-factor=1",
                "--disable-features=Translate", "--no-first-run", "--hide-scrollbars"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(str(CHROMEDRIVER)))


def wait(d: WebDriver, what: str, cond, timeout: float = WAIT_S):  # type: ignore[no-untyped-def]
    print(f"  waiting for {what}", flush=True)
    return WebDriverWait(d, timeout, poll_frequency=0.2,
                         ignored_exceptions=[StaleElementReferenceException]
                         ).until(lambda _: cond())


def shot(d: WebDriver, path: Path, width: int) -> None:
    """The whole page: the window grows to the page's height first."""
    height = d.execute_script("return document.documentElement.scrollHeight")
    d.set_window_size(width, min(max(int(height), 600), 4000))
    d.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.3)  # one frame at the new size
    d.save_screenshot(str(path))
    d.set_window_size(width, 900)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def images_loaded(d: WebDriver) -> bool:
    return bool(d.execute_script(
        "const imgs = [...document.querySelectorAll('.cite img')];"
        "return imgs.length > 0 && imgs.every((i) => i.complete && i.naturalWidth > 0)"))


def take(out: Path, width: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="conduit-shots-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        pdfs = []
        for name, pages in DOCUMENTS.items():
            pdfs.append(Path(tmp) / name)
            pdfs[-1].write_bytes(text_pdf(pages))
        url, proc = start_server(home)
        print(f"serving on {url} (log: {home / 'server.log'})")
        d = browser(width)
        try:
            d.get(url + "/")
            wait(d, "the page", lambda: d.find_elements(By.CSS_SELECTOR, "#collection option"))
            d.find_element(By.CSS_SELECTOR, "#new-collection").send_keys("handbooks", Keys.ENTER)
            select = Select(d.find_element(By.CSS_SELECTOR, "#collection"))
            wait(d, "the collection", lambda: select.first_selected_option.text == "handbooks")
            d.find_element(By.CSS_SELECTOR, "#file-input").send_keys(
                "\n".join(str(p) for p in pdfs))
            wait(d, "the documents to be ready", lambda: len(d.find_elements(
                By.CSS_SELECTOR, ".doc .badge.ready, .doc .badge.failed")) == len(pdfs))
            failed = d.find_elements(By.CSS_SELECTOR, ".doc-error")
            if failed:
                raise SystemExit("ingest failed: " + "; ".join(e.text for e in failed))
            wait(d, "the page facts", lambda: all(
                "KV cached" in e.text for e in d.find_elements(By.CSS_SELECTOR, ".doc-meta")))

            collection = select.first_selected_option.get_attribute("value")
            for policy in (None, "full_prefill"):  # warm the process, as a second question is
                body = {"collection_id": collection, "question": QUESTION, "top_k": 3,
                        "max_new_tokens": 48, **({"policy": policy} if policy else {})}
                httpx.post(url + "/v1/query", json=body, timeout=WAIT_S).raise_for_status()

            Select(d.find_element(By.CSS_SELECTOR, "#top-k")).select_by_visible_text("3")
            d.find_element(By.CSS_SELECTOR, "#question").send_keys(QUESTION, Keys.ENTER)
            run = wait(d, "the answer",
                       lambda: d.find_elements(By.CSS_SELECTOR, '.run[data-done="1"]'))[0]
            wait(d, "the thumbnails", lambda: images_loaded(d))
            run.find_element(By.CSS_SELECTOR, "summary").click()
            d.execute_script("document.activeElement.blur()")  # no selected question text
            shot(d, out / "answer.png", width)

            d.find_element(By.CSS_SELECTOR, ".compare").click()
            wait(d, "the comparison", lambda: d.find_elements(By.CSS_SELECTOR, ".comparison"))
            full = d.find_element(By.CSS_SELECTOR, '.run[data-policy="full_prefill"]')
            full.find_element(By.CSS_SELECTOR, "summary").click()
            print("  " + d.find_element(By.CSS_SELECTOR, ".comparison").text)
            shot(d, out / "compare.png", width)
        finally:
            d.quit()
            stop_server(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="folder for the PNGs (default: docs/screenshots)")
    parser.add_argument("--width", type=int, default=1280, help="window width in CSS pixels")
    args = parser.parse_args()
    take(args.out, args.width)


if __name__ == "__main__":
    main()
