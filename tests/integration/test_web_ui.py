"""The web UI in a real browser (issue 16): Debian's chromium, headless, driven by
selenium through chromium-driver, against a real daemon. One daemon and one browser
for the module; each test starts from a browser without cookies.

Screenshots are saved under tests/artifacts/web/ (gitignored). Without chromium,
chromium-driver or selenium the module is skipped, except under CI=true (.ci/run
installs them), where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_CONFIG, REPO, Daemon, wait_for_bag, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.processes]

ARTIFACTS = REPO / "tests" / "artifacts" / "web"
TOKEN = "web-t0ken"


def browser_missing() -> str | None:
    """Why this machine cannot run the browser tests; None when it can."""
    for program, package in (("chromium", "chromium"), ("chromedriver", "chromium-driver")):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install {package})"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def require_browser() -> None:
    reason = browser_missing()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the browser tests, but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    require_browser()
    state = tmp_path_factory.mktemp("web")
    (state / "spotbag.toml").write_text(
        FAST_CONFIG.format(token=TOKEN, model="none", mttf_h=24, time_scale=1, max_vms=2)
    )
    daemon = Daemon(state, state / "spotbag.toml", TOKEN)
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root otherwise
    driver = webdriver.Chrome(
        options=options, service=Service(shutil.which("chromedriver") or "chromedriver")
    )
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def page(browser, daemon) -> Iterator[Any]:
    """The browser, logged out, on a blank page of the daemon's origin."""
    browser.get(daemon.client().url + "/ui/login")
    browser.delete_all_cookies()
    browser.get_log("browser")  # drain: a test sees the console messages of its own pages
    yield browser
    browser.delete_all_cookies()


def url_of(daemon: Daemon, path: str) -> str:
    return daemon.client().url + path


def screenshot(browser: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    browser.save_screenshot(str(path))
    return path


def log_in(browser: Any, daemon: Daemon, token: str, ok: bool = True) -> None:
    """Log in through the form; when `ok`, wait for the bags page it leads to."""
    from selenium.webdriver.common.by import By

    browser.get(url_of(daemon, "/"))
    wait_until(lambda: browser.current_url.endswith("/ui/login"), 10, what="the login page")
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    if ok:
        wait_until(lambda: browser.current_url.endswith("/ui/bags"), 10, what="the bags page")


def text_of(browser: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id).text


def click_shown(browser: Any, by: str, value: str) -> None:
    """Click an element of a page that re-renders it (a table's rows, on each refresh),
    as a user clicks what is shown: one found just before a refresh is gone by the
    click (StaleElementReferenceException), and the one shown then is clicked."""
    from selenium.common.exceptions import StaleElementReferenceException

    def click() -> bool:
        try:
            browser.find_element(by, value).click()
        except StaleElementReferenceException:
            return False
        return True

    wait_until(click, 10, 0.05, f"a click on {value}")


def open_job(browser: Any, job_id: str) -> None:
    """Click a job's row on the bag page (its log and attempts open)."""
    from selenium.webdriver.common.by import By

    click_shown(browser, By.CSS_SELECTOR, f"tr[data-job='{job_id}'] button")


def bag_spec(account: str, command: str, n: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": f"web-{account}",
        "account": account,
        "command": command,
        "parameters": {"i": {"range": [0, n]}},
        "resources": {"cpus": 1, "memory_gb": 0.5},
        "max_runtime_s": 120,
        **extra,
    }


def fetch_status(browser: Any, path: str, headers: dict[str, str]) -> int:
    """The status of a POST the page's own origin makes with `fetch` (cookies included)."""
    return browser.execute_async_script(
        "const [path, headers, done] = arguments;"
        "fetch(path, {method: 'POST', headers, credentials: 'same-origin'})"
        ".then(r => done(r.status), e => done(String(e)));",
        path,
        headers,
    )


# --- the tests ---------------------------------------------------------------------------


def test_a_bad_token_shows_a_clear_message(page, daemon):
    log_in(page, daemon, "not-a-token", ok=False)
    from selenium.webdriver.common.by import By

    alerts = wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, "[role=alert]"), 10, what="the message"
    )
    message = alerts[0].text  # type: ignore[index]
    assert "not valid" in message and "token" in message
    assert page.current_url.endswith("/ui/login")
    assert page.get_cookie("spotbag_session") is None
    screenshot(page, "login-bad-token")
    # And no page behind the login is reachable without a session.
    page.get(url_of(daemon, "/ui/bags"))
    assert page.current_url.endswith("/ui/login")


def test_progress_advances_on_the_page_without_a_reload_and_a_job_log_opens(page, daemon):
    from selenium.webdriver.common.by import By

    log_in(page, daemon, TOKEN)
    client = daemon.client()
    command = "for k in 1 2 3; do echo hello {i} line $k; sleep 0.7; done"
    bag = client.submit(bag_spec("web", command, 8))
    # The bags page lists it (by polling) without a reload.
    page.execute_script("window.notReloaded = true;")
    wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-bag='{bag['id']}']"),
        15,
        what="the new bag on the bags page",
    )
    assert page.execute_script("return window.notReloaded === true;")
    screenshot(page, "bags")

    click_shown(page, By.LINK_TEXT, bag["id"])  # the bags page refreshes its rows
    wait_until(lambda: text_of(page, "bag-id") == bag["id"], 10, what="the bag page")
    page.execute_script("window.notReloaded = true;")
    seen: list[float] = []

    def finished() -> bool:
        value = float(page.find_element(By.ID, "progress").get_attribute("value") or 0)
        if not seen or seen[-1] != value:
            seen.append(value)
        return value == 1.0

    wait_until(finished, 90, 0.1, "the page's progress to reach 100 %")
    assert seen[0] < 1.0 and len(seen) >= 2, seen  # it advanced while the page watched
    assert page.execute_script("return window.notReloaded === true;")
    assert "succeeded 8" in text_of(page, "counts")
    # No script error and no Content-Security-Policy violation on the way.
    errors = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    screenshot(page, "bag-finished")

    job_id = f"{bag['id']}-3"
    open_job(page, job_id)
    wait_until(lambda: "hello 3 line 3" in text_of(page, "log"), 15, what="the job's log")
    assert text_of(page, "job-id") == job_id
    assert page.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")
    screenshot(page, "bag-job-log")


def test_a_running_jobs_log_is_followed(page, daemon):
    from selenium.webdriver.common.by import By

    client = daemon.client()
    command = "for k in $(seq 1 12); do echo tick $k; sleep 0.5; done"
    bag = client.submit(bag_spec("web", command, 1, name="follow"))
    log_in(page, daemon, TOKEN)
    page.get(url_of(daemon, f"/ui/bags/{bag['id']}"))
    job_id = f"{bag['id']}-0"
    wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-job='{job_id}'] button"),
        10,
        what="the job's row",
    )
    open_job(page, job_id)
    page.execute_script("window.notReloaded = true;")
    seen: list[str] = []

    def complete() -> bool:
        text = text_of(page, "log")
        if "tick" in text and (not seen or seen[-1] != text):
            seen.append(text)
        return "tick 12" in text

    wait_until(complete, 30, 0.1, "the whole log")
    assert len(seen) >= 2 and "tick 12" not in seen[0], seen  # it grew on the page
    assert page.execute_script("return window.notReloaded === true;")
    assert text_of(page, "log").splitlines()[:2] == ["tick 1", "tick 2"]


def test_a_bag_is_cancelled_from_its_page(page, daemon):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    client = daemon.client()
    bag = client.submit(bag_spec("web", "sleep 60", 3, name="to-cancel"))
    log_in(page, daemon, TOKEN)
    page.get(url_of(daemon, f"/ui/bags/{bag['id']}"))
    button = wait_until(
        lambda: (b := page.find_element(By.ID, "cancel")).is_displayed() and b,
        15,
        what="the cancel button",
    )
    button.click()  # type: ignore[attr-defined]
    WebDriverWait(page, 5).until(expected_conditions.alert_is_present()).accept()
    wait_until(lambda: client.bag(bag["id"])["state"] == "cancelled", 30, what="the cancel")
    wait_until(lambda: text_of(page, "bag-state") == "cancelled", 10, what="the page to show it")
    assert not page.find_element(By.ID, "cancel").is_displayed()
    screenshot(page, "bag-cancelled")


def test_an_account_token_sees_only_its_account(page, daemon):
    from selenium.webdriver.common.by import By

    client = daemon.client()
    for account in ("alice", "bob"):
        client.create_account(account, cpu_hours=10)
    alice_token = client.create_token("alice")["token"]
    bobs = client.submit(bag_spec("bob", "true", 1))
    alices = client.submit(bag_spec("alice", "true", 1))
    log_in(page, daemon, alice_token)
    wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-bag='{alices['id']}']"),
        15,
        what="alice's bag on her bags page",
    )
    rows = page.find_elements(By.CSS_SELECTOR, "#bags tbody tr")
    assert {r.get_attribute("data-bag") for r in rows} == {alices["id"]}
    page.get(url_of(daemon, f"/ui/bags/{bobs['id']}"))
    wait_until(lambda: "may not see it" in text_of(page, "status"), 10, what="the refusal")
    assert text_of(page, "bag-id") == ""
    assert fetch_status(page, f"/v1/bags/{bobs['id']}/cancel", {}) == 403  # no CSRF token
    screenshot(page, "account-token-other-bag")


def test_a_cookie_post_needs_the_csrf_token_and_the_cookie_is_httponly(page, daemon):
    client = daemon.client()
    bag = client.submit(bag_spec("web", "sleep 60", 1, name="csrf"))
    log_in(page, daemon, TOKEN)
    cookies = {c["name"]: c for c in page.get_cookies()}
    session = cookies["spotbag_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/"
    assert not session["secure"]  # plain HTTP here; Secure only over HTTPS
    assert TOKEN not in page.current_url
    document_cookie = page.execute_script("return document.cookie;")
    assert "spotbag_session" not in document_cookie and "spotbag_csrf" in document_cookie
    path = f"/v1/bags/{bag['id']}/cancel"
    assert fetch_status(page, path, {}) == 403
    assert fetch_status(page, path, {"X-CSRF-Token": "0" * 64}) == 403
    assert client.bag(bag["id"])["cancel_requested"] is False
    csrf = cookies["spotbag_csrf"]["value"]
    assert fetch_status(page, path, {"X-CSRF-Token": csrf}) == 202
    # A request from another origin with the cookies (as a forged form would send them,
    # were SameSite not honoured) is refused even with the right token.
    cookie_header = f"spotbag_session={session['value']}"
    status, body = post(
        client.url + path, {"Cookie": cookie_header, "X-CSRF-Token": csrf, "Origin": "http://x"}
    )
    assert status == 403 and body["error"]["code"] == "csrf_failed"
    # Bearer requests are unchanged: no CSRF token needed.
    other = client.submit(bag_spec("web", "sleep 60", 1, name="bearer"))
    assert client.cancel(other["id"])["cancel_requested"] is True


def post(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=b"", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_pages_carry_the_security_headers_and_logout_ends_the_session(page, daemon):
    from selenium.webdriver.common.by import By

    for path in ("/ui/login", "/ui/static/bag.js", "/ui/static/vendor/uplot/uPlot.min.css"):
        with urllib.request.urlopen(url_of(daemon, path), timeout=30) as response:
            csp = response.headers["Content-Security-Policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert "unsafe-inline" not in csp
            assert response.headers["X-Content-Type-Options"] == "nosniff"
    # Only the allow-listed files: not the vendored library's notes, nothing outside static/.
    for path in ("/ui/static/vendor/uplot/README.md", "/ui/static/vendor/uplot/..%2F..%2Fpages.py"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url_of(daemon, path), timeout=30)
        assert refused.value.code == 404
    # The UI is not part of the documented API.
    with urllib.request.urlopen(url_of(daemon, "/openapi.json"), timeout=30) as response:
        assert not any(p == "/" or p.startswith("/ui") for p in json.load(response)["paths"])
    log_in(page, daemon, TOKEN)
    page.find_element(By.ID, "logout").click()
    wait_until(lambda: page.current_url.endswith("/ui/login"), 10, what="the login page")
    assert page.get_cookie("spotbag_session") is None
    page.get(url_of(daemon, "/ui/bags"))
    assert page.current_url.endswith("/ui/login")


def severe_console_messages(browser: Any) -> list[dict[str, Any]]:
    """Script errors and Content-Security-Policy violations the pages logged."""
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def running_vm_of(client: Any, job_id: str) -> str:
    """The VM a job runs on, once its program runs (its attempt running, not only handed
    to the executor: a VM preempted before that ends the attempt lost, not preempted)."""

    def vm() -> str | None:
        job = client.job(job_id)
        attempts = job.get("attempt_list") or []
        if job["state"] != "running" or not attempts:
            return None
        last = attempts[-1]
        return last["vm_id"] if last["state"] == "running" and last["ran_at"] else None

    return str(wait_until(vm, 30, what=f"{job_id} to run"))


def test_the_fleet_page_places_a_running_vm_on_its_model(page, daemon):
    from selenium.webdriver.common.by import By

    client = daemon.client()
    bag = client.submit(bag_spec("web", "sleep 30", 1, name="fleet"))
    vm_id = running_vm_of(client, f"{bag['id']}-0")
    log_in(page, daemon, TOKEN)
    page.find_element(By.LINK_TEXT, "Fleet").click()  # the navigation bar
    wait_until(lambda: page.current_url.endswith("/ui/fleet"), 10, what="the fleet page")
    row = wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-vm='{vm_id}']"),
        15,
        what="the bag's VM on the fleet page",
    )
    cells = [c.text for c in row[0].find_elements(By.TAG_NAME, "td")]
    assert cells[2].startswith("running") and cells[3] == "spot" and int(cells[5]) >= 1
    assert cells[6].startswith("$") and cells[8]  # cost so far, expected remaining life
    section = page.find_element(By.CSS_SELECTOR, "section.vm-type[data-type='local-2']")
    assert "Model: none" in section.text
    # The chart is drawn (uPlot's canvas), with the VM placed on it (its legend series).
    canvas = wait_until(
        lambda: section.find_elements(By.CSS_SELECTOR, ".chart canvas"), 10, what="the chart"
    )
    assert canvas[0].size["width"] > 200 and canvas[0].size["height"] > 100
    assert "VMs" in section.find_element(By.CSS_SELECTOR, ".u-legend").text
    # It refreshes in place (no reload), and nothing went wrong in the console.
    page.execute_script("window.notReloaded = true;")
    before = text_of(page, "status")
    wait_until(lambda: text_of(page, "status") != before, 10, what="a refresh")
    assert page.execute_script("return window.notReloaded === true;")
    assert not severe_console_messages(page)
    screenshot(page, "fleet")
    # A preemption notice shows on its row until the VM ends (issue 26).
    client.preempt(vm_id, notice_s=600)
    badge = wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-vm='{vm_id}'] .badge.notice"),
        15,
        what="the notice on the VM's row",
    )
    assert badge[0].text.startswith("notice: ends by ")
    client.cancel(bag["id"])


def money_page(browser: Any, daemon: Daemon, account: str | None = None) -> None:
    """Open the money page (on `account`, by its selector) and wait for its balance."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.find_element(By.LINK_TEXT, "Money").click()  # the navigation bar
    wait_until(lambda: browser.current_url.endswith("/ui/money"), 10, what="the money page")
    if account is not None:
        picker = Select(browser.find_element(By.ID, "account"))
        wait_until(
            lambda: account in [o.get_attribute("value") for o in picker.options],
            10,
            what=f"{account} in the account selector",
        )
        if browser.find_element(By.ID, "account-picker").is_displayed():  # 2 accounts or more
            picker.select_by_value(account)
        wait_until(lambda: text_of(browser, "account-name") == account, 10, what="the account")
    wait_until(lambda: "Available" in text_of(browser, "balance"), 10, what="the balance")


def test_the_money_page_shows_an_accounts_balance_cost_and_ledger(page, daemon):
    from selenium.webdriver.common.by import By

    from controller.formatting import number

    client = daemon.client()
    client.create_account("carol", cpu_hours=10)
    bag = client.submit(bag_spec("carol", "true", 2))
    wait_until(lambda: client.bag(bag["id"])["state"] == "succeeded", 60, what="carol's bag")
    balance = client.account("carol")
    log_in(page, daemon, TOKEN)
    money_page(page, daemon, "carol")
    facts = text_of(page, "balance")
    assert "Allocation\n10.00" in facts and f"Charged\n{number(balance['charged_cpu_h'])}" in facts
    assert f"Available\n{number(balance['available_cpu_h'])}" in facts
    wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"#cost-by-bag tr[data-bag='{bag['id']}']"),
        15,
        what="the bag's cost",
    )
    assert "Spot (paid)\n$" in text_of(page, "cost") and "On-demand" in text_of(page, "cost")
    # Its cost over time: the CPU-hours charged and the spot cost, drawn (uPlot's canvas).
    chart = wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, "#over-time canvas"), 10, what="the chart"
    )
    assert chart[0].size["width"] > 200  # type: ignore[index]
    assert "CPU-h charged" in page.find_element(By.CSS_SELECTOR, "#over-time .u-legend").text
    rows = page.find_elements(By.CSS_SELECTOR, "#ledger tbody tr")
    kinds = [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows]
    assert kinds[-1] == "credit" and "account created" in rows[-1].text  # newest first
    assert {"reserve", "charge", "release"} <= set(kinds)
    entries = client.ledger("carol")["entries"]
    assert rows[0].get_attribute("data-entry") == str(entries[-1]["id"])
    # A new entry appears without a reload (the ledger is read incrementally).
    page.execute_script("window.notReloaded = true;")
    client.credit("carol", 5, note="top-up from the test")
    wait_until(lambda: "top-up from the test" in text_of(page, "ledger"), 10, what="the credit")
    wait_until(lambda: "Allocation\n15.00" in text_of(page, "balance"), 10, what="the balance")
    assert page.execute_script("return window.notReloaded === true;")
    assert not severe_console_messages(page)
    screenshot(page, "money")


def test_an_account_token_sees_only_its_account_on_the_money_page(page, daemon):
    from selenium.webdriver.common.by import By

    client = daemon.client()
    for account in ("dave", "erin"):
        client.create_account(account, cpu_hours=3)
    client.credit("erin", 1, note="erin's secret top-up")
    dave_token = client.create_token("dave")["token"]
    log_in(page, daemon, dave_token)
    money_page(page, daemon)
    assert text_of(page, "account-name") == "dave"
    assert not page.find_element(By.ID, "account-picker").is_displayed()
    assert "Allocation\n3.00" in text_of(page, "balance")
    wait_until(lambda: "account created" in text_of(page, "ledger"), 10, what="dave's ledger")
    # Asking for another account in the address changes nothing.
    page.get(url_of(daemon, "/ui/money?account=erin"))
    wait_until(lambda: text_of(page, "account-name") == "dave", 10, what="dave's page")
    wait_until(lambda: "account created" in text_of(page, "ledger"), 10, what="dave's ledger")
    assert "erin" not in page.find_element(By.TAG_NAME, "main").text
    # The fleet is the daemon's: the page says so instead of showing an empty fleet.
    page.find_element(By.LINK_TEXT, "Fleet").click()
    wait_until(lambda: "daemon's token only" in text_of(page, "status"), 10, what="the refusal")
    screenshot(page, "account-token-money")


def test_the_fleet_page_draws_the_bathtub_of_a_daemon_that_assumes_one(browser, make_daemon):
    """A second daemon whose VMs follow the bathtub model (docs/design.md#preemption-models), their time sped up
    (1 s = 0.5 h), so that they sit at different ages on a curve worth looking at."""
    from selenium.webdriver.common.by import By

    daemon = make_daemon(model="bathtub", time_scale=1800, max_vms=3, token=TOKEN)
    client = daemon.start()
    client.submit(bag_spec("web", "sleep 20", 3, name="bathtub"))

    def old_vms() -> list[dict[str, Any]]:
        views = client.request("GET", "/v1/models")["in_use"]
        return [v for v in views if v["model"] == "bathtub" and v["age_h"] > 2]

    old = wait_until(old_vms, 30, what="a VM two model hours old")[0]  # type: ignore[index]
    # The daemon serves the curve the page draws (policies/preemption.py computes it).
    models = client.request("GET", "/v1/models")
    curve = models["curves"][old["key"]]
    assert curve["model"] == "bathtub" and curve["age_h"][-1] == 24.0
    assert curve["survival"][0] == 1.0 and curve["survival"][-1] == 0.0
    assert 0 < old["survival"] < 1 and 0 < old["expected_remaining_h"] < 24 - old["age_h"]
    browser.get(url_of(daemon, "/ui/login"))
    browser.delete_all_cookies()
    browser.get_log("browser")
    log_in(browser, daemon, TOKEN)
    browser.get(url_of(daemon, "/ui/fleet"))
    section = wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, "section.vm-type"), 15, what="a VM type"
    )[0]  # type: ignore[index]
    wait_until(lambda: "Model: bathtub (A = " in section.text, 10, what="the bathtub's parameters")
    assert section.find_elements(By.CSS_SELECTOR, ".chart canvas")
    survival = browser.execute_script(  # in one go: the rows are redrawn every refresh
        "return [...document.querySelectorAll('table.vms tbody tr')]"
        ".map(row => row.cells[7].textContent);"
    )
    assert any(s != "100 %" for s in survival), survival  # an old VM is below the top
    assert not severe_console_messages(browser)
    screenshot(browser, "fleet-bathtub")
    browser.delete_all_cookies()


LOGISTIC = REPO / "examples" / "programs" / "logistic.py"


def fresh_login(browser: Any, daemon: Daemon) -> None:
    """The shared browser, its cookies and console cleared, logged in to `daemon`."""
    browser.get(url_of(daemon, "/ui/login"))
    browser.delete_all_cookies()
    browser.get_log("browser")
    log_in(browser, daemon, TOKEN)


def test_an_injected_preemption_appears_on_the_timeline_without_a_reload(browser, make_daemon):
    """Checkpointable jobs on VMs that one real second ages by one model hour (so that
    they checkpoint every few seconds, as tests/integration/test_checkpoint_resume.py);
    a VM is preempted through the fault-injection API while the timeline is open."""
    import sys

    from selenium.webdriver.common.by import By

    daemon = make_daemon(
        model="exponential", mttf_h=200.0, time_scale=3600.0, max_vms=2, token=TOKEN
    )
    client = daemon.start()
    args = "--r 3.7 --iterations 400000 --chunks 400 --seconds 14 --progress"
    bag = client.submit(
        bag_spec(
            "web",
            f"{sys.executable} {LOGISTIC} {args} --x0 0.{{i}}5",
            2,
            name="timeline",
            checkpointable=True,
            checkpoint_cost_s=0.01,
            estimated_runtime_s=14,
            max_attempts=10,
            workdir=str(REPO),
        )
    )
    job_id = f"{bag['id']}-0"
    fresh_login(browser, daemon)
    browser.get(url_of(daemon, f"/ui/bags/{bag['id']}"))
    link = wait_until(
        lambda: (a := browser.find_element(By.ID, "timeline-link")).get_attribute("href") and a,
        10,
        what="the timeline link",
    )
    link.click()  # type: ignore[attr-defined]
    wait_until(lambda: browser.current_url.endswith("/timeline"), 10, what="the timeline page")
    browser.execute_script("window.notReloaded = true;")

    def checkpointed() -> dict[str, Any] | None:
        job = client.job(job_id)
        number = job["attempts"]
        written = [c for c in job["checkpoint_list"] if c["ok"] and c["attempt"] == number]
        return job if job["state"] == "running" and written else None

    job = wait_until(checkpointed, 60, 0.05, "a checkpoint")
    vm_id = job["vm_id"]  # type: ignore[index]
    attempt = f"{job_id}#{job['attempts']}"  # type: ignore[index]
    wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, f".checkpoint[data-job='{job_id}']"),
        10,
        what="the checkpoint's tick on the timeline",
    )
    assert browser.find_elements(By.CSS_SELECTOR, f"g.vm-row[data-vm='{vm_id}']")
    client.preempt(vm_id)
    preempted = wait_until(
        lambda: browser.find_elements(
            By.CSS_SELECTOR, f"g.attempt[data-attempt='{attempt}'][data-state='preempted']"
        ),
        15,
        what="the preempted attempt on the timeline",
    )[0]  # type: ignore[index]
    assert browser.find_elements(By.CSS_SELECTOR, f".preemption[data-vm='{vm_id}']")
    # Split where its checkpoint was written: saved work before, lost work after.
    assert preempted.find_elements(By.CSS_SELECTOR, "rect.saved")
    assert preempted.find_elements(By.CSS_SELECTOR, "rect.lost")
    row = wait_until(
        lambda: browser.find_elements(
            By.CSS_SELECTOR, f"#interruptions tr[data-attempt='{attempt}']"
        ),
        10,
        what="the interruption in the table",
    )[0]  # type: ignore[index]
    assert vm_id in row.text and "preempted" in row.text
    # The retry starts on another VM, linked to the attempt it replaces.
    wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, f".retry-link[data-job='{job_id}']"),
        30,
        what="the retry on the timeline",
    )
    assert browser.execute_script("return window.notReloaded === true;")
    done = wait_for_bag(client, bag["id"], 90)
    assert done["state"] == "succeeded", daemon.log()
    wait_until(lambda: text_of(browser, "bag-state") == "succeeded", 10, what="the end")
    # What the page shows is what the API says.
    facts = text_of(browser, "facts")
    assert "Preempted\n1" in facts or "Preempted\n2" in facts
    assert not severe_console_messages(browser)
    screenshot(browser, "timeline")
    browser.delete_all_cookies()


def test_a_preemption_notice_is_flagged_on_the_timeline(browser, make_daemon):
    """A VM given a notice through the fault-injection API: the timeline flags it where
    its cloud said it would take it, and keeps the flag once the VM is gone (notice_until
    is stored with the VM)."""
    from selenium.webdriver.common.by import By

    daemon = make_daemon(max_vms=1, token=TOKEN)
    client = daemon.start()
    bag = client.submit(bag_spec("web", "sleep 30", 1, name="noticed"))
    job = wait_until(
        lambda: (j := client.job(f"{bag['id']}-0"))["state"] == "running" and j, 30, 0.1, "a run"
    )
    fresh_login(browser, daemon)
    browser.get(url_of(daemon, f"/ui/bags/{bag['id']}/timeline"))
    wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, f"g.vm-row[data-vm='{job['vm_id']}']"),
        10,
        what="the VM's row",
    )
    assert not browser.find_elements(By.CSS_SELECTOR, ".notice")
    client.preempt(job["vm_id"], notice_s=2)
    flag = wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, f".notice[data-vm='{job['vm_id']}']"),
        20,
        what="the notice's flag on the timeline",
    )[0]  # type: ignore[index]
    until = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}[job["vm_id"]]
    assert until["notice_until"] is not None
    assert "preemption notice" in flag.find_element(By.TAG_NAME, "title").get_attribute(
        "textContent"
    )
    assert not severe_console_messages(browser)
    client.cancel(bag["id"])
    browser.delete_all_cookies()


def market_page(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.LINK_TEXT, "Market").click()  # the navigation bar
    wait_until(lambda: browser.current_url.endswith("/ui/market"), 10, what="the market page")


def test_the_market_page_draws_each_types_prices_beside_the_index(page, daemon):
    """The module's daemon samples the local driver's catalog prices (hopping on, moves
    off): flat lines, but the page shows them as it would a cloud's."""
    from selenium.webdriver.common.by import By

    client = daemon.client()
    prices = wait_until(
        lambda: (p := client.request("GET", "/v1/hopping/prices"))["index"]["at"] and p,
        30,
        what="the hopper's first samples",
    )
    index_now = prices["index"]["value"][-1]  # type: ignore[index]
    log_in(page, daemon, TOKEN)
    market_page(page)
    section = wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, "section.market-type[data-type='local-2']"),
        15,
        what="the local-2 chart",
    )[0]  # type: ignore[index]
    canvas = wait_until(
        lambda: section.find_elements(By.CSS_SELECTOR, "canvas"), 10, what="a canvas"
    )
    assert canvas[0].size["width"] > 200  # type: ignore[index]
    legend = section.find_element(By.CSS_SELECTOR, ".u-legend").text
    assert "price / unit" in legend and "index" in legend
    assert page.find_elements(By.CSS_SELECTOR, "section.market-type[data-type='local-4']")
    row = page.find_element(By.CSS_SELECTOR, "#market-now tr[data-type='local-2']")
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "$0.02" and cells[5] == f"{0.02 / 8**0.5:.3g}"
    assert cells[6].startswith("below")  # 0.0071 per unit against an index of 0.0080
    assert f"{index_now:.3g}" in text_of(page, "market-facts")
    assert "migration is off" in text_of(page, "no-moves")
    assert not page.find_element(By.ID, "no-market").is_displayed()
    assert not severe_console_messages(page)
    screenshot(page, "market-local")
    # An account token: the market is the daemon's, as the API says.
    client.create_account("frank", cpu_hours=1)
    page.delete_all_cookies()
    log_in(page, daemon, client.create_token("frank")["token"])
    market_page(page)
    wait_until(lambda: "daemon's token only" in text_of(page, "status"), 10, what="the refusal")


def test_the_market_page_says_when_there_is_no_market(browser, make_daemon):
    daemon = make_daemon(token=TOKEN)
    daemon.config_path.write_text(
        daemon.config_path.read_text().replace("migrate = false", "enabled = false")
    )
    daemon.start()
    fresh_login(browser, daemon)
    market_page(browser)
    wait_until(lambda: "Updated" in text_of(browser, "status"), 10, what="the page to load")
    assert "No market data: spot hopping is off" in text_of(browser, "no-market")
    from selenium.webdriver.common.by import By

    assert not browser.find_elements(By.CSS_SELECTOR, "section.market-type")
    assert "spot hopping is off" in text_of(browser, "no-moves")
    assert not severe_console_messages(browser)
    screenshot(browser, "market-none")
    browser.delete_all_cookies()


def test_the_market_page_shows_the_hoppers_move_and_its_reason(browser, tmp_path):
    """The hopping test's daemon (tests/integration/test_hopping.py): a replayed price
    trace makes the type a checkpointable job runs on dear, and the hopper moves it."""
    import signal
    import sys

    from selenium.webdriver.common.by import By

    from tests.integration.test_hopping import ARGS, CONFIG, PROGRAM, write_trace

    state = tmp_path / "state"
    state.mkdir()
    trace = tmp_path / "prices.csv.gz"
    write_trace(trace)
    (state / "spotbag.toml").write_text(CONFIG.format(token=TOKEN, trace=trace))
    daemon = Daemon(state, state / "spotbag.toml", TOKEN)
    client = daemon.start()
    try:
        bag = client.submit(
            {
                "account": "lab",
                "command": f"{sys.executable} {PROGRAM} {ARGS}",
                "resources": {"cpus": 2, "memory_gb": 4},
                "max_runtime_s": 120,
                "estimated_runtime_s": 12,
                "checkpointable": True,
                "checkpoint_cost_s": 0.01,
                "workdir": str(REPO),
            }
        )
        fresh_login(browser, daemon)
        market_page(browser)
        browser.execute_script("window.notReloaded = true;")
        move = wait_until(lambda: client.hopping()["migrations"], 60, what="the hopper's move")[0]  # type: ignore[index]
        row = wait_until(
            lambda: browser.find_elements(By.CSS_SELECTOR, f"#moves tr[data-move='{move['id']}']"),
            15,
            what="the move on the page",
        )[0]  # type: ignore[index]
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        assert cells[1] == move["vm_id"] and cells[2:5] == ["a-2", "b-2", "cost"]
        assert cells[5] == "$0.09" and cells[6] == "$0.05"
        assert cells[8] == f"{bag['id']}-0" and cells[9] == move["reason"]
        assert move["reason"].startswith("cost: a-2 ")
        for vm_type in ("a-2", "b-2"):
            section = browser.find_element(
                By.CSS_SELECTOR, f"section.market-type[data-type='{vm_type}']"
            )
            assert section.find_elements(By.CSS_SELECTOR, "canvas")
            assert "moved away" in section.find_element(By.CSS_SELECTOR, ".u-legend").text
        now = {
            r.get_attribute("data-type"): r.find_elements(By.TAG_NAME, "td")[1].text
            for r in browser.find_elements(By.CSS_SELECTOR, "#market-now tbody tr")
        }
        assert now == {"a-2": "$0.09", "b-2": "$0.05"}
        assert browser.execute_script("return window.notReloaded === true;")
        assert not severe_console_messages(browser)
        browser.set_window_size(1280, 1450)  # the charts and the moves below them
        try:
            screenshot(browser, "market")
        finally:
            browser.set_window_size(1280, 1000)
        assert wait_for_bag(client, bag["id"], 90)["state"] == "succeeded", daemon.log()
    finally:
        browser.delete_all_cookies()
        daemon.stop(signal.SIGKILL)


def test_the_search_box_finds_jobs_by_parameter_in_the_whole_bag(page, daemon):
    from selenium.webdriver.common.by import By

    client = daemon.client()
    bag = client.submit(
        bag_spec(
            "web", "true", 0, name="search", parameters={"i": {"range": [0, 60]}, "k": ["x", "y"]}
        )
    )
    wait_until(lambda: client.bag(bag["id"])["state"] == "succeeded", 90, what="the bag")
    log_in(page, daemon, TOKEN)
    page.get(url_of(daemon, f"/ui/bags/{bag['id']}"))

    def rows() -> list[str]:
        return page.execute_script(  # in one go: the rows are redrawn every refresh
            "return [...document.querySelectorAll('#jobs tbody tr')].map(r => r.dataset.job);"
        )

    wait_until(lambda: len(rows()) == 50, 10, what="the first page of 120 jobs")
    page.execute_script("window.notReloaded = true;")
    box = page.find_element(By.ID, "param-filter")
    box.send_keys("i=57 k=y")  # job 115: on the third page of the bag, found by the API
    wait_until(lambda: rows() == [f"{bag['id']}-115"], 10, what="the one match")
    box.clear()
    box.send_keys("k=x")
    wait_until(lambda: len(rows()) == 50, 10, what="the first page of matches")
    assert all(r.endswith(tuple(f"-{n}" for n in range(0, 120, 2))) for r in rows())
    page.find_element(By.ID, "next-page").click()
    wait_until(lambda: len(rows()) == 10, 10, what="the second page of matches")
    assert page.find_element(By.ID, "next-page").get_attribute("disabled") is not None
    box.clear()
    box.send_keys("k")
    wait_until(
        lambda: "Search: query parameter param" in text_of(page, "status"), 10, what="the error"
    )
    box.clear()
    box.send_keys("i=500")
    wait_until(lambda: page.find_element(By.ID, "no-jobs").is_displayed(), 10, what="no match")
    assert page.execute_script("return window.notReloaded === true;")
    screenshot(page, "bag-search")


def test_the_bags_page_pages_through_every_bag(page, daemon):
    from selenium.webdriver.common.by import By

    client = daemon.client()
    while len(client.bags(limit=1000)) < 53:
        client.submit(bag_spec("web", "true", 1, name="many"))
    every = [b["id"] for b in client.bags(limit=1000)]  # newest first, as the page lists them
    log_in(page, daemon, TOKEN)

    def rows() -> list[str]:
        return page.execute_script(
            "return [...document.querySelectorAll('#bags tbody tr')].map(r => r.dataset.bag);"
        )

    wait_until(lambda: rows() == every[:50], 15, what="the first 50 bags")
    page.find_element(By.ID, "next-page").click()
    wait_until(lambda: rows() == every[50:100], 15, what="the next page")
    assert "page 2" in text_of(page, "page-text")
    page.find_element(By.ID, "prev-page").click()
    wait_until(lambda: rows() == every[:50], 15, what="the first page again")
    assert page.find_element(By.ID, "prev-page").get_attribute("disabled") is not None


# --- issue 24: figures that read right, pages that fit, waiting reasons ---------------------

# A minus zero in any of its spellings (-0, -0.00, −0 %, -$0.00), and scientific notation.
MINUS_ZERO = r"(?<![\w.,])[-−]\$?0(?:\.0+)?(?![\d.,]*[1-9])(?!\d)"
# 6.521e-06, 1e+21: how Python and JavaScript print a float they leave in scientific
# notation (one digit before the point, an exponent of at most 3 digits); not a hex id
# that happens to be digits, an "e" and digits (ba72f0a2c72, vm-21319e858988).
EXPONENT = r"(?<![\w.])\d(?:\.\d+)?e[-+]?\d{1,3}(?!\w)"


def page_text(browser: Any) -> str:
    return browser.execute_script("return document.querySelector('main').innerText;")


def assert_figures_read_right(browser: Any, where: str) -> None:
    import re

    text = page_text(browser)
    assert not re.search(MINUS_ZERO, text), f"{where}: {re.search(MINUS_ZERO, text)!r} in {text}"
    assert not re.search(EXPONENT, text), f"{where}: {re.search(EXPONENT, text)!r} in {text}"


def test_the_pages_print_figures_as_the_cli_does(page, daemon):
    """format.js (the pages') and controller/formatting.py (the CLI's, the reports') print
    the same text for the same value: edge cases, then a few thousand random values."""
    import random

    from controller import formatting

    log_in(page, daemon, TOKEN)
    rng = random.Random(24)
    values = [0.0, -0.0, 1e-12, -1e-17, 0.000836, 6.521e-06, 0.5625, 0.125, 0.0009996, 89.96]
    values += [0.02, 1.005, 12345.678, -0.0213, 5400.0, 259199.0, 259200.0, 1e-9, -1e-9]
    for _ in range(3000):
        values.append(rng.choice([-1, 1]) * 10 ** rng.uniform(-10, 12))
        values.append(round(rng.uniform(-100, 100), rng.randint(0, 6)))
    got = page.execute_async_script(
        "const [values, done] = arguments;"
        "import('/ui/static/format.js').then((f) => done(values.map((v) => ["
        "f.usd(v), f.number(v), f.percent(v), f.percent(v, 3), f.signedPercent(v), f.duration(v)"
        "])), (e) => done(String(e)));",
        values,
    )
    assert isinstance(got, list), got
    for value, js in zip(values, got, strict=True):
        python = [
            formatting.usd(value),
            formatting.number(value),
            formatting.percent(value),
            formatting.percent(value, 3),
            formatting.signed_percent(value),
            formatting.duration(value),
        ]
        assert js == python, (value, js, python)


def test_a_waiting_job_shows_why_it_waits(page, daemon):
    from selenium.webdriver.common.by import By

    client = daemon.client()
    # Held for credit: the account cannot cover one attempt (120 s of one CPU).
    client.create_account("gina", cpu_hours=0.01)
    held = client.submit(bag_spec("gina", "true", 3, on_insufficient_balance="hold"))
    # Queued behind a full fleet (max_vms = 2, a job of 2 CPUs fills a local-2 VM).
    busy = client.submit(
        bag_spec("web", "sleep 30", 6, name="busy", resources={"cpus": 2, "memory_gb": 1})
    )
    try:
        log_in(page, daemon, TOKEN)
        page.get(url_of(daemon, f"/ui/bags/{held['id']}"))
        cell = wait_until(
            lambda: page.find_elements(
                By.CSS_SELECTOR, f"tr[data-job='{held['id']}-0'] td.waiting"
            ),
            15,
            what="the held job's reason",
        )[0]  # type: ignore[index]
        assert "held for credit" in cell.text and "'gina' has 0.01 available" in cell.text
        api_view = client.request("GET", f"/v1/jobs/{held['id']}-0")
        assert api_view["state"] == "held" and api_view["waiting"].startswith("held for credit")
        screenshot(page, "bag-held")

        page.get(url_of(daemon, f"/ui/bags/{busy['id']}"))

        def queued_reasons() -> list[str]:
            return page.execute_script(
                "return [...document.querySelectorAll('#jobs tbody tr')]"
                ".filter((r) => r.querySelector('.badge.queued'))"
                ".map((r) => r.querySelector('td.waiting .why')?.textContent || '');"
            )

        reasons = wait_until(lambda: queued_reasons() or None, 20, what="a queued job")
        assert all(r.startswith("waiting") for r in reasons), reasons  # type: ignore[union-attr]
        assert any("max_vms = 2" in r or "VM to boot" in r for r in reasons), reasons  # type: ignore[union-attr]
        assert_figures_read_right(page, "the busy bag's page")
        screenshot(page, "bag-waiting")
    finally:
        client.cancel(held["id"])
        client.cancel(busy["id"])


# GET /v1/bags/{id}'s `deadline` as the deadline policy fills it (wt-escalate): the panel's
# functions are run on it, since the daemon here has no deadline to project.
PROJECTED = {
    "at": 1_790_036_000.0,
    "confidence": 0.95,
    "p_meet": 0.9712,
    "finish": {"p50": 1_790_025_200.0, "p90": 1_790_028_800.0, "p95": 1_790_030_600.0},
    "at_risk": True,
    "on_demand_slots": 8,
    "on_demand_share": 0.0004,
}


def test_a_bags_budget_deadline_and_events_show_on_its_page(page, daemon):
    """A bag a budget holds: budget used against both caps (text and bar), why it waits,
    its budget_reached event with the webhook's delivery state, its flag on the bags
    page, at 400 px too; the deadline facts from a realistic projection (plan.js)."""
    from selenium.webdriver.common.by import By

    from tests.integration.test_notifications import free_port

    client = daemon.client()
    client.create_account("bud", unlimited=True, budget_usd=7.0)
    hook = {"url": f"http://127.0.0.1:{free_port()}/hook"}  # refused: stays pending
    # 2 h of half a local-2 VM reserves $0.02: a cap of $0.01 holds the bag at once.
    bag = client.submit(
        bag_spec("bud", "true", 2, name="capped", max_runtime_s=7200, budget_usd=0.01,
                 notify=[hook])
    )  # fmt: skip
    try:
        log_in(page, daemon, TOKEN)
        page.get(url_of(daemon, f"/ui/bags/{bag['id']}"))
        wait_until(lambda: "held: budget" in text_of(page, "plan-facts"), 20, what="the hold")
        assert text_of(page, "budget-text") == (
            "Budget: $0.00 charged + $0.00 reserved of $0.01 (0 % used); "
            "account: $0.00 of $7.00 this month"
        )
        assert page.find_element(By.ID, "budget-bar").is_displayed()
        assert not page.find_element(By.ID, "at-risk").is_displayed()  # no deadline
        assert "Deadline" not in text_of(page, "plan-facts")
        row = wait_until(
            lambda: page.find_elements(By.CSS_SELECTOR, "#events tbody tr"), 20, what="an event"
        )[0]  # type: ignore[index]
        assert "budget reached" in row.text and "held: budget: bag " in row.text
        assert hook["url"] in row.text
        assert any(s in row.text for s in ("pending (", "failed (")), row.text
        page.set_window_size(400, 900)
        try:
            widths = page.execute_script(
                "const d = document.documentElement; return [d.scrollWidth, d.clientWidth];"
            )
            assert widths[0] <= widths[1], widths
            screenshot(page, "bag-budget-narrow")
        finally:
            page.set_window_size(1280, 1000)
        assert_figures_read_right(page, "the held bag's page")
        screenshot(page, "bag-budget")

        page.get(url_of(daemon, "/ui/bags"))
        flag = wait_until(
            lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-bag='{bag['id']}'] .flag"),
            15,
            what="the bag's flag",
        )[0]  # type: ignore[index]
        assert flag.text == "held: budget"

        # The deadline panel on the API's answer once the policy projects it.
        view = {**client.bag(bag["id"]), "deadline": PROJECTED}
        view["options"] = {**view["options"], "deadline": "10h", "deadline_at": PROJECTED["at"]}
        view["options"]["on_demand"] = "when_needed"
        got = page.execute_async_script(
            "const [view, now, done] = arguments;"
            "import('/ui/static/plan.js').then((p) => done({"
            "  facts: p.deadlineFacts(view, now), flags: p.bagFlags(view),"
            "  none: p.deadlineFacts({...view, deadline: null, options: {}}, now),"
            "  unprojected: p.deadlineFacts({...view, deadline: {...view.deadline,"
            "    p_meet: null, finish: null, on_demand_share: null}}, now)"
            "}), (e) => done(String(e)));",
            view,
            PROJECTED["at"] - 8 * 3600.0,
        )
        assert isinstance(got, dict), got
        facts = dict(got["facts"])
        assert list(facts) == [
            "Deadline",
            "Time left",
            "Projected finish",
            "Spread (p90 – p95)",
            "Meets it",
            "On-demand",
        ]
        assert facts["Time left"] == "8.0 h"
        assert facts["Deadline"].endswith("(10h, on-demand when_needed)")
        assert facts["Meets it"] == "p = 97.1 % (wanted 95 %)"
        assert facts["On-demand"] == "8 slots now, share so far 0.04 %"  # never 0 %
        assert got["flags"] == ["at risk", "held: budget"]
        assert got["none"] == []
        assert [k for k, _ in got["unprojected"]][2:] == ["Projected finish", "On-demand"]
        assert dict(got["unprojected"])["Projected finish"] == "not yet known"
        assert not severe_console_messages(page)
    finally:
        client.cancel(bag["id"])


def test_the_fleet_page_lists_a_preempted_vm_after_its_bag_ended(page, daemon):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    client = daemon.client()
    bag = client.submit(bag_spec("web", "sleep 4", 1, name="preempted", max_attempts=3))
    job_id = f"{bag['id']}-0"
    vm_id = running_vm_of(client, job_id)
    client.preempt(vm_id)
    done = wait_for_bag(client, bag["id"], 60)
    assert done["state"] == "succeeded", daemon.log()
    log_in(page, daemon, TOKEN)
    page.get(url_of(daemon, "/ui/fleet"))
    wait_until(lambda: "Updated" in text_of(page, "status"), 10, what="the fleet page")
    assert not page.find_elements(By.CSS_SELECTOR, f"tr[data-vm='{vm_id}']")  # live only
    Select(page.find_element(By.ID, "range")).select_by_value("all")
    row = wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-vm='{vm_id}']"),
        10,
        what="the preempted VM among all VMs",
    )[0]  # type: ignore[index]
    assert row.get_attribute("data-state") == "preempted" and "preempted" in row.text
    assert page.current_url.endswith("?range=all")  # the range is in the address
    assert_figures_read_right(page, "the fleet page (all VMs)")
    screenshot(page, "fleet-all")
    # The job that succeeded after the preemption is marked on its bag's page.
    page.get(url_of(daemon, f"/ui/bags/{bag['id']}"))
    mark = wait_until(
        lambda: page.find_elements(By.CSS_SELECTOR, f"tr[data-job='{job_id}'] .badge.preempted"),
        10,
        what="the job's preemption mark",
    )[0]  # type: ignore[index]
    assert mark.text == "after 1 preemption"
    assert not severe_console_messages(page)


def test_every_page_fits_a_400_px_screen_and_no_figure_reads_wrong(page, daemon):
    """At 400 px no page scrolls sideways (a table too wide scrolls inside itself), and
    no page shows -0, scientific notation, or a non-zero cost as $0.00."""
    from selenium.webdriver.common.by import By

    from controller import formatting

    client = daemon.client()
    bag = client.submit(bag_spec("web", "echo a fairly long line of output {i}", 3, name="narrow"))
    assert wait_for_bag(client, bag["id"], 60)["state"] == "succeeded"
    job_id = f"{bag['id']}-1"
    log_in(page, daemon, TOKEN)
    page.set_window_size(400, 900)
    try:
        # A job's own address opens its panel, attempts and log.
        page.get(url_of(daemon, f"/ui/bags/{bag['id']}?job={job_id}"))
        wait_until(
            lambda: "a fairly long line of output 1" in text_of(page, "log"), 15, what="the log"
        )
        assert text_of(page, "job-id") == job_id
        raw = page.find_element(By.ID, "raw-log").get_attribute("href")
        assert raw.endswith(f"/v1/jobs/{job_id}/log?attempt=1")

        # Its cost is a fraction of a millionth of a dollar: shown as such, never as $0.00.
        def cost_shown() -> str | None:
            cost = client.bag(bag["id"])["usage"]["spot_cost_usd"]
            shown = f"Spot cost\n{formatting.usd(cost)}\n"
            return shown if cost > 0 and shown in text_of(page, "facts") + "\n" else None

        assert "$0.00\n" not in str(wait_until(cost_shown, 15, what="the bag's cost"))
        pages = {
            "bags": "/ui/bags",
            "bag": f"/ui/bags/{bag['id']}?job={job_id}",
            "timeline": f"/ui/bags/{bag['id']}/timeline",
            "fleet": "/ui/fleet?range=all",
            "money": "/ui/money?account=web",
            "market": "/ui/market",
        }
        for name, path in pages.items():
            page.get(url_of(daemon, path))
            wait_until(lambda: "Updated" in text_of(page, "status"), 15, what=f"the {name} page")
            if name == "money":
                wait_until(lambda: "Spot (paid)" in text_of(page, "cost"), 15, what="the cost")
                balance = text_of(page, "balance")
                assert "Used\n" in balance and "Used\n\n" not in balance + "\n", balance
            widths = page.execute_script(
                "const d = document.documentElement;"
                "const wide = [...document.querySelectorAll('body *')]"
                "  .filter((e) => e.getBoundingClientRect().right > d.clientWidth + 1)"
                "  .filter((e) => !e.closest('table, .gantt, .chart, pre'))"
                "  .slice(0, 5).map((e) => e.tagName + '#' + e.id + '.' + e.className);"
                "return [d.scrollWidth, d.clientWidth, wide];"
            )
            assert widths[0] <= widths[1], (
                f"{name} is {widths[0]} px wide at {widths[1]}: {widths[2]}"
            )
            assert_figures_read_right(page, f"the {name} page")
            screenshot(page, f"narrow-{name}")
        # The money page: no cost the report has as non-zero prints as $0.00.
        report = client.request("GET", "/v1/reports?account=web")
        page.get(url_of(daemon, "/ui/money?account=web"))
        for row in report["by_bag"]:
            # Below formatting.NOISE a figure is zero by rule (a bag of `true` jobs on a
            # shared VM can cost less than a billionth of a dollar).
            if row["spot_cost_usd"] >= formatting.NOISE:
                cell = wait_until(
                    lambda r=row: page.find_elements(
                        By.CSS_SELECTOR,
                        f"#cost-by-bag tr[data-bag='{r['bag_id']}'] td:nth-child(5)",
                    ),
                    15,
                    what="the bag's cost",
                )[0]  # type: ignore[index]
                assert cell.get_attribute("textContent") not in ("$0.00", "$0.00000"), row
        assert not severe_console_messages(page)
    finally:
        page.set_window_size(1280, 1000)


def test_a_searched_jobs_row_follows_its_state(page, daemon):
    """While a search is shown its rows are read less often (a search may scan the whole
    bag), but never left behind: the row of the job shown below agrees with its panel,
    and the page is read again soon when the bag's counts change."""
    from selenium.webdriver.common.by import By

    client = daemon.client()
    bag = client.submit(bag_spec("web", "sleep 3", 4, name="stale"))
    job_id = f"{bag['id']}-2"
    log_in(page, daemon, TOKEN)
    page.get(url_of(daemon, f"/ui/bags/{bag['id']}"))
    page.find_element(By.ID, "param-filter").send_keys("i=2")

    def row_state() -> str | None:
        return page.execute_script(
            "const row = document.querySelector(`#jobs tr[data-job='${arguments[0]}']`);"
            "return row ? row.querySelector('.badge').textContent : null;",
            job_id,
        )

    wait_until(lambda: row_state() in ("queued", "running"), 15, what="the searched job")
    open_job(page, job_id)
    wait_until(lambda: client.job(job_id)["state"] == "succeeded", 30, what="the job to end")
    # Within two refreshes (and a request's time): not the ten seconds of a search's pace.
    wait_until(lambda: row_state() == "succeeded", 6, 0.1, "the row to say succeeded")
    assert "State\nsucceeded" in text_of(page, "job-facts")
