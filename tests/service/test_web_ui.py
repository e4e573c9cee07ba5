"""The web page at `/`, end to end in headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by Selenium) against a real `conduit serve` with the builtin model:
create a collection, upload a generated PDF (and a bad one), wait for ready, ask, see the answer
stream in, a citation thumbnail that loads and a highlighted snippet, enlarge it, compare with
full prefill, delete the document; then the same with API keys on. A screenshot of each step is
written to the test's output folder (`tmp_path/shots`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.pdfs import encrypted_pdf, text_pdf
from tests.service.conftest import start_server, stop_server

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PAGES = [
    "Quarterly report. Revenue grew in the northern region thanks to new retail stores.",
    "Safety manual. The pressure valve must be inspected every fourteen days by a technician.",
    "Research notes. Photosynthesis converts sunlight, water and carbon dioxide into glucose.",
]
QUESTION = "How often must the pressure valve be inspected?"
WAIT_S = 240


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium from the Debian packages (never a downloaded browser)."""
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.fail("the browser tests need Debian's chromium and chromium-driver: "
                    "run `make system-deps` (or apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1366,900", "--force-device-scale-factor=1",
                "--disable-features=Translate", "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(str(CHROMEDRIVER)))
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def _server(tmp_path_factory: pytest.TempPathFactory, name: str,
            env: dict[str, str] | None = None) -> Iterator[str]:
    home = tmp_path_factory.mktemp(name)
    # a loaded 2-core box can take over a minute per page on the first (model-loading) ingest
    url, proc = start_server(home, {"CONDUIT_PAGE_TIMEOUT_S": "600", **(env or {})})
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(tmp_path_factory, "ui-open")


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(tmp_path_factory, "ui-keyed",
                       {"CONDUIT_API_KEYS": json.dumps(["ui-secret-key"])})


class Walk:
    """One browser session through the page, with numbered screenshots."""

    def __init__(self, driver: WebDriver, shots: Path) -> None:
        self.d = driver
        self.shots = shots
        self.step = 0
        shots.mkdir(parents=True, exist_ok=True)

    def shot(self, name: str) -> None:
        self.step += 1
        self.d.save_screenshot(str(self.shots / f"{self.step:02d}-{name}.png"))

    def wait(self, what: str, cond, timeout: float = WAIT_S):  # type: ignore[no-untyped-def]
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.2).until(lambda _: cond())
        except TimeoutException:
            self.shot(f"timeout-{what.replace(' ', '-')}")
            raise AssertionError(f"timed out waiting for {what}") from None

    def css(self, selector: str) -> WebElement:
        return self.d.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list[WebElement]:
        return self.d.find_elements(By.CSS_SELECTOR, selector)


DROP_FILE = """
    const [b64, name] = arguments;
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([bytes], name, {type: "application/pdf"}));
    const zone = document.querySelector("#dropzone");
    for (const type of ["dragenter", "dragover", "drop"]) {
      zone.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
    }"""


def _walk(w: Walk, url: str, tmp: Path, *, key: str | None, password: str | None) -> None:
    """The whole walk; with `password`, the PDF is encrypted and the password typed in."""
    d = w.d
    d.get(url + "/")
    w.wait("the page", lambda: d.title.startswith("conduit"))
    if key is not None:  # the first call is refused: the page asks for a key
        alert = w.css("#key-alert")
        w.wait("the key prompt", lambda: alert.is_displayed() and "key" in alert.text)
        assert d.switch_to.active_element == w.css("#api-key")
        w.shot("key-prompt")
        w.css("#api-key").send_keys(key, Keys.ENTER)
        w.wait("the key to be kept", lambda: "key set" in w.css("#key-state").text)
        assert d.execute_script("return sessionStorage.getItem('conduit.apiKey')") == key
    w.wait("the model note", lambda: "random weights" in w.css("#model-note").text)
    assert "builtin:tiny-qwen2-vl" in w.css("#model-line").text
    w.shot("start")

    w.css("#new-collection").send_keys("handbooks", Keys.ENTER)
    select = Select(w.css("#collection"))
    w.wait("the new collection", lambda: select.first_selected_option.text == "handbooks")
    w.shot("collection")

    # dropped on the drop zone: not a PDF, refused with the server's message
    d.execute_script(DROP_FILE, base64.b64encode(b"plain text, not a PDF").decode(), "notes.pdf")
    w.wait("the rejection", lambda: any("not a PDF" in e.text for e in w.all(".doc-error")))
    good = tmp / "handbook.pdf"
    good.write_bytes(text_pdf(PAGES) if password is None else encrypted_pdf(PAGES, password))
    if password is not None:
        w.css("#pdf-password").send_keys(password)
    w.css("#file-input").send_keys(str(good))
    w.wait("a progress bar", lambda: w.all(".doc progress") or w.all(".badge.ready"))
    w.shot("uploading")
    w.wait("the document to be done", lambda: w.all(".doc .badge.ready, .doc .badge.failed"))
    assert w.all(".doc .badge.ready"), [e.text for e in w.all(".doc-error")]
    w.wait("the page facts", lambda: "KV cached 3/3" in w.css(".status-ready .doc-meta").text)
    w.shot("ready")

    d.execute_script("""
        window.__updates = 0;
        new MutationObserver((records) => {
          for (const r of records) {
            const node = r.target.nodeType === 1 ? r.target : r.target.parentElement;
            if (node && node.closest('.run[data-policy="default"] .answer-text')) {
              window.__updates++;
            }
          }
        }).observe(document.querySelector('#answers'),
                   {subtree: true, childList: true, characterData: true});""")
    ask = w.css("#ask-form button[type=submit]")
    w.wait("the ask button", ask.is_enabled)
    w.css("#question").send_keys(QUESTION, Keys.ENTER)
    run = w.wait("the answer", lambda: w.all('.run[data-done="1"]'))[0]
    assert d.execute_script("return window.__updates") >= 2, "the answer did not stream"
    assert run.find_element(By.CSS_SELECTOR, ".answer-text").text.strip()

    cite = w.wait("a citation", lambda: w.all(".cite"))[0]
    assert "handbook.pdf" in cite.text and "page 2" in cite.text
    img = cite.find_element(By.CSS_SELECTOR, "img")
    w.wait("the thumbnail", lambda: d.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth > 0", img))
    assert d.execute_script("return arguments[0].naturalWidth", img) == 240
    marks = {m.text.lower() for m in cite.find_elements(By.CSS_SELECTOR, ".snippet mark")}
    assert {"pressure", "valve", "inspected"} <= marks
    run.find_element(By.CSS_SELECTOR, "summary").click()
    details = " ".join(run.find_element(By.CSS_SELECTOR, "dl").text.split())
    assert "Pages from KV cache memory 3 · disk 0" in details  # prefilled at ingestion
    assert "Pages prefilled now 0" in details and "Time to first token" in details
    w.shot("answer")

    thumb = cite.find_element(By.CSS_SELECTOR, "button.thumb")
    thumb.click()
    viewer = w.css("#viewer")
    w.wait("the enlarged page", lambda: d.execute_script(
        "const i = arguments[0].querySelector('img');"
        "return arguments[0].open && i.complete && i.naturalWidth > 240", viewer))
    w.shot("enlarged")
    d.switch_to.active_element.send_keys(Keys.ESCAPE)
    w.wait("the viewer to close", lambda: not d.execute_script("return arguments[0].open",
                                                                viewer))
    assert d.switch_to.active_element == thumb  # focus goes back where it was

    w.css(".compare").click()
    w.wait("the full-prefill answer", lambda: len(w.all('.run[data-done="1"]')) == 2)
    comparison = w.wait("the comparison", lambda: w.all(".comparison"))[0]
    assert "Full prefill" in comparison.text and "TTFT" in comparison.text
    assert w.css('.run[data-policy="full_prefill"] .run-status').text.startswith("full_prefill")
    w.shot("compare")
    d.set_window_size(390, 844)  # a phone
    d.execute_script("document.querySelector('.answer-card').scrollIntoView()")
    w.shot("phone")
    d.set_window_size(1366, 900)

    row = w.css(".status-ready")
    doc_id = row.get_attribute("data-id")
    delete = row.find_element(By.CSS_SELECTOR, "button.delete")
    delete.click()
    assert delete.text == "Confirm delete"
    delete.click()
    w.wait("the document to go", lambda: not w.all(f'[data-id="{doc_id}"]'))
    assert "Deleted handbook.pdf" in w.css("#library-alert").text
    uncaught = [e["message"] for e in d.get_log("browser") if e.get("source") == "javascript"]
    assert not uncaught, uncaught
    w.shot("deleted")


def test_page_walkthrough(browser: WebDriver, open_server: str, tmp_path: Path) -> None:
    _walk(Walk(browser, tmp_path / "shots"), open_server, tmp_path, key=None, password=None)


def test_page_walkthrough_with_api_keys(browser: WebDriver, keyed_server: str,
                                        tmp_path: Path) -> None:
    browser.get("about:blank")
    _walk(Walk(browser, tmp_path / "shots"), keyed_server, tmp_path, key="ui-secret-key",
          password="s3cret")
