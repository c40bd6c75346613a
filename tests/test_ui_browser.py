"""The memory browser in a real browser: Debian's chromium, driven by Selenium through
its chromedriver (nothing downloaded), against a real `memd run` with real transcripts.

With MEMD_UI_SCREENSHOTS=DIR the pages' screenshots are saved there (docs/ui/ holds the
README's); otherwise in the test's own folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.ui import CLIENT, files_text, login_link, record, ui_settings, ui_status

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FACT = "The spare key to the allotment shed is taped under the blue water butt."
HOSTILE = (
    "<script>alert('script')</script> <img src=x onerror=\"alert('img')\"> "
    "[click me](javascript:alert('link')) <a href=\"javascript:alert('a')\">a</a>"
)
NEVER = "quantum xylophone regatta in Ulaanbaatar"

if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(
        f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}); "
        "`apt-get install chromium chromium-driver` (.ci/run does)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402


@pytest.fixture(scope="module")
def memd(module_daemon: Callable[..., tuple[DaemonProcess, Path]]) -> DaemonProcess:
    memd, _tmp = module_daemon(**ui_settings())
    record(memd, "garden", f"Please remember this: {FACT}", "Noted: the key is under the butt.")
    record(memd, "garden", "Also the shed padlock code is 2781.", "Padlock 2781, noted.")
    record(memd, "trip", "Book the ferry to Harwich for Friday.", "Booked for Friday.")
    record(memd, "hostile", HOSTILE, f"Echo: {HOSTILE}")
    return memd


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def chrome(downloads: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,820"):
        options.add_argument(arg)
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def ui(memd: DaemonProcess, chrome: Any) -> str:
    """Logged in: the base URL of the UI."""
    base = ui_status(memd)["url"].rstrip("/")
    chrome.get(login_link(memd))
    assert chrome.current_url == base + "/", chrome.page_source[:2000]
    return base


def shot(chrome: Any, name: str) -> None:
    folder = Path(
        os.environ.get("MEMD_UI_SCREENSHOTS") or Path(chrome.capabilities["chrome"]["userDataDir"])
    )
    folder.mkdir(parents=True, exist_ok=True)
    chrome.save_screenshot(str(folder / f"{name}.png"))


def console_errors(chrome: Any) -> list[dict[str, Any]]:
    return [e for e in chrome.get_log("browser") if e["level"] == "SEVERE"]


def no_alert(chrome: Any) -> None:
    with pytest.raises(NoAlertPresentException):
        chrome.switch_to.alert  # noqa: B018 - reading it is the check


def conversation_link(chrome: Any, title_part: str) -> Any:
    return next(
        a for a in chrome.find_elements(By.CSS_SELECTOR, ".convs a") if title_part in a.text
    )


def test_overview_client_and_conversation(ui: str, chrome: Any, memd: DaemonProcess) -> None:
    chrome.get(ui + "/")
    assert chrome.find_element(By.TAG_NAME, "h1").text == "Overview"
    row = chrome.find_element(By.LINK_TEXT, CLIENT).find_element(By.XPATH, "../..")
    assert "both" in row.text and "on" in row.text
    assert chrome.find_element(By.CSS_SELECTOR, "meta[http-equiv=refresh]")
    shot(chrome, "overview")
    chrome.find_element(By.LINK_TEXT, CLIENT).click()
    titles = [a.text for a in chrome.find_elements(By.CSS_SELECTOR, ".convs a")]
    assert len(titles) == 3 and titles[-1].startswith("Please remember this")  # newest first
    assert "2 exchanges" in chrome.find_element(By.CSS_SELECTOR, ".convs").text
    shot(chrome, "client")
    conversation_link(chrome, "Please remember this").click()
    exchanges = chrome.find_elements(By.CSS_SELECTOR, "article.exchange")
    assert [e.get_attribute("id") for e in exchanges] == ["x1", "x2"]
    assert (
        FACT in exchanges[0].text and "UTC" in exchanges[0].find_element(By.TAG_NAME, "time").text
    )
    shot(chrome, "conversation")
    no_alert(chrome)


def test_search_finds_the_fact_with_its_score_and_links_to_it(ui: str, chrome: Any) -> None:
    deadline = time.monotonic() + 90
    results: list[Any] = []
    while time.monotonic() < deadline and not results:
        chrome.get(ui + f"/c/{CLIENT}")
        box = chrome.find_element(By.ID, "q")
        box.send_keys("where is the spare key to the allotment shed" + Keys.ENTER)
        results = chrome.find_elements(By.CSS_SELECTOR, "li.result")
        if not results:
            time.sleep(1)
    assert results, chrome.page_source[:3000]
    first = results[0]
    assert FACT in first.text
    assert float(first.find_element(By.CLASS_NAME, "score").text.split()[-1]) > 0
    shot(chrome, "search")
    first.find_element(By.LINK_TEXT, "open in its conversation").click()
    assert chrome.current_url.endswith("#x1")
    assert FACT in chrome.find_element(By.ID, "x1").text
    chrome.get(ui + f"/c/{CLIENT}/search?q=" + NEVER.replace(" ", "+"))
    assert chrome.find_element(By.CLASS_NAME, "nothing").text == "No relevant memories found."


def test_a_hostile_transcript_runs_nothing(ui: str, chrome: Any) -> None:
    chrome.get_log("browser")  # drop what came before
    chrome.get(ui + f"/c/{CLIENT}")
    conversation_link(chrome, "alert").click()
    text = chrome.find_element(By.ID, "x1").text
    assert "<script>alert('script')</script>" in text and "onerror=" in text
    assert "[click me](javascript:alert('link'))" in text
    no_alert(chrome)
    assert chrome.find_elements(By.CSS_SELECTOR, "main script, main img, main iframe") == []
    hrefs = [a.get_attribute("href") or "" for a in chrome.find_elements(By.TAG_NAME, "a")]
    assert not [h for h in hrefs if h.lower().startswith("javascript:")]
    assert console_errors(chrome) == []
    chrome.get(ui + f"/c/{CLIENT}/search?q=alert+script+onerror")
    no_alert(chrome)
    assert console_errors(chrome) == []


def test_keyboard_and_phone_width(ui: str, chrome: Any) -> None:
    chrome.get(ui + "/")
    body = chrome.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    assert chrome.switch_to.active_element.text == "Skip to content"
    chrome.set_window_size(390, 844)
    try:
        for path in ("/", f"/c/{CLIENT}"):
            chrome.get(ui + path)
            wide = chrome.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert wide <= 1, path
        conversation_link(chrome, "Please remember this").click()
        shot(chrome, "phone-conversation")
    finally:
        chrome.set_window_size(1100, 820)


def test_export_downloads_what_was_recorded(ui: str, chrome: Any, downloads: Path) -> None:
    chrome.get(ui + f"/c/{CLIENT}")
    chrome.find_element(By.LINK_TEXT, "JSON lines").click()
    deadline = time.monotonic() + 30
    files: list[Path] = []
    while time.monotonic() < deadline and not files:
        files = [p for p in downloads.glob("memd-demo-*.jsonl")]
        time.sleep(0.2)
    assert files, list(downloads.iterdir())
    time.sleep(0.5)
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [r["conversation_id"] for r in rows] == ["garden", "garden", "trip", "hostile"]
    assert FACT in rows[0]["user"] and rows[3]["user"] == HOSTILE


def test_forget_a_conversation_with_preview_and_confirm(
    ui: str, chrome: Any, memd: DaemonProcess
) -> None:
    memory_dir = Path(memd.call("daemon.status")["memory_dir"])
    assert FACT in files_text(memory_dir)
    chrome.get(ui + f"/c/{CLIENT}")
    conversation_link(chrome, "Please remember this").click()
    chrome.find_element(By.PARTIAL_LINK_TEXT, "Forget this conversation").click()
    counts = chrome.find_element(By.ID, "counts").text
    assert counts.startswith("2 exchanges in 1 session")
    titles = [
        td.text for td in chrome.find_elements(By.CSS_SELECTOR, "table.preview td:last-child")
    ]
    assert len(titles) == 2 and all(t.startswith("Please remember this") for t in titles)
    assert FACT in files_text(memory_dir)  # a preview changes nothing
    shot(chrome, "forget")
    chrome.find_element(By.ID, "confirm").click()
    receipts = chrome.find_elements(By.ID, "receipt")
    assert receipts, chrome.page_source[-3000:]
    receipt = receipts[0].text
    assert receipt.startswith("Removed 2 exchanges"), receipt
    shot(chrome, "receipt")
    assert FACT not in files_text(memory_dir) and "2781" not in files_text(memory_dir)
    found = memd.call("memory.recall", {"client_id": CLIENT, "query": "spare key allotment shed"})
    assert FACT not in json.dumps(found)
    chrome.get(ui + f"/c/{CLIENT}")
    assert len(chrome.find_elements(By.CSS_SELECTOR, ".convs a")) == 2
    if shutil.which("true"):
        no_alert(chrome)
