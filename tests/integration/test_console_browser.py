"""The web console in a real headless Chromium (Debian's chromium + chromedriver, driven by selenium, one
browser for the module).

Against a running service (`eventing run` in follow mode and `eventing serve`, each its own process, while
a loader keeps writing): the page shows the function's counters moving, pauses and resumes it from its
buttons, and a screenshot is saved; the ledger then shows nothing lost or handled twice.

Against `eventing serve` over a function whose every mutation failed (130 dead letters, a long application
log) and one that never logs: the console shows a cas with all its digits, epochs and times as the CLI does,
pages the dead letters without redrawing an unchanged page, follows the log only while it is scrolled to
the bottom, asks for no missing log, hides state-changing controls from a read-only token, and tells a
missing token from a wrong one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from eventing.cli.checkpoints import _epoch, _when
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops.verify import verify_function
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket
from eventing.storage.writes import chunked
from eventing.testing import BackgroundLoop, deploy_function, ledger_definition, load_source, wait_for
from eventing.workers.executor import InProcessExecutor

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "console-admin-token-0123456789"
READ_TOKEN = "console-read-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip(
        "chromium and chromium-driver are not installed (scripts/setup.sh installs them as root)",
        allow_module_level=True,
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Loader(BackgroundLoop):
    """Keeps writing updates to the source, 100 every 0.2 s, so the counters have something to move."""

    interval_s = 0.2

    def __init__(self, data_dir: str):
        super().__init__()
        self.bucket = LocalBucket.open(data_dir, "src")
        self.writes = chunked(loadgen.generate(500, 10_000_000, seed=11, prefix="live"), 100)

    def tick(self) -> None:
        self.bucket.write(next(self.writes))


def eventing(data_dir: str, *args: str, log: Path, read_token: str = "") -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "EVENTING_ADMIN_TOKEN": TOKEN,
        "EVENTING_READ_TOKEN": read_token,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "eventing", "--data-dir", data_dir, *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the service checkpoints and stops
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # failed requests show in the browser log
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1700",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_console_shows_live_counters_and_pauses_and_resumes_from_its_buttons(tmp_path, browser):
    from selenium.webdriver.common.by import By

    data_dir = str(tmp_path / "data")
    load_source(data_dir, 500, 3_000, seed=5)
    deploy_function(data_dir, ledger_definition("fn_live", "src", "ledger", workers=2))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = eventing(data_dir, "run", "--executor", "in-process", "--quiet", log=tmp_path / "run.log")
    serve = eventing(data_dir, "serve", "--port", str(port), log=tmp_path / "serve.log")
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    try:
        wait_for(
            lambda: api.get("/api/v1/status").json()["services"],
            "the service and the API",
            60,
            every=0.2,
            retry_on=(Exception,),
        )
        with Loader(data_dir):
            browser.get(base + "/")
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            browser.find_element(By.ID, "token-save").click()
            row = 'tr[data-function="fn_live"]'

            def cell(name: str) -> str:
                return browser.find_element(By.CSS_SELECTOR, f"{row} td.{name}").text

            def seen() -> int:
                return int(cell("seen").replace(",", "") or 0)

            wait_for(
                lambda: cell("state") == "deployed", "the function row", 30, every=0.2, retry_on=(Exception,)
            )
            first = wait_for(seen, "a first count", 30, every=0.2, retry_on=(Exception,))
            wait_for(lambda: seen() > first, "the seen counter to move", 30, every=0.2, retry_on=(Exception,))
            moved = seen()
            wait_for(
                lambda: seen() > moved, "the seen counter to move again", 30, every=0.2, retry_on=(Exception,)
            )
            # Legal buttons only: a deployed function offers pause and undeploy, not resume or deploy.
            actions = [
                b.get_attribute("data-action")
                for b in browser.find_elements(By.CSS_SELECTOR, f"{row} button")
            ]
            assert actions == ["pause", "undeploy"]

            browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="pause"]').click()
            wait_for(
                lambda: cell("state") == "paused", "the paused state", 60, every=0.2, retry_on=(Exception,)
            )
            actions = [
                b.get_attribute("data-action")
                for b in browser.find_elements(By.CSS_SELECTOR, f"{row} button")
            ]
            assert actions == ["resume", "undeploy"]
            assert api.get("/api/v1/status/fn_live").json()["app"]["composite_status"] == "paused"
            paused_at = seen()
            time.sleep(2.5)
            assert seen() == paused_at  # paused: nothing handled while the loader keeps writing
            wait_for(
                lambda: int(cell("backlog").replace(",", "") or 0) > 0,
                "a backlog while paused",
                30,
                every=0.2,
                retry_on=(Exception,),
            )

            browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="resume"]').click()
            wait_for(
                lambda: cell("state") == "deployed",
                "the deployed state",
                30,
                every=0.2,
                retry_on=(Exception,),
            )
            wait_for(
                lambda: seen() > paused_at,
                "the counter to move after resume",
                30,
                every=0.2,
                retry_on=(Exception,),
            )
            # The detail panel: vBucket map legend by worker, checkpoints, and the charts drawn.
            wait_for(
                lambda: "vBuckets" in browser.find_element(By.ID, "vbmap-legend").text,
                "the vBucket map",
                30,
                every=0.2,
                retry_on=(Exception,),
            )
            legend = browser.find_element(By.ID, "vbmap-legend").text
            assert "local/w0: 512 vBuckets" in legend and "local/w1: 512 vBuckets" in legend
            assert len(browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr")) == 32
            time.sleep(1.5)
            shot = tmp_path / "console.png"
            assert browser.save_screenshot(str(shot))
            assert shot.stat().st_size > 20_000
            print(f"console screenshot: {shot}")
        # The loader stopped: let the service catch up, then count through the ledger.
        wait_for(
            lambda: api.get("/api/v1/functions/fn_live/stats").json()["checkpoint_lag"] == 0,
            "catch-up",
            90,
            every=0.2,
            retry_on=(Exception,),
        )
    finally:
        api.close()
        stop(serve)
        stop(run)
    report = verify_function(data_dir, "fn_live")
    assert report.ok, report.summary()


# -- a stopped service's results: dead letters, a long log, a function that never logs ------------------

DEAD_LETTERS = 130
FAILING = """
def on_update(doc, meta):
    log("handling", meta.id, "of", doc.get("n"), "then failing on purpose")
    raise ValueError("no luck for " + meta.id)
"""
QUIET = """
def on_update(doc, meta):
    pass
"""


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """`eventing serve` (admin and read-only tokens) over fn_fail (every mutation a dead letter, one log
    line each) and fn_quiet (no log), both processed to the end in-process beforehand."""
    root = tmp_path_factory.mktemp("console-failed")
    data_dir = str(root / "data")
    source = LocalBucket.create(data_dir, "src")
    for i in range(DEAD_LETTERS):
        source.upsert(f"doc{i:03d}", {"n": i})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_fail", "source_bucket": "src"}), FAILING
    )
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_quiet", "source_bucket": "src"}), QUIET
    )
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    port = free_port()
    serve = eventing(data_dir, "serve", "--port", str(port), log=root / "serve.log", read_token=READ_TOKEN)
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    try:
        wait_for(
            lambda: api.get("/api/v1/status").status_code == 200,
            "the API",
            60,
            every=0.2,
            retry_on=(Exception,),
        )
        assert len(api.get("/api/v1/functions/fn_fail/dlq").json()) == DEAD_LETTERS
        yield {"data_dir": data_dir, "base": f"http://127.0.0.1:{port}", "api": api}
    finally:
        api.close()
        stop(serve)


def open_console(browser, site, token: str = TOKEN, function: str = "fn_fail") -> None:
    from selenium.webdriver.common.by import By

    if not browser.current_url.startswith(site["base"]):
        browser.get(site["base"] + "/")
    use_token(browser, token)

    def open_row() -> bool:  # the table may be redrawn between finding the row and clicking it
        browser.find_element(By.CSS_SELECTOR, f'tr[data-function="{function}"] td.name').click()
        return True

    wait_for(open_row, f"a click on the row of {function}", 30, every=0.2, retry_on=(Exception,))
    wait_for(
        lambda: browser.find_element(By.ID, "detail-name").text == function,
        f"the detail of {function}",
        10,
        every=0.2,
        retry_on=(Exception,),
    )


def use_token(browser, token: str) -> None:
    from selenium.webdriver.common.by import By

    field = browser.find_element(By.ID, "token")
    field.clear()
    if token:
        field.send_keys(token)
    browser.find_element(By.ID, "token-save").click()


def detail_polls(browser) -> int:
    return int(browser.execute_script("return document.body.dataset.detailPolls || 0"))


def wait_detail_polls(browser, count: int) -> None:
    """Until the detail panel has refreshed `count` more times (it does every 2 s)."""
    start = detail_polls(browser)
    wait_for(
        lambda: detail_polls(browser) >= start + count,
        f"{count} refreshes of the detail",
        10 + 3 * count,
        every=0.2,
        retry_on=(Exception,),
    )


def test_console_shows_a_cas_with_every_digit_and_epochs_and_times_as_the_cli(failed, browser):
    from selenium.webdriver.common.by import By

    open_console(browser, failed)
    api = failed["api"]
    first = api.get("/api/v1/functions/fn_fail/dlq?limit=1").json()[0]
    full = api.get(f"/api/v1/functions/fn_fail/dlq/show?vb={first['vb']}&seqno={first['seqno']}").json()[0]
    cas = full["mutation"]["cas"]
    assert cas > 2**53  # a nanosecond clock: beyond what a JavaScript number holds exactly
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#dlq tbody tr button"),
        "the dead letters",
        30,
        every=0.2,
        retry_on=(Exception,),
    )

    def show_first() -> bool:  # the table may be redrawn between finding the button and clicking it
        browser.find_element(By.XPATH, "//table[@id='dlq']/tbody/tr[1]//button[text()='show']").click()
        return True

    wait_for(
        show_first, "a click on the first dead letter's show button", 10, every=0.2, retry_on=(Exception,)
    )
    detail = wait_for(
        lambda: browser.find_element(By.ID, "dlq-detail").text,
        "the dead letter in full",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    assert f'"cas": {cas},' in detail
    assert json.loads(detail) == full  # the whole row as the API sent it, every number exact

    # Checkpoints: the epoch as generation:counter and the time as UTC date and time, as `eventing
    # checkpoints`.
    rows = {r["vb"]: r for r in api.get("/api/v1/functions/fn_fail/checkpoints").json()["rows"]}
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr"),
        "the checkpoints",
        30,
        every=0.2,
        retry_on=(Exception,),
    )
    # Read in one script: the console redraws the table on its refresh, which would leave elements found
    # one by one stale between two reads.
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('#checkpoints tbody tr')).slice(0, 5)"
        ".map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.innerText.trim()))"
    )
    assert shown
    for cells in shown:
        row = rows[int(cells[0])]
        assert cells[5] == _epoch(row["epoch"]) and ":" in cells[5]
        assert cells[7] == _when(row["updated_at"]) and cells[7].endswith("Z")


def test_dead_letters_are_paged_and_an_unchanged_page_is_not_redrawn(failed, browser):
    from selenium.webdriver.common.by import By

    open_console(browser, failed)
    api = failed["api"]

    def keys() -> list[str]:
        return [
            tr.find_elements(By.TAG_NAME, "td")[2].text
            for tr in browser.find_elements(By.CSS_SELECTOR, "#dlq tbody tr")
        ]

    def api_keys(offset: int) -> list[str]:
        return [r["key"] for r in api.get(f"/api/v1/functions/fn_fail/dlq?limit=50&offset={offset}").json()]

    wait_for(lambda: keys() == api_keys(0), "the first page", 30, every=0.2, retry_on=(Exception,))
    assert browser.find_element(By.ID, "dlq-page").text == "rows 1–50"
    assert not browser.find_element(By.ID, "dlq-prev").is_enabled()
    # Mark the first row: a redraw would replace it with a new, unmarked element.
    browser.execute_script("document.querySelector('#dlq tbody tr').dataset.marked = 'yes'")
    wait_detail_polls(browser, 2)
    assert browser.execute_script("return document.querySelector('#dlq tbody tr').dataset.marked") == "yes"

    browser.find_element(By.ID, "dlq-next").click()
    wait_for(lambda: keys() == api_keys(50), "the second page", 10, every=0.2, retry_on=(Exception,))
    browser.find_element(By.ID, "dlq-next").click()
    wait_for(lambda: keys() == api_keys(100), "the last page", 10, every=0.2, retry_on=(Exception,))
    assert len(keys()) == DEAD_LETTERS - 100
    assert browser.find_element(By.ID, "dlq-page").text == "rows 101–130 (the last page)"
    assert not browser.find_element(By.ID, "dlq-next").is_enabled()
    browser.find_element(By.ID, "dlq-prev").click()
    wait_for(lambda: keys() == api_keys(50), "the second page again", 10, every=0.2, retry_on=(Exception,))


def test_application_log_keeps_the_readers_place_and_follows_only_at_the_bottom(failed, browser):
    from selenium.webdriver.common.by import By

    open_console(browser, failed)
    box = browser.find_element(By.ID, "app-log")
    wait_for(
        lambda: "then failing on purpose" in box.text,
        "the application log",
        30,
        every=0.2,
        retry_on=(Exception,),
    )

    def scroll() -> dict:
        return browser.execute_script(
            "const b = document.getElementById('app-log');"
            "return {top: b.scrollTop, max: b.scrollHeight - b.clientHeight};"
        )

    assert scroll()["max"] > 100  # the pane scrolls: more lines than it shows
    wait_for(
        lambda: scroll()["top"] >= scroll()["max"] - 8,
        "the pane opened at its newest lines",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    browser.execute_script("document.getElementById('app-log').scrollTop = 40")  # read older lines
    log_file = Path(failed["data_dir"]) / "logs" / "fn_fail.log"
    with log_file.open("a") as f:
        f.write("2026-01-01T00:00:00.000Z [INFO] fn_fail 0:1 doc-x a line written while reading older ones\n")
    wait_for(
        lambda: "while reading older ones" in box.get_attribute("textContent"),
        "the new line",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    assert scroll()["top"] == 40  # the reader's place is kept when new lines come
    wait_detail_polls(browser, 2)
    assert scroll()["top"] == 40  # and when none do

    browser.execute_script("const b = document.getElementById('app-log'); b.scrollTop = b.scrollHeight")
    with log_file.open("a") as f:
        f.write("2026-01-01T00:00:01.000Z [INFO] fn_fail 0:2 doc-y a line written while following\n")
    wait_for(
        lambda: "while following" in box.get_attribute("textContent"),
        "the next line",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    wait_for(
        lambda: scroll()["top"] >= scroll()["max"] - 8,
        "the pane to follow the new line",
        10,
        every=0.2,
        retry_on=(Exception,),
    )


def test_a_function_without_a_log_is_asked_without_errors(failed, browser):
    from selenium.webdriver.common.by import By

    assert failed["api"].get("/getAppLog?name=fn_quiet").text == ""
    browser.get_log("browser")  # drop what earlier tests left
    open_console(browser, failed, function="fn_quiet")
    wait_for(
        lambda: "no log lines yet" in browser.find_element(By.ID, "app-log").text,
        "the empty log",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    wait_detail_polls(browser, 2)
    failed_requests = [e["message"] for e in browser.get_log("browser") if "getAppLog" in e["message"]]
    assert failed_requests == []


def test_a_read_only_token_sees_no_state_changing_controls(failed, browser):
    from selenium.webdriver.common.by import By

    def shown(css: str) -> list[bool]:
        return [e.is_displayed() for e in browser.find_elements(By.CSS_SELECTOR, css)]

    open_console(browser, failed, token=READ_TOKEN)
    wait_for(
        lambda: "read-only" in browser.find_element(By.ID, "connection").text,
        "the read-only role",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#dlq tbody tr button"),
        "the dead letters",
        30,
        every=0.2,
        retry_on=(Exception,),
    )
    assert shown("tr[data-function] button[data-action]") and not any(
        shown("tr[data-function] button[data-action]")
    )
    assert not any(shown("#dlq-replay-all, #dlq-purge-all, #dlq-purge-replayed, #rebalance-start"))
    assert shown("#dlq tbody tr button") and not any(shown("#dlq tbody tr button.admin-only"))
    assert all(shown("#rebalance-plan")) and all(shown("#dlq tbody tr button:not(.admin-only)"))  # reads stay

    use_token(browser, TOKEN)
    wait_for(
        lambda: all(shown("tr[data-function] button[data-action]")),
        "the lifecycle buttons for the admin",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    assert all(shown("#dlq-replay-all, #dlq-purge-all, #rebalance-start"))


def test_no_token_and_a_wrong_token_get_different_messages(failed, browser):
    from selenium.webdriver.common.by import By

    open_console(browser, failed)
    connection = browser.find_element(By.ID, "connection")
    use_token(browser, "")
    wait_for(
        lambda: connection.text.startswith("needs a token"),
        "the no-token message",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    use_token(browser, "not-a-token-of-this-server")
    wait_for(
        lambda: connection.text.startswith("token not accepted"),
        "the wrong-token message",
        10,
        every=0.2,
        retry_on=(Exception,),
    )
    use_token(browser, TOKEN)
    wait_for(
        lambda: "functions" in connection.text, "the connection again", 10, every=0.2, retry_on=(Exception,)
    )
