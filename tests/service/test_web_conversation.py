"""The web page's conversation panel in headless Chromium against a real `conduit serve`
(issue 66): a 3-turn conversation is a thread of turns, each with the pages it cited, the
follow-ups reuse the earlier turns' KV and read them (the third cites the page only the
second named), "New conversation" empties the thread and the list opens the conversation
again. Its screenshot is docs/screenshots/conversation.png."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from tests.pdfs import text_pdf
from tests.service.test_web_ui import Walk, _new_collection, _upload_ready
from tests.service.test_web_ui import browser as browser  # the fixture
from tests.service.test_web_ui import open_server as open_server  # the fixture

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "conversation.png"
TURNS = ["How often must the pressure valve be inspected?",
         "What happened to the gearbox of turbine seven?",
         "Say more about it."]


def _send(w: Walk, question: str) -> WebElement:
    """Ask in the conversation panel; the new turn once its answer is done."""
    turns = len(w.all(".turn"))
    w.wait("the send button", w.css("#follow-form button[type=submit]").is_enabled)
    box = w.css("#follow-up")
    box.send_keys(question, Keys.ENTER)
    w.wait("the turn", lambda: len(w.all(".turn.done")) == turns + 1)
    return w.all(".turn")[-1]


def _pages(turn: WebElement) -> list[str]:
    return [e.text for e in turn.find_elements(By.CSS_SELECTOR, ".page-chip")]


def test_a_three_turn_conversation(browser: WebDriver, open_server: str,  # noqa: F811
                                   tmp_path: Path) -> None:
    w = Walk(browser, tmp_path / "shots")
    _new_collection(w, open_server, "plant logs")
    logs = tmp_path / "logs.pdf"
    logs.write_bytes(text_pdf([
        "Safety manual. The pressure valve must be inspected every fourteen days.",
        "Wind farm log. The gearbox of turbine seven was replaced in March.",
        "Bakery accounts. Flour costs rose by nine percent over the year."]))
    _upload_ready(w, [logs])
    w.css("#chat-top-k").send_keys("1")
    first = _send(w, TURNS[0])
    assert _pages(first) == ["logs.pdf p.1"]
    assert "first turn" in first.find_element(By.CSS_SELECTOR, ".turn-meta").text
    second = _send(w, TURNS[1])
    third = _send(w, TURNS[2])
    assert _pages(second) == _pages(third) == ["logs.pdf p.2"]
    for turn in (second, third):
        assert "earlier turns' KV reused" in turn.find_element(By.CSS_SELECTOR,
                                                                ".turn-meta").text
    assert [t.find_element(By.CSS_SELECTOR, ".turn-question").text
            for t in w.all(".turn")] == TURNS
    w.d.execute_script("document.querySelector('#chat').scrollIntoView()")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    w.d.save_screenshot(str(SCREENSHOT))

    picker = Select(w.css("#conversations"))
    w.wait("the conversation in the list",
           lambda: picker.first_selected_option.text == TURNS[0])
    w.css("#new-conversation").click()
    w.wait("an empty thread", lambda: not w.all(".turn"))
    picker.select_by_visible_text(TURNS[0])
    w.wait("the turns again", lambda: len(w.all(".turn")) == 3)
    assert _pages(w.all(".turn")[2]) == ["logs.pdf p.2"]
