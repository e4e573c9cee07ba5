"""The web page at `/`, end to end in headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by Selenium) against a real `conduit serve` with the builtin model:
create a collection, upload a generated PDF (and a bad one), wait for ready, ask, see the answer
stream in, a citation thumbnail that loads and a highlighted snippet, enlarge it, compare with
full prefill, delete the document; then the same with API keys on. Then text without spaces
(a long answer, snippet and file name) must wrap instead of widening the page, and ticking one
of two documents must ask over that one only. A screenshot of each step is written to the
test's output folder (`tmp_path/shots`)."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from lab.ingest.builders import text_image
from tests.made_files import office_open_xml
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
    # a deployment that scores 0.6 of the layers: on the tiny model that costs less than a
    # full prefill from the cached embeddings, so the page shows CONDUIT's own path
    yield from _server(tmp_path_factory, "ui-keyed",
                       {"CONDUIT_API_KEYS": json.dumps(["ui-secret-key"]),
                        "CONDUIT_SCORE_LAYERS": "0.6"})


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
            # the page replaces elements as it re-renders (an option, a document row): an
            # element found a moment before may be gone by the time it is read; look again
            return WebDriverWait(self.d, timeout, poll_frequency=0.2,
                                 ignored_exceptions=[StaleElementReferenceException]
                                 ).until(lambda _: cond())
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
    usage = w.css("#usage-line")  # the tenant's usage against the default quotas
    w.wait("the usage line", lambda: re.fullmatch(
        r"Using [1-9]\d* of 5,000 documents · [1-9]\d* of 100,000 pages · \S+ \S*B of "
        r"21\.5 GB stored", usage.text))
    used = usage.text
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
    if key is None:  # the tiny test model's pages are 16 tokens: the default (0.8 of the
        # layers) would cost more than a full prefill from the cached embeddings, which ran
        # instead, as said
        assert "full prefill from cached page embeddings: conduit_per_page was predicted" in details
    else:  # the keyed deployment scores 0.6 of the layers and runs over the page KV
        assert "Prefill conduit_per_page over the cached page KV" in details
    assert "Prompt head from cache" in details
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
    w.wait("the usage line to count the deletion", lambda: usage.text not in ("", used))
    uncaught = [e["message"] for e in d.get_log("browser") if e.get("source") == "javascript"]
    assert not uncaught, uncaught
    w.shot("deleted")


def test_page_walkthrough(browser: WebDriver, open_server: str, tmp_path: Path) -> None:
    _walk(Walk(browser, tmp_path / "shots"), open_server, tmp_path, key=None, password=None)


# Wraps the page's fetch: records every query body it sends (window.__sent) and, while
# window.__longRun is set, hands the page the real streamed answer with its text and its
# snippets swapped for that run without a space (a model can answer that; the builtin's noise
# often does).
WATCH_QUERIES = r"""
    window.__sent = [];
    window.__longRun = arguments[0];
    if (!window.__realFetch) window.__realFetch = window.fetch;
    const real = window.__realFetch;
    window.fetch = async (url, init) => {
      const path = String(url);
      if (path.startsWith("/v1/query")) window.__sent.push(JSON.parse(init.body));
      const resp = await real(url, init);
      const long = window.__longRun;
      if (!long || path !== "/v1/query/stream" || !resp.ok) return resp;
      const text = await resp.text();
      const block = text.split("\n\n").find((b) => b.startsWith("event: done"));
      if (!block) return new Response(text, {headers: {"Content-Type": "text/event-stream"}});
      const done = JSON.parse(block.slice(block.indexOf("data:") + 5));
      done.answer = long;
      for (const c of done.citations) {
        c.snippet = {text: long, spans: [[6, 120]], clipped_left: true, clipped_right: true};
      }
      const sse = (name, data) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
      return new Response(sse("token", {text: long.slice(0, 100)}) +
                          sse("token", {text: long.slice(100)}) + sse("done", done),
                          {headers: {"Content-Type": "text/event-stream"}});
    };"""

PAGE_WIDTH = """
    const root = document.documentElement;
    const edge = root.clientWidth;
    const wide = [...document.querySelectorAll("body *")]
      .filter((e) => e.getClientRects().length && e.getBoundingClientRect().right > edge + 0.5)
      .slice(0, 6).map((e) => `${e.tagName.toLowerCase()}.${e.className}`);
    return [root.scrollWidth, edge, wide];"""


def _fits(w: Walk, what: str) -> None:
    """The page is no wider than the window (nothing to scroll sideways)."""
    scroll, client, wide = w.d.execute_script(PAGE_WIDTH)
    if scroll > client:
        w.shot(f"too-wide-{what}")
    assert scroll <= client, f"{what}: the page is {scroll}px wide in a {client}px window; " \
        f"sticking out: {wide}"


def _no_page_errors(d: WebDriver) -> None:
    """No uncaught error in the page's scripts and nothing refused by its CSP."""
    bad = [e["message"] for e in d.get_log("browser")
           if e.get("source") == "javascript" or "Content Security Policy" in e["message"]]
    assert not bad, bad


def _new_collection(w: Walk, url: str, name: str) -> None:
    w.d.get(url + "/")
    w.wait("the page", lambda: w.d.title.startswith("conduit"))
    w.wait("the collections", lambda: w.all("#collection option"))
    w.css("#new-collection").send_keys(name, Keys.ENTER)
    select = Select(w.css("#collection"))
    w.wait(f"the collection {name}", lambda: select.first_selected_option.text == name)


def _upload_ready(w: Walk, files: list[Path]) -> dict[str, str]:
    """Upload the files and wait until all are ready; their document ids by file name."""
    for f in files:
        w.css("#file-input").send_keys(str(f))
    w.wait("the documents to be done", lambda: len(w.all(".doc .badge.ready, .doc .badge.failed"))
           == len(files))
    assert len(w.all(".doc .badge.ready")) == len(files), [e.text for e in w.all(".doc-error")]
    return {row.find_element(By.CSS_SELECTOR, ".doc-name").get_attribute("title"):
            row.get_attribute("data-id") for row in w.all(".status-ready")}


def _ask(w: Walk, question: str) -> WebElement:
    """Ask in the page; the newest answer card once its answer is done."""
    cards = len(w.all(".answer-card"))
    w.wait("the ask button", w.css("#ask-form button[type=submit]").is_enabled)
    box = w.css("#question")
    box.clear()
    box.send_keys(question, Keys.ENTER)
    w.wait("the answer card", lambda: len(w.all(".answer-card")) == cards + 1)
    card = w.all(".answer-card")[0]
    w.wait("the answer", lambda: card.find_elements(By.CSS_SELECTOR, '.run[data-done="1"]'))
    w.wait("its citations", lambda: card.find_elements(By.CSS_SELECTOR, ".cite"))
    return card


def test_text_without_spaces_wraps(browser: WebDriver, open_server: str,
                                   tmp_path: Path) -> None:
    """A long run without a space in the answer, a snippet or a file name wraps: the page never
    grows wider than the window (at laptop and phone widths), nor does the page viewer."""
    w = Walk(browser, tmp_path / "shots")
    d = w.d
    d.set_window_size(1366, 900)
    _new_collection(w, open_server, "wrapping")
    name = "SafetyManualForThePressureValveOfTheNorthernPlant" * 3 + ".pdf"
    pdf = tmp_path / name
    pdf.write_bytes(text_pdf(PAGES))
    _upload_ready(w, [pdf])
    _fits(w, "the library")
    long = "YesYesYes" + "hshshs" * 120 + "7Yes"
    d.execute_script(WATCH_QUERIES, long)
    card = _ask(w, QUESTION)
    assert card.find_element(By.CSS_SELECTOR, ".answer-text").text == long
    assert long[6:120] in card.find_element(By.CSS_SELECTOR, ".snippet mark").text
    assert name in card.find_element(By.CSS_SELECTOR, ".cite-name").text
    w.shot("long-answer")
    _fits(w, "a long answer")
    card.find_element(By.CSS_SELECTOR, ".compare").click()
    w.wait("the full-prefill answer",
           lambda: len(card.find_elements(By.CSS_SELECTOR, '.run[data-done="1"]')) == 2)
    w.wait("the comparison", lambda: card.find_elements(By.CSS_SELECTOR, ".comparison"))
    w.shot("long-compare")
    _fits(w, "two long answers side by side")

    card.find_element(By.CSS_SELECTOR, "button.thumb").click()
    viewer = w.css("#viewer")
    w.wait("the viewer", lambda: d.execute_script("return arguments[0].open", viewer))
    w.shot("long-enlarged")
    inner, outer = d.execute_script("return [arguments[0].scrollWidth, arguments[0].clientWidth]",
                                    viewer)
    assert inner <= outer, f"the page viewer scrolls sideways: {inner} > {outer}"
    d.switch_to.active_element.send_keys(Keys.ESCAPE)
    w.wait("the viewer to close", lambda: not d.execute_script("return arguments[0].open",
                                                                viewer))
    try:
        d.set_window_size(390, 844)  # a phone
        d.execute_script("document.querySelector('.answer-card').scrollIntoView()")
        w.shot("long-phone")
        _fits(w, "a long answer on a phone")
    finally:
        d.set_window_size(1366, 900)

    row = w.css(".status-ready")
    row.find_element(By.CSS_SELECTOR, "button.delete").click()
    row.find_element(By.CSS_SELECTOR, "button.delete").click()
    w.wait("the deletion", lambda: "Deleted" in w.css("#library-alert").text)
    _fits(w, "the deletion message")
    d.execute_script("window.__longRun = null")
    _no_page_errors(d)


def test_ask_over_chosen_documents(browser: WebDriver, open_server: str,
                                   tmp_path: Path) -> None:
    """All ready documents are ticked by default and a question goes to the whole collection;
    untick one of two and the question (and its comparison) is asked over the other only, the
    answer names it as searched, and the real service's citations come from it alone."""
    w = Walk(browser, tmp_path / "shots")
    d = w.d
    _new_collection(w, open_server, "two manuals")
    valves, pumps = tmp_path / "valves.pdf", tmp_path / "pumps.pdf"
    valves.write_bytes(text_pdf([
        "Valve manual. The pressure valve must be inspected every fourteen days.",
        "Valve log. Each pressure valve inspection is written in the valve log.",
    ]))
    pumps.write_bytes(text_pdf([
        "Pump manual. The pump pressure valve must be inspected every month by a technician.",
        "Pump log. The pump is inspected after every pressure alarm.",
    ]))
    ids = _upload_ready(w, [valves, pumps])
    assert set(ids) == {"valves.pdf", "pumps.pdf"}
    scope_all = w.css("#scope-all")
    w.wait("the scope controls", lambda: w.css("#scope").is_displayed())
    picks = {row.find_element(By.CSS_SELECTOR, ".doc-name").text:
             row.find_element(By.CSS_SELECTOR, "input.pick") for row in w.all(".status-ready")}
    assert scope_all.is_selected() and all(p.is_selected() for p in picks.values())
    assert "all 2 ready documents" in w.css("#ask-hint").text
    w.shot("two-documents")

    d.execute_script(WATCH_QUERIES, None)
    card = _ask(w, QUESTION)
    sent = d.execute_script("return window.__sent")
    assert len(sent) == 1 and "document_ids" not in sent[0], sent  # the whole collection
    searched = card.find_elements(By.CSS_SELECTOR, ".searched-doc")
    assert sorted(e.text for e in searched) == ["pumps.pdf", "valves.pdf"]
    cited = {e.text for e in card.find_elements(By.CSS_SELECTOR, ".cite-name strong")}
    assert cited == {"pumps.pdf", "valves.pdf"}, cited  # both hold a matching page

    picks["valves.pdf"].click()  # ask over pumps.pdf only
    assert not picks["valves.pdf"].is_selected() and picks["pumps.pdf"].is_selected()
    assert not scope_all.is_selected()
    assert d.execute_script("return arguments[0].indeterminate", scope_all)
    assert "1 of 2 ready documents" in w.css("#ask-hint").text
    card = _ask(w, QUESTION)
    sent = d.execute_script("return window.__sent")
    assert sent[-1]["document_ids"] == [ids["pumps.pdf"]], sent[-1]
    searched = card.find_elements(By.CSS_SELECTOR, ".searched-doc")
    assert [(e.text, e.get_attribute("data-document-id")) for e in searched] == \
        [("pumps.pdf", ids["pumps.pdf"])]
    assert "1 of 2" in card.find_element(By.CSS_SELECTOR, ".searched").text
    cited = [e.text for e in card.find_elements(By.CSS_SELECTOR, ".cite-name strong")]
    assert cited and set(cited) == {"pumps.pdf"}, cited
    w.shot("scoped-answer")

    card.find_element(By.CSS_SELECTOR, ".compare").click()
    w.wait("the full-prefill answer",
           lambda: len(card.find_elements(By.CSS_SELECTOR, '.run[data-done="1"]')) == 2)
    sent = d.execute_script("return window.__sent")
    assert sent[-1]["policy"] == "full_prefill"
    assert sent[-1]["document_ids"] == [ids["pumps.pdf"]], sent[-1]  # the same scope
    w.shot("scoped-compare")

    # the real service, asked what the page sent: pumps.pdf's pages only; without the scope
    # valves.pdf's best page is among them
    scoped = {**sent[-2], "max_new_tokens": 2}
    out = httpx.post(open_server + "/v1/query", json=scoped, timeout=WAIT_S).json()
    assert out["citations"] and {c["document_id"] for c in out["citations"]} == \
        {ids["pumps.pdf"]}, out["citations"]
    whole = {k: v for k, v in scoped.items() if k != "document_ids"}
    out = httpx.post(open_server + "/v1/query", json=whole, timeout=WAIT_S).json()
    assert ids["valves.pdf"] in {c["document_id"] for c in out["citations"]}

    scope_all.click()  # all again
    assert all(p.is_selected() for p in picks.values())
    assert "all 2 ready documents" in w.css("#ask-hint").text
    scope_all.click()  # none: nothing to ask over
    assert not any(p.is_selected() for p in picks.values())
    assert not w.css("#ask-form button[type=submit]").is_enabled()
    assert "Tick a document" in w.css("#ask-hint").text
    picks["valves.pdf"].click()
    assert w.css("#ask-form button[type=submit]").is_enabled()
    assert "1 of 2 ready documents" in w.css("#ask-hint").text

    # the ticked one deleted: one document left, nothing to choose, asked over
    delete = w.css(f'[data-id="{ids["valves.pdf"]}"] button.delete')
    delete.click()
    delete.click()
    w.wait("valves.pdf to go", lambda: not w.all(f'.doc[data-id="{ids["valves.pdf"]}"]'))
    assert not w.css("#scope").is_displayed()
    assert not w.css(".status-ready input.pick").is_displayed()
    assert w.css("#ask-form button[type=submit]").is_enabled()
    assert w.css("#ask-hint").text == "Asking over 1 ready document."
    _no_page_errors(d)


def test_page_walkthrough_with_api_keys(browser: WebDriver, keyed_server: str,
                                        tmp_path: Path) -> None:
    browser.get("about:blank")
    _walk(Walk(browser, tmp_path / "shots"), keyed_server, tmp_path, key="ui-secret-key",
          password="s3cret")


DROP_FILES = """
    const [files] = arguments;
    const dt = new DataTransfer();
    for (const [b64, name, type] of files) {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      dt.items.add(new File([bytes], name, {type}));
    }
    const zone = document.querySelector("#dropzone");
    for (const type of ["dragenter", "dragover", "drop"]) {
      zone.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
    }"""


@pytest.mark.skipif(shutil.which("soffice") is None, reason="LibreOffice is not installed")
def test_a_dropped_png_and_docx_become_documents(browser: WebDriver, open_server: str,
                                                 tmp_path: Path) -> None:
    """A scan (PNG) and a Word file dropped together on the drop zone are both accepted,
    ingested and asked over; the picker offers them too."""
    w = Walk(browser, tmp_path / "shots")
    _new_collection(w, open_server, "scans and files")
    accepted = w.css("#file-input").get_attribute("accept") or ""
    assert ".png" in accepted and ".docx" in accepted
    scan = io.BytesIO()
    Image.open(io.BytesIO(text_image(PAGES[1:2], size=(1654, 400), font_px=36))).save(
        scan, "PNG")
    files = [(base64.b64encode(scan.getvalue()).decode(), "scan.png", "image/png"),
             (base64.b64encode(office_open_xml("docx", PAGES)).decode(), "handbook.docx",
              "application/vnd.openxmlformats-officedocument.wordprocessingml.document")]
    w.d.execute_script(DROP_FILES, files)
    w.wait("the documents to be done",
           lambda: len(w.all(".doc .badge.ready, .doc .badge.failed")) == 2)
    assert len(w.all(".doc .badge.ready")) == 2, [e.text for e in w.all(".doc-error")]
    names = {e.get_attribute("title") for e in w.all(".status-ready .doc-name")}
    assert names == {"scan.png", "handbook.docx"}
    w.shot("png-and-docx")
    card = _ask(w, QUESTION)
    cited = {e.text for e in card.find_elements(By.CSS_SELECTOR, ".cite-name strong")}
    assert cited and cited <= names, cited
