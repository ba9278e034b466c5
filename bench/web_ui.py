#!/usr/bin/env python3
"""Benchmark: the web UI's bag page on a 100,000-job bag, and what open pages cost the daemon.

Starts real daemons (local driver) and Debian's headless chromium driven by selenium
through chromium-driver (as tests/integration/test_web_ui.py does), logs in through the
login form, then:

1. Time to first render: submits a 100,000-job bag (a parameter product) to a quiet
   daemon (VMs take an hour to boot, so no job runs), and loads /ui/bags/<id> 5 times.
   A script installed before each navigation (DevTools' addScriptToEvaluateOnNewDocument,
   so the page's Content-Security-Policy does not apply to it) watches the DOM and notes
   `performance.now()` (milliseconds since the navigation started) the first time the
   page shows the bag's progress text and a row of its first page of jobs. Prints the
   median (and the range) of the 5 loads, and the page weight: the bytes of the HTML,
   JS, CSS and favicon the page loads (the files under controller/web/static/ that
   bag.html references, and the modules they import), beside what the browser itself
   counted for the document and its resources, and the JSON of the first API answers;
   and the weight of every page the same way (the charts' pages load uPlot, 50 KiB).
2. The daemon's extra CPU with 5 pages open: on a second daemon whose bag keeps running
   (16 jobs of `sleep 600` at a time, so no job ends during the measurement), the
   daemon process's CPU seconds (utime + stime from /proc/<pid>/stat) over 30 s with no
   page open, then over 30 s with 5 browser windows on the bag's page (each polls the
   API every 2 s; the requests each window made are counted to show they all polled).

No targets were given (issue 16 asks for the figures): the target column says "—".
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import Daemon, wait_until

STATIC = Path(__file__).resolve().parent.parent / "controller" / "web" / "static"
TOKEN = "bench"
N = 100_000
LOADS = 5
PAGES = 5
WINDOW_S = 30.0

QUIET_CONFIG = """
[api]
port = 0
token = "bench"
[scheduler]
max_vms = 8
[driver]
name = "local"
boot_delay_s = 3600.0
"""

RUNNING_CONFIG = """
[api]
port = 0
token = "bench"
[scheduler]
max_vms = 2
[driver]
name = "local"
boot_delay_s = 0.2
[[vm_types]]
name = "local-8"
cpus = 8
memory_gb = 32.0
spot_price_per_hour = 0.11
on_demand_price_per_hour = 0.384
"""

# Run before any of the page's own scripts, on every new document: note when the page
# first shows the bag's progress and a row of jobs (ms since the navigation started).
RENDER_WATCH = """
window.__rendered = null;
new MutationObserver((_, observer) => {
  const text = document.getElementById("progress-text");
  if (text && text.textContent && document.querySelector("#jobs tbody tr")) {
    window.__rendered = performance.now();
    observer.disconnect();
  }
}).observe(document, {childList: true, subtree: true, characterData: true});
"""

JOBS_ROWS = "return document.querySelectorAll('#jobs tbody tr').length;"


def new_browser() -> Any:
    """Headless chromium through chromium-driver, like the browser tests."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for program in ("chromium", "chromedriver"):
        if shutil.which(program) is None:
            sys.exit(f"{program} is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root otherwise
    driver = webdriver.Chrome(
        options=options, service=Service(shutil.which("chromedriver") or "chromedriver")
    )
    driver.set_page_load_timeout(60)
    return driver


def log_in(browser: Any, url: str) -> None:
    """Through the login form, as a person would; waits for the bags page it leads to."""
    from selenium.webdriver.common.by import By

    browser.get(url + "/ui/login")
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait_until(lambda: browser.current_url.endswith("/ui/bags"), 30, what="the bags page")


PAGES_WEIGHED = ("bags", "bag", "timeline", "fleet", "money", "market")


def referenced_assets(page: str = "bag") -> list[Path]:
    """<page>.html in its shell (shell.html, header.html) and the static files they load:
    their links and scripts, and the scripts' imports."""
    pattern = re.compile(r'(?:href|src)="/ui/static/([^"]+)"|from "/ui/static/([^"]+)"')
    found: list[Path] = []
    todo = [STATIC / "header.html", STATIC / "shell.html", STATIC / f"{page}.html"]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.append(path)
        if path.suffix in (".html", ".js", ".css"):
            for match in pattern.finditer(path.read_text()):
                todo.append(STATIC / (match.group(1) or match.group(2)))
    return found


BROWSER_BYTES = """
const navigation = performance.getEntriesByType("navigation")[0];
const resources = performance.getEntriesByType("resource");
const api = resources.filter((r) => r.name.includes("/v1/"));
const assets = resources.filter((r) => !r.name.includes("/v1/"));
const sum = (entries) => entries.reduce((n, r) => n + r.decodedBodySize, 0);
return [navigation.decodedBodySize + sum(assets), assets.length + 1, sum(api), api.length];
"""


def first_render(url: str, bag_id: str) -> tuple[list[float], tuple[int, int, int, int]]:
    """ms to the first render of the bag's page, for each of LOADS loads."""
    browser = new_browser()
    try:
        log_in(browser, url)
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RENDER_WATCH})
        times = []
        for _ in range(LOADS):
            browser.get("about:blank")
            browser.get(f"{url}/ui/bags/{bag_id}")
            rendered = wait_until(
                lambda: browser.execute_script("return window.__rendered;"),
                120,
                0.05,
                "the bag's page to render",
            )
            times.append(float(rendered))  # type: ignore[arg-type]
            assert browser.execute_script(JOBS_ROWS) > 0
        # The last load's own count, after the first answers are in (no poll yet at 2 s).
        counted = browser.execute_script(BROWSER_BYTES)
        return times, tuple(counted)  # type: ignore[return-value]
    finally:
        browser.quit()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_over(pid: int, seconds: float) -> float:
    before = cpu_s(pid)
    time.sleep(seconds)
    return cpu_s(pid) - before


def cpu_with_pages(
    daemon: Daemon, url: str, bag_id: str
) -> tuple[float, float, list[int], list[str]]:
    """(CPU s with no page, CPU s with PAGES pages, requests per page, their visibility)."""
    pid = daemon.process.pid  # type: ignore[union-attr]
    idle = cpu_over(pid, WINDOW_S)
    browser = new_browser()
    try:
        log_in(browser, url)
        handles = [browser.current_window_handle]
        for _ in range(PAGES - 1):
            browser.switch_to.new_window("window")  # windows, not tabs: none is hidden
            handles.append(browser.current_window_handle)
        for handle in handles:
            browser.switch_to.window(handle)
            browser.get(f"{url}/ui/bags/{bag_id}")
            wait_until(lambda: browser.execute_script(JOBS_ROWS) > 0, 60, what="the bag's page")
        time.sleep(2.0)  # every page in its polling rhythm
        for handle in handles:
            browser.switch_to.window(handle)
            browser.execute_script("performance.clearResourceTimings();")
        with_pages = cpu_over(pid, WINDOW_S)
        requests, visibility = [], []
        for handle in handles:
            browser.switch_to.window(handle)
            requests.append(
                browser.execute_script(
                    "return performance.getEntriesByType('resource')"
                    ".filter((r) => r.name.includes('/v1/')).length;"
                )
            )
            visibility.append(browser.execute_script("return document.visibilityState;"))
    finally:
        browser.quit()
    return idle, with_pages, requests, visibility


def bag_spec(command: str) -> dict[str, Any]:
    return {
        "name": "web-bench",
        "account": "bench",
        "command": command,
        "max_runtime_s": 3600,
        "resources": {"cpus": 1, "memory_gb": 0.5},
        "parameters": {"a": {"range": [0, 100]}, "b": {"range": [0, 1000]}},
    }


def started(config: str, tmp: str) -> tuple[Daemon, Any]:
    state = Path(tmp)
    (state / "spotbag.toml").write_text(config)
    daemon = Daemon(state, state / "spotbag.toml", TOKEN)
    client = daemon.start()
    client.timeout_s = 600
    return daemon, client


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-web-") as tmp:
        daemon, client = started(QUIET_CONFIG, tmp)
        try:
            bag = client.submit(bag_spec("true {a} {b}"))
            assert client.bag(bag["id"])["job_count"] == N
            render_ms, counted = first_render(client.url, bag["id"])
        finally:
            daemon.stop()

    with tempfile.TemporaryDirectory(prefix="spotbag-bench-web-running-") as tmp:
        daemon, client = started(RUNNING_CONFIG, tmp)
        try:
            bag = client.submit(bag_spec("sleep 600"))
            wait_until(
                lambda: client.bag(bag["id"])["counts"].get("running", 0) >= 16,
                120,
                what="16 jobs running",
            )
            time.sleep(5.0)  # VMs up, jobs started: the daemon in its steady state
            idle_s, pages_s, requests, visibility = cpu_with_pages(daemon, client.url, bag["id"])
            running = client.bag(bag["id"])["counts"].get("running", 0)
            client.cancel(bag["id"])
        finally:
            daemon.stop()

    assets = referenced_assets()
    weight = sum(p.stat().st_size for p in assets)
    names = ", ".join(f"{p.name} {p.stat().st_size / 1024:.1f}" for p in assets)
    browser_bytes, browser_files, api_bytes, api_requests = counted
    print(
        f"first render of a {N:,}-job bag's page (progress and first page of jobs), "
        f"median of {LOADS} loads: {statistics.median(render_ms):.0f} ms "
        f"(range {min(render_ms):.0f}-{max(render_ms):.0f} ms)  (target —)"
    )
    print(
        f"page weight: {weight / 1024:.1f} KiB in {len(assets)} files ({names} KiB); "
        f"the browser counted {browser_bytes / 1024:.1f} KiB in {browser_files} files "
        f"(the favicon aside) and {api_bytes / 1024:.1f} KiB of JSON in {api_requests} "
        f"API answers  (target —)"
    )
    weights = []
    for page in PAGES_WEIGHED:
        files = referenced_assets(page)
        weights.append(f"{page} {sum(p.stat().st_size for p in files) / 1024:.1f} ({len(files)})")
    print(f"every page's weight, KiB (files): {', '.join(weights)}  (target —)")
    extra = pages_s - idle_s
    print(
        f"daemon CPU over {WINDOW_S:.0f} s on a running bag ({running} jobs running): "
        f"{idle_s:.2f} s with no page open, {pages_s:.2f} s with {PAGES} pages open "
        f"({sum(requests)} API requests, {min(requests)}-{max(requests)} per page, "
        f"{'/'.join(sorted(set(visibility)))}); extra: {extra:.2f} s = "
        f"{100 * extra / WINDOW_S:.1f} % of one core  (target —)"
    )


if __name__ == "__main__":
    main()
