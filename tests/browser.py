"""Headless Chromium for the suite: the browser, pages on a second origin, scripts run in a page.

Debian's ``chromium`` and ``chromium-driver`` (``make browser-packages``,
part of ``make test``), driven through selenium. The suite starts chromium
itself, in a process group of its own with a fresh profile, and chromedriver
attaches to it (``debuggerAddress``): both are then processes the suite
started, and both are stopped by their pids however a test ends (chromium's
helpers by its group), where a chromium launched by chromedriver would be a
pid the suite never held. This machine has no network: the flags turn off
what chromium would otherwise reach out for on its own (updates, sync,
field trials, QUIC), so that the only requests a test sees are its own.

``PageServer`` serves a directory on a port of its own: its origin
(``http://127.0.0.1:<port>``) is not Jetway's, and ``origin_as("localhost")``
names the same files under a third origin. ``Browser.run`` runs the body of
an async JavaScript function in the current page and returns what it
returns; ``Browser.fetch`` is ``fetch()`` from inside the page, answered as
the page sees it (what a cross-origin read may not see is not there).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.support import ROOT, stop_process, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Generous: two cores are shared with other test runs and benchmarks.
START_TIMEOUT = 60.0
SCRIPT_TIMEOUT = 60.0
FLAGS = (
    "--headless=new",
    "--no-sandbox",  # runs as root here
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # /dev/shm may be small in a container
    "--window-size=1280,1600",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # chromium picks it and writes it to DevToolsActivePort
)

# The wrapper run by ``Browser.run``: the body is an async function's, and an
# exception comes back as data rather than as a WebDriver timeout.
_RUN = """
const done = arguments[arguments.length - 1];
const args = Array.prototype.slice.call(arguments, 0, -1);
(async function () { %s }).apply(null, args).then(
  (value) => done({value: value === undefined ? null : value}),
  (error) => done({error: String(error && error.stack || error)}));
"""
# Installed in every document before its own scripts run (DevTools' scripts
# are not subject to the page's policy): what the Content-Security-Policy refused.
_WATCH_POLICY = """
window.__policyViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__policyViolations.push(event.effectiveDirective + " refused " + (event.blockedURI || "inline"));
});
"""
_FETCH = """
const [url, init] = arguments;
let response;
try {
  response = await fetch(url, init);
} catch (error) {
  return {error: String(error)};
}
const headers = {};
response.headers.forEach((value, name) => { headers[name] = value; });
return {status: response.status, type: response.type, headers, body: await response.text()};
"""


def process_group(pgid: int) -> List[int]:
    """The live (not zombie) processes of group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            state, _parent, group = stat[stat.rindex(")") + 2 :].split()[:3]
            if int(group) == pgid and state != "Z":
                members.append(int(entry.name))
    return members


class PageScriptError(AssertionError):
    """A script run in the page threw; the message is its error and stack."""


def missing_browser() -> Optional[str]:
    """What is missing to run the browser tests, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: run `make browser-packages` (Debian's chromium and chromium-driver)"
    return None


@dataclass(frozen=True)
class Fetched:
    """A ``fetch()`` as the page saw it: ``error`` is set when it rejected (a network or CORS failure)."""

    status: int = 0
    type: str = ""
    headers: Dict[str, str] = field(default_factory=dict)
    body: str = ""
    error: Optional[str] = None

    def json(self) -> Any:
        return json.loads(self.body)


class PageServer:
    """``tests/page_server.py`` on a directory of pages, as a process stopped by its pid."""

    def __init__(self, directory: Path, log_path: Path) -> None:
        self.directory = directory
        self.log_path = log_path
        self.port = 0
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> PageServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.page_server", str(self.directory)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()  # "port N" once it listens
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the page server did not start (log: {self.log_path})")
        self.port = int(line.split()[1])
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            assert self.process.stdout is not None
            self.process.stdout.close()
            self.process = None

    @property
    def origin(self) -> str:
        return self.origin_as("127.0.0.1")

    def origin_as(self, host: str) -> str:
        """The same server under another host name: another origin (``localhost``)."""
        return f"http://{host}:{self.port}"

    def add(self, name: str, html: str) -> str:
        """Write a page and return its URL on this server's origin."""
        (self.directory / name).write_text(html)
        return f"{self.origin}/{name}"


class Browser:
    """Headless Chromium with chromedriver attached, both started and stopped here."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.chromium: Optional[subprocess.Popen] = None
        self.service: Optional[Service] = None
        self._driver: Optional[WebDriver] = None

    @property
    def driver(self) -> WebDriver:
        assert self._driver is not None, "the browser is not started"
        return self._driver

    def start(self) -> Browser:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        profile = Path(tempfile.mkdtemp(prefix="profile-", dir=self.directory))
        with open(self.directory / "chromium.log", "ab") as log:
            self.chromium = subprocess.Popen(
                [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its helpers in a group of its own, stopped with it
            )
        port_file = profile / "DevToolsActivePort"
        log = self.directory / "chromium.log"
        wait_until(lambda: self.chromium.poll() is not None or port_file.read_text().strip(), START_TIMEOUT, str(log))
        if self.chromium.poll() is not None:
            raise RuntimeError(f"chromium exited with {self.chromium.returncode}; see {log}")
        port = port_file.read_text().split()[0]
        options = webdriver.ChromeOptions()
        options.debugger_address = f"127.0.0.1:{port}"
        # Chromium's console and the DevTools network events, for get_log().
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        # Warnings only: at INFO chromedriver logs every command with its
        # arguments, a token typed into a page among them (conftest's
        # no_token_in_any_log reads every *.log the suite leaves).
        self.service = Service(
            CHROMEDRIVER, service_args=["--log-level=WARNING"], log_output=str(self.directory / "chromedriver.log")
        )
        self._driver = webdriver.Chrome(service=self.service, options=options)
        self._driver.set_script_timeout(SCRIPT_TIMEOUT)
        self._driver.set_page_load_timeout(SCRIPT_TIMEOUT)
        self._driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _WATCH_POLICY})

    def stop(self) -> None:
        """chromedriver, then chromium and whatever is left in its process group."""
        if self._driver is not None:
            # Ends the session and chromedriver (an attached browser stays); if
            # chromedriver does not answer, it is stopped by its pid below all the same.
            with contextlib.suppress(Exception):
                self._driver.quit()
            self._driver = None
        if self.service is not None and self.service.process is not None:
            stop_process(self.service.process)
            self.service = None
        if self.chromium is not None:
            stop_process(self.chromium)
            if process_group(self.chromium.pid):
                os.killpg(self.chromium.pid, signal.SIGKILL)  # helpers that outlived it
                wait_until(lambda: not process_group(self.chromium.pid), 10, "chromium's helpers to exit")
            self.chromium = None

    def open(self, url: str) -> None:
        """Load ``url`` in the tab and wait for its load event."""
        self.driver.get(url)

    def run(self, body: str, *args: Any) -> Any:
        """Run ``body`` as an async function in the page, with ``args`` as ``arguments``; its return value."""
        outcome = self.driver.execute_async_script(_RUN % body, *args)
        if "error" in outcome:
            raise PageScriptError(outcome["error"])
        return outcome["value"]

    def fetch(self, url: str, **init: Any) -> Fetched:
        """``fetch(url, init)`` from inside the page: what the page can read of the answer."""
        return Fetched(**self.run(_FETCH, url, init))

    def wait_for(self, css: str, timeout: float = SCRIPT_TIMEOUT) -> WebElement:
        """The first element matching ``css`` once it is shown (pages that render by script)."""
        return WebDriverWait(self.driver, timeout).until(
            expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css)), f"{css} never shown"
        )

    def screenshot(self, path: Path, css: str = "body", max_height: float = 20000) -> None:
        """A PNG of the element matching ``css``, however far it runs past the window (to ``max_height``)."""
        box = self.driver.execute_script(
            "const box = document.querySelector(arguments[0]).getBoundingClientRect();"
            "return {x: box.left + scrollX, y: box.top + scrollY, width: box.width, height: box.height};",
            css,
        )
        clip = {**box, "height": min(box["height"], max_height), "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}
        )
        path.write_bytes(base64.b64decode(shot["data"]))

    def policy_violations(self) -> List[str]:
        """What the current page's Content-Security-Policy refused, as the page's own events said."""
        return self.driver.execute_script("return window.__policyViolations || []")

    def requested_urls(self) -> List[str]:
        """Every URL the browser asked the network for since the last call (DevTools' own record)."""
        urls = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                urls.append(message["params"]["request"]["url"])
        return urls

    def console_errors(self) -> List[str]:
        """The console's errors since the last call (a refused load, a policy violation, an exception)."""
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def reset(self) -> None:
        """A blank tab with no cache, cookies or storage, and the logs emptied: what each test starts from."""
        self.driver.get("about:blank")
        self.driver.execute_cdp_cmd("Network.clearBrowserCache", {})
        self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
        self.driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": "*", "storageTypes": "all"})
        self.requested_urls()
        self.console_errors()
