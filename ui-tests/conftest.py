"""Fixtures of the dashboard's browser tests: a three-node dev cluster started with
--ui-actions, a one-node cluster without it (read-only), and one headless Chromium
driven by Selenium through the system chromedriver (nothing downloaded).

Environment: ROTA_BIN (the rota CLI; it starts rota-node from ROTA_NODE_BIN or beside
itself), ROTA_TEST_DIR (where the clusters live; default a temporary directory),
ROTA_UI_SCREENSHOTS (default docs/screenshots), ROTA_UI_ASSETS=tree to serve
raft-node/ui from the work tree through ui-tests/uiproxy.py instead of the files
compiled into rota-node (for working on the dashboard without rebuilding the node),
CHROMIUM / CHROMEDRIVER (default /usr/bin/chromium, /usr/bin/chromedriver).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Callable

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
UI_DIR = os.path.join(REPO, "raft-node", "ui")
ROTA_BIN = os.environ.get("ROTA_BIN", os.path.expanduser("~/.cache/rota/target/debug/rota"))
TREE_ASSETS = os.environ.get("ROTA_UI_ASSETS", "node") == "tree"
SHOTS = os.environ.get("ROTA_UI_SCREENSHOTS", os.path.join(REPO, "docs", "screenshots"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
WIDTH, HEIGHT = 1280, 800


# ---------------------------------------------------------------- the API


class Api:
    """A tiny JSON client for one node."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw = e.read()
            status = e.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        assert status == 200, f"GET {path}: {status} {body}"
        return body

    def write(self, method: str, path: str, body: Any) -> Any:
        for attempt in range(20):
            status, answer = self.request(method, path, body)
            if status == 503:
                time.sleep(0.25)
                continue
            assert status == 200, f"{method} {path}: {status} {answer}"
            assert "errors" not in (answer or {}), f"{method} {path}: {answer}"
            return answer
        raise AssertionError(f"{method} {path}: still 503")

    # the job API, as a worker would use it
    def add(self, group: str, adds: list[dict[str, Any]], client: int = 11) -> list[dict[str, Any]]:
        return self.write("POST", "/update", {"clientid": client, "adds": [{"group": group, **a} for a in adds]})["tasks"]

    def claim(self, group: str, client: int = 12, duration: int = 60000) -> dict[str, Any] | None:
        tasks = self.write("POST", "/claim", {"clientid": client, "group": group, "duration": duration})["tasks"]
        return tasks[0] if tasks else None

    def fail(self, task: dict[str, Any], error: str, client: int = 12, retry_in_ms: int | None = None) -> None:
        body: dict[str, Any] = {"clientid": client, "id": task["id"], "error": error}
        if retry_in_ms is not None:
            body["retry_in_ms"] = retry_in_ms
        self.write("POST", "/fail", body)

    def finish(self, task: dict[str, Any], result: Any, client: int = 12) -> None:
        self.write("POST", "/finish", {"clientid": client, "id": task["id"], "result": result})

    def stats(self, group: str) -> dict[str, Any]:
        return self.get(f"/groups/{group}/stats")

    def job(self, group: str, key: str) -> dict[str, Any]:
        return self.get(f"/job?group={urllib.parse.quote(group)}&key={urllib.parse.quote(key)}")


import urllib.parse  # noqa: E402  (used by Api.job)


TIMINGS: list[str] = []


def timing(what: str, seconds: float) -> None:
    """A measurement worth seeing in the summary (leader shown after a kill, and so on)."""
    TIMINGS.append(f"{what}: {seconds:.2f} s")


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if TIMINGS:
        terminalreporter.write_sep("-", "ui timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)


def wait_until(what: str, check: Callable[[], Any], timeout: float = 10, interval: float = 0.1) -> Any:
    """Polls `check` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - keep polling through transient failures
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


# ---------------------------------------------------------------- clusters


class Cluster:
    def __init__(self, directory: str, nodes: int, node_args: list[str]) -> None:
        self.dir = directory
        self.node_args = node_args
        self.urls = self._up(nodes)
        with open(os.path.join(directory, "cluster.json")) as f:
            layout = json.load(f)
        self.by_id = {n["id"]: f"http://127.0.0.1:{n['api_port']}" for n in layout["nodes"]}
        self.proxies: dict[str, Any] = {}
        for url in self.urls:
            wait_until(f"{url} ready", lambda url=url: Api(url).request("GET", "/ready")[0] == 200, timeout=30)

    def _up(self, nodes: int) -> list[str]:
        cmd = [ROTA_BIN, "dev", "up", "--nodes", str(nodes), "--dir", self.dir] + [f"--node-arg={a}" for a in self.node_args]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
        return [line.strip() for line in out.splitlines() if line.strip().startswith("http")]

    def restart_stopped(self) -> None:
        self._up(len(self.by_id))

    def api(self, node_id: int | None = None) -> Api:
        return Api(self.by_id[node_id] if node_id else self.urls[0])

    def leader(self) -> int:
        def known() -> int | None:
            for url in self.by_id.values():
                status, body = Api(url).request("GET", "/cluster", timeout=2)
                if status == 200 and body.get("leader"):
                    return int(body["leader"])
            return None

        return wait_until("a leader", known, timeout=15)

    def pid(self, node_id: int) -> int:
        with open(os.path.join(self.dir, f"node-{node_id}.pid")) as f:
            return int(f.read().strip())

    def ui(self, node_id: int | None = None) -> str:
        """The base URL the browser opens for this node's dashboard (no trailing slash)."""
        url = self.by_id[node_id] if node_id else self.urls[0]
        if not TREE_ASSETS:
            return url
        if url not in self.proxies:
            from uiproxy import Proxy

            self.proxies[url] = Proxy(url)
        return self.proxies[url].url

    def down(self) -> None:
        for p in self.proxies.values():
            p.close()
        subprocess.run([ROTA_BIN, "dev", "down", "--dir", self.dir], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def workdir():
    base = os.environ.get("ROTA_TEST_DIR")
    if base:
        os.makedirs(base, exist_ok=True)
        yield base
    else:
        d = tempfile.mkdtemp(prefix="rota-ui-")
        yield d
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(workdir):
    c = Cluster(os.path.join(workdir, "actions"), 3, ["--ui-actions"])
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="session")
def ro_cluster(workdir):
    c = Cluster(os.path.join(workdir, "readonly"), 1, [])
    try:
        yield c
    finally:
        c.down()


# ---------------------------------------------------------------- the browser


@pytest.fixture(scope="session")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never download
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={WIDTH},{HEIGHT}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    # For scripts/test-ui to stop the driver and its browser should pytest die.
    pidfile = os.environ.get("ROTA_UI_DRIVER_PIDFILE")
    if pidfile and d.service.process:
        with open(pidfile, "w") as f:
            f.write(str(d.service.process.pid))
    d.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
    d.set_page_load_timeout(30)
    try:
        yield d
    finally:
        d.quit()


class Browser:
    """The driver plus what the tests need: open a page, wait, read the console, screenshot."""

    def __init__(self, driver: Any) -> None:
        self.d = driver
        self.allowed: list[str] = []
        self.seen: list[dict[str, Any]] = []

    def open(self, base: str, fragment: str) -> None:
        self.d.get(f"{base}/ui/#{fragment}")
        wait_until("the app to render", lambda: self.d.execute_script("return !!document.querySelector('.shell main')"), timeout=10)

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def find(self, css: str):
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str):
        from selenium.webdriver.common.by import By

        return self.d.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str | None:
        els = self.find_all(css)
        return els[0].text if els else None

    def wait_text(self, css: str, expect: Callable[[str], bool] | str, timeout: float = 10) -> str:
        pred = expect if callable(expect) else (lambda t: t == expect)
        return wait_until(f"{css} text", lambda: (lambda t: t if t is not None and pred(t) else None)(self.text(css)), timeout)

    def click(self, css: str) -> None:
        el = wait_until(f"{css} to be clickable", lambda: next((e for e in self.find_all(css) if e.is_displayed() and e.is_enabled()), None))
        el.click()

    def confirm(self) -> None:
        """Accepts the page's confirmation dialog."""
        self.click("#confirm-dialog #confirm-yes")
        wait_until("the dialog to close", lambda: not self.find_all("#confirm-dialog"), timeout=5)

    def console(self) -> list[dict[str, Any]]:
        entries = self.d.get_log("browser")
        self.seen.extend(entries)
        return entries

    def screenshot(self, name: str, scroll_to: str | None = None) -> str:
        os.makedirs(SHOTS, exist_ok=True)
        path = os.path.join(SHOTS, f"{name}.png")
        if scroll_to:
            self.js("document.querySelector(arguments[0]).scrollIntoView({block: 'start'})", scroll_to)
        else:
            self.js("window.scrollTo(0, 0)")
        time.sleep(0.3)
        self.d.save_screenshot(path)
        return path


def severe(entries: list[dict[str, Any]], allowed: list[str]) -> list[str]:
    return [
        e["message"]
        for e in entries
        if e.get("level") == "SEVERE" and not any(a in e["message"] for a in allowed)
    ]


@pytest.fixture
def browser(driver):
    """A browser page; the test fails if the console showed an error (CSP violations,
    uncaught exceptions, failed requests) other than those the test allows."""
    b = Browser(driver)
    driver.get("about:blank")
    b.console()  # drop what earlier tests left
    b.seen = []
    yield b
    b.console()
    errors = severe(b.seen, b.allowed)
    assert not errors, "browser console errors:\n" + "\n".join(errors)
