"""The web console in a real headless Chromium (Debian's chromium + chromedriver, driven by selenium)
against a running service: `eventing run` in follow mode and `eventing serve`, each its own process,
while a loader keeps writing. The page shows the function's counters moving, pauses and resumes it from
its buttons, and a screenshot is saved; the ledger then shows nothing lost or handled twice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from eventing.ops.verify import verify_function
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket, chunked
from eventing.testing import BackgroundLoop, deploy_function, ledger_definition, load_source

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "console-admin-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("chromium and chromium-driver are not installed (scripts/setup.sh installs them as root)",
                allow_module_level=True)


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


def eventing(data_dir: str, *args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVENTING_ADMIN_TOKEN": TOKEN, "EVENTING_READ_TOKEN": ""}
    return subprocess.Popen([sys.executable, "-m", "eventing", "--data-dir", data_dir, *args],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the service checkpoints and stops
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - a page or server still starting; try again
            last = exc
        else:
            if value:
                return value
            last = value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1700", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(tmp_path / "chromium", ignore_errors=True)


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
        wait_for(lambda: api.get("/api/v1/status").json()["services"], 60, "the service and the API")
        with Loader(data_dir):
            browser.get(base + "/")
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            browser.find_element(By.ID, "token-save").click()
            row = 'tr[data-function="fn_live"]'

            def cell(name: str) -> str:
                return browser.find_element(By.CSS_SELECTOR, f"{row} td.{name}").text

            def seen() -> int:
                return int(cell("seen").replace(",", "") or 0)

            wait_for(lambda: cell("state") == "deployed", 30, "the function row")
            first = wait_for(seen, 30, "a first count")
            wait_for(lambda: seen() > first, 30, "the seen counter to move")
            moved = seen()
            wait_for(lambda: seen() > moved, 30, "the seen counter to move again")
            # Legal buttons only: a deployed function offers pause and undeploy, not resume or deploy.
            actions = [b.get_attribute("data-action") for b in browser.find_elements(By.CSS_SELECTOR, f"{row} button")]
            assert actions == ["pause", "undeploy"]

            browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="pause"]').click()
            wait_for(lambda: cell("state") == "paused", 60, "the paused state")
            actions = [b.get_attribute("data-action") for b in browser.find_elements(By.CSS_SELECTOR, f"{row} button")]
            assert actions == ["resume", "undeploy"]
            assert api.get("/api/v1/status/fn_live").json()["apps"][0]["composite_status"] == "paused"
            paused_at = seen()
            time.sleep(2.5)
            assert seen() == paused_at  # paused: nothing handled while the loader keeps writing
            wait_for(lambda: int(cell("backlog").replace(",", "") or 0) > 0, 30, "a backlog while paused")

            browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="resume"]').click()
            wait_for(lambda: cell("state") == "deployed", 30, "the deployed state")
            wait_for(lambda: seen() > paused_at, 30, "the counter to move after resume")
            # The detail panel: vBucket map legend by worker, checkpoints, and the charts drawn.
            wait_for(lambda: "vBuckets" in browser.find_element(By.ID, "vbmap-legend").text, 30, "the vBucket map")
            legend = browser.find_element(By.ID, "vbmap-legend").text
            assert "local/w0: 512 vBuckets" in legend and "local/w1: 512 vBuckets" in legend
            assert len(browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr")) == 32
            time.sleep(1.5)
            shot = tmp_path / "console.png"
            assert browser.save_screenshot(str(shot))
            assert shot.stat().st_size > 20_000
            print(f"console screenshot: {shot}")
        # The loader stopped: let the service catch up, then count through the ledger.
        wait_for(lambda: api.get("/api/v1/functions/fn_live/stats").json()["checkpoint_lag"] == 0, 90, "catch-up")
    finally:
        api.close()
        stop(serve)
        stop(run)
    report = verify_function(data_dir, "fn_live")
    assert report.ok, report.summary()
