"""The web UI's session cookie and CSRF check (controller/web/session.py), on mocked
requests: no daemon, no browser (tests/integration/test_web_ui.py has those)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from controller.tokens import ADMIN, Tokens
from controller.web import session
from controller.web.pages import ASSETS, is_ui_path

ADMIN_TOKEN = 'admin tok;en "with" odd=chars'


def request(method: str = "POST", token: str | None = ADMIN_TOKEN, **headers: str):
    if token is not None:
        headers["Cookie"] = f"{session.SESSION_COOKIE}={session.encode_token(token)}"
    headers.setdefault("Host", "head:8080")
    return make_mocked_request(method, "/v1/bags/b0000000000/cancel", headers=headers)


def test_any_token_survives_the_cookie():
    for token in (ADMIN_TOKEN, "sbt_0123456789ab_" + "x" * 40, "é ü"):
        value = session.encode_token(token)
        assert value.isascii() and ";" not in value and " " not in value
        assert session.decode_token(value) == token
    assert session.decode_token("%%%") is None


def test_the_cookie_stands_for_the_same_principal_as_the_header():
    tokens = Tokens(ADMIN_TOKEN)
    assert session.cookie_principal(request(), tokens) == ADMIN
    assert session.cookie_principal(request(token="wrong"), tokens) is None
    assert session.cookie_principal(request(token=None), tokens) is None


def test_a_state_changing_cookie_request_needs_the_csrf_token_of_its_session():
    good = session.csrf_token(ADMIN_TOKEN, ADMIN_TOKEN)
    assert session.csrf_problem(request(), ADMIN_TOKEN) is not None
    assert session.csrf_problem(request(**{"X-CSRF-Token": "0" * 64}), ADMIN_TOKEN)
    assert session.csrf_problem(request(**{"X-CSRF-Token": good}), ADMIN_TOKEN) is None
    # The token of another session (or made with another daemon's key) does not do.
    other = session.csrf_token(ADMIN_TOKEN, "sbt_0123456789ab_" + "x" * 40)
    assert session.csrf_problem(request(**{"X-CSRF-Token": other}), ADMIN_TOKEN)
    assert session.csrf_problem(
        request(**{"X-CSRF-Token": session.csrf_token("other", ADMIN_TOKEN)}), ADMIN_TOKEN
    )
    # Reading needs none.
    assert session.csrf_problem(request("GET"), ADMIN_TOKEN) is None


def test_another_origin_is_refused_even_with_the_csrf_token():
    good = {"X-CSRF-Token": session.csrf_token(ADMIN_TOKEN, ADMIN_TOKEN)}
    assert session.csrf_problem(request(Origin="http://evil:8080", **good), ADMIN_TOKEN)
    assert session.csrf_problem(request(Origin="null", **good), ADMIN_TOKEN)
    assert session.csrf_problem(request(Origin="http://head:8080", **good), ADMIN_TOKEN) is None
    # Behind a proxy that ends TLS: https outside, http inside, the same host.
    assert session.csrf_problem(request(Origin="https://head:8080", **good), ADMIN_TOKEN) is None
    proxied = request(Origin="https://ui.example", **{"X-Forwarded-Host": "ui.example"}, **good)
    assert session.csrf_problem(proxied, ADMIN_TOKEN) is None


def test_the_cookies_are_httponly_strict_and_secure_over_https_only():
    for headers, secure in (({}, False), ({"X-Forwarded-Proto": "https"}, True)):
        response = web.Response()
        session.set_session(response, request(**headers), "tok", ADMIN_TOKEN)
        sid, csrf = response.cookies[session.SESSION_COOKIE], response.cookies[session.CSRF_COOKIE]
        assert sid["httponly"] and not csrf["httponly"]
        for cookie in (sid, csrf):
            assert cookie["samesite"] == "Strict" and cookie["path"] == "/"
            assert bool(cookie["secure"]) is secure
        assert csrf.value == session.csrf_token(ADMIN_TOKEN, "tok")
    cleared = web.Response()
    session.clear_session(cleared)
    assert all(cleared.cookies[name]["max-age"] == "0" for name in cleared.cookies)


def test_the_ui_paths_and_assets():
    assert is_ui_path("/") and is_ui_path("/ui/bags") and not is_ui_path("/v1/bags")
    assert {"login.html", "bags.html", "bag.html", "api.js", "style.css"} <= set(ASSETS)
    assert {"fleet.html", "fleet.js", "money.html", "money.js"} <= set(ASSETS)
    assert {"timeline.html", "timeline.js", "timeline.css", "market.html", "market.js"} <= set(
        ASSETS
    )
    # The vendored chart library is served with its licence; its notes are not.
    vendored = {"vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.min.css"}
    assert vendored | {"vendor/uplot/LICENSE"} <= set(ASSETS)
    assert "vendor/uplot/README.md" not in ASSETS


def test_the_pages_load_nothing_from_outside_and_run_no_inline_script():
    """What the Content-Security-Policy allows (and what works with no internet)."""
    import re

    for name, path in ASSETS.items():
        # SVG's namespace is a name, not an address (favicon.svg, timeline.js's elements).
        text = path.read_text().replace('"http://www.w3.org/2000/svg"', '""')
        # The vendored library's banner comment names its home (kept as published).
        text = text.replace("/*! https://github.com/leeoniya/uPlot (v", "/*! (v")
        assert not re.search(r"(?i)https?://|//cdn|@import", text), f"{name} loads from outside"
        if name.endswith(".html"):
            scripts = re.findall(r"<script\b[^>]*>", text)
            assert all('src="/ui/static/' in s for s in scripts), f"{name}: inline script"
            assert not re.search(r"\son[a-z]+=|\sstyle=|<style", text), f"{name}: inline handler"


def test_every_page_is_put_into_the_one_shell():
    """One document head for all pages (static/shell.html), one header for the signed-in
    ones (static/header.html), the navigation entry of the page shown marked current."""
    import re

    from controller.web.pages import HEADER, SHELL, render_page

    pages = sorted(n for n in ASSETS if n.endswith(".html") and n not in (SHELL, HEADER))
    assert {"login.html", "bags.html", "bag.html", "timeline.html", "fleet.html"} <= set(pages)
    for name in pages:
        own = ASSETS[name].read_text()
        assert "<head>" not in own and "<!doctype" not in own.lower(), f"{name} copies the shell"
        path = {"bags.html": "/ui/bags", "fleet.html": "/ui/fleet"}.get(name, "/ui/other")
        text = render_page(name, path)
        assert text.startswith("<!doctype html>\n") and text.endswith("</html>\n"), name
        assert text.count("<title>") == 1 and text.count("<head>") == 1, name
        assert text.count('href="/ui/static/style.css"') == 1, name
        assert not re.search(r"<!--(head|body|header)-->", text), f"{name}: a slot left"
        assert (text.count("<header>") == 1) is (name != "login.html"), name
        current = re.findall(r'<a href="([^"]+)" aria-current="page">', text)
        assert current == ([path] if path != "/ui/other" else []), (name, current)
