"""The web UI's routes: the login form, the page shells and their static assets.

Pages are static HTML (controller/web/static/); their ES modules fetch every figure from
the same /v1 JSON API the CLI uses, with the session cookie, so there is no second data
path. Every page is put into one shell (static/shell.html: the document and the head all
pages share); a page's file holds only its own head lines (title, styles, scripts), then
`<!--body-->` and its body, where `<!--header-->` stands for the signed-in pages' header
(static/header.html: brand, navigation, log out), its entry for the page shown marked
current. Besides that, the server renders only the login page's message. Every UI
answer carries a Content-Security-Policy that allows scripts, styles and requests to
the daemon itself only (no inline script, no framing), and `nosniff`.

These routes are not in the API's route table (`controller.api.app.ROUTES`), so they
are not in /openapi.json; the bearer check of the API leaves them alone (`is_ui_path`)
and a page checks the session cookie itself, sending a browser without a valid one to
the login form.
"""

from __future__ import annotations

import html
import mimetypes
from pathlib import Path

from aiohttp import web

from controller.api.base import CONTROLLER, Handler
from controller.web import session

STATIC = Path(__file__).resolve().parent / "static"
# The assets there, by path relative to static/ ("api.js", "vendor/uplot/uPlot.min.css"):
# only these are served (no file path is built from a request). Vendored libraries sit
# one folder down, under vendor/<library>/, with their licence and a README (not served).
ASSETS = (
    {
        p.relative_to(STATIC).as_posix(): p
        for p in STATIC.rglob("*")
        if p.is_file() and p.suffix != ".md"
    }
    if STATIC.is_dir()
    else {}
)
LOGIN_PATH = "/ui/login"
BAGS_PATH = "/ui/bags"
FLEET_PATH = "/ui/fleet"
MONEY_PATH = "/ui/money"
MARKET_PATH = "/ui/market"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; object-src 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make Origin "null"
}
MESSAGE_SLOT = "<!--message-->"
SHELL = "shell.html"  # the document and the head every page shares
HEADER = "header.html"  # the signed-in pages' header: brand, navigation, log out
HEAD_SLOT = "<!--head-->"  # in the shell: the page's own head lines
BODY_SLOT = "<!--body-->"  # in the shell: the page's body; in a page: where its head ends
HEADER_SLOT = "<!--header-->"  # in a page's body: the header


def is_ui_path(path: str) -> bool:
    """Paths the UI serves itself (the API's bearer check does not apply)."""
    return path == "/" or path.startswith("/ui/")


def render_page(name: str, current_path: str = "") -> str:
    """The page `name` in the shell; the navigation entry for `current_path` (the path the
    page was asked for) is marked `aria-current="page"`."""
    head, body = ASSETS[name].read_text().split(BODY_SLOT + "\n", 1)
    if HEADER_SLOT in body:
        header = ASSETS[HEADER].read_text()
        if current_path:
            entry = f'<a href="{current_path}">'  # nav entries only: the brand link has a class
            header = header.replace(entry, entry[:-1] + ' aria-current="page">')
        body = body.replace(HEADER_SLOT + "\n", header)
    return ASSETS[SHELL].read_text().replace(HEAD_SLOT + "\n", head).replace(BODY_SLOT + "\n", body)


def _page(name: str, status: int = 200, message: str = "", current_path: str = "") -> web.Response:
    text = render_page(name, current_path)
    if message:
        text = text.replace(
            MESSAGE_SLOT, f'<p class="error" role="alert">{html.escape(message)}</p>'
        )
    response = web.Response(text=text, status=status, content_type="text/html", charset="utf-8")
    response.headers.update(SECURITY_HEADERS)
    response.headers["Cache-Control"] = "no-store"
    return response


def _signed_in(request: web.Request) -> bool:
    return session.cookie_principal(request, request.app[CONTROLLER].tokens) is not None


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={**SECURITY_HEADERS, "Location": location})


async def root(request: web.Request) -> web.StreamResponse:
    return _redirect(BAGS_PATH if _signed_in(request) else LOGIN_PATH)


async def login_form(request: web.Request) -> web.StreamResponse:
    return _page("login.html")


async def login(request: web.Request) -> web.StreamResponse:
    if not session.same_origin(request):
        return _page("login.html", 403, "This form was posted from another site; refused.")
    form = await request.post()
    token = str(form.get("token", "")).strip()
    controller = request.app[CONTROLLER]
    if not token:
        return _page("login.html", 401, "Enter a token.")
    if controller.tokens.authenticate(f"Bearer {token}") is None:
        return _page(
            "login.html",
            401,
            "That token is not valid: use the daemon's token (api.token, SPOTBAG_TOKEN or "
            "STATE_DIR/token) or an account token (sbt_...) that has not been revoked.",
        )
    response = _redirect(BAGS_PATH)
    session.set_session(response, request, token, controller.token)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    if not session.same_origin(request):
        return _page("login.html", 403, "This form was posted from another site; refused.")
    response = _redirect(LOGIN_PATH)
    session.clear_session(response)
    return response


def _shell(name: str) -> Handler:
    async def page(request: web.Request) -> web.StreamResponse:
        if not _signed_in(request):
            return _redirect(LOGIN_PATH)
        return _page(name, current_path=request.path)

    return page


async def asset(request: web.Request) -> web.StreamResponse:
    return _asset(ASSETS.get(request.match_info["name"]))


def _asset(path: Path | None) -> web.StreamResponse:
    if path is None or path.suffix == ".html":
        raise web.HTTPNotFound()
    content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if path.suffix == ".js":
        content_type = "text/javascript"  # some systems' tables say application/javascript
    response = web.Response(body=path.read_bytes(), content_type=content_type)
    response.headers.update(SECURITY_HEADERS)
    response.headers["Cache-Control"] = "no-cache"
    return response


async def vendored(request: web.Request) -> web.StreamResponse:
    """A vendored library's file (static/vendor/<library>/<file>), by the same allow-list."""
    name = f"vendor/{request.match_info['library']}/{request.match_info['file']}"
    return _asset(ASSETS.get(name))


def add_routes(app: web.Application) -> None:
    """Add the UI's routes to the daemon's app."""
    app.router.add_get("/", root)
    app.router.add_get(LOGIN_PATH, login_form)
    app.router.add_post(LOGIN_PATH, login)
    app.router.add_post("/ui/logout", logout)
    app.router.add_get(BAGS_PATH, _shell("bags.html"))
    app.router.add_get(BAGS_PATH + "/{bag_id}", _shell("bag.html"))
    app.router.add_get(BAGS_PATH + "/{bag_id}/timeline", _shell("timeline.html"))
    app.router.add_get(FLEET_PATH, _shell("fleet.html"))
    app.router.add_get(MONEY_PATH, _shell("money.html"))
    app.router.add_get(MARKET_PATH, _shell("market.html"))
    app.router.add_get("/ui/static/{name}", asset)
    app.router.add_get("/ui/static/vendor/{library}/{file}", vendored)
