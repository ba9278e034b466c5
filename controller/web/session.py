"""The browser's session: the token in a cookie, and the CSRF check of cookie requests.

The login form posts a token; once `Tokens.authenticate` accepts it (the same check
as the bearer header), it is put into the `spotbag_session` cookie: HttpOnly (page
scripts cannot read it), SameSite=Strict (other sites' pages never send it), Path=/,
Secure when the request came over HTTPS (or a proxy in front says so). The cookie
holds the token base64url-encoded, because an admin token may hold characters a cookie
value cannot. It never appears in a URL.

A browser sends the cookie by itself, so a request authenticated by it could be forged
by another page (CSRF). SameSite=Strict already stops that in current browsers; as a
second, independent guard a state-changing request (anything but GET/HEAD/OPTIONS)
authenticated by the cookie must also carry `X-CSRF-Token`, which only the daemon's
own pages can know: an HMAC of the session token, keyed by a digest of the daemon's
admin token (so it is stable across restarts, and a readable CSRF value reveals
nothing about the session token). The page reads it from the non-HttpOnly
`spotbag_csrf` cookie set at login. When the request names an `Origin`, its host must
be the daemon's (`same_origin`). Requests with a bearer header are unchanged: a
browser never sends that header on its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from urllib.parse import urlsplit

from aiohttp import web

from controller.tokens import Principal, Tokens

SESSION_COOKIE = "spotbag_session"
CSRF_COOKIE = "spotbag_csrf"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def encode_token(token: str) -> str:
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def decode_token(value: str) -> str | None:
    try:
        padded = value + "=" * (-len(value) % 4)
        # validate: a character outside the alphabet is an error, not skipped
        return base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True).decode()
    except (ValueError, binascii.Error, UnicodeError):
        return None


def session_token(request: web.Request) -> str | None:
    """The token the session cookie holds, or None."""
    value = request.cookies.get(SESSION_COOKIE)
    return decode_token(value) if value else None


def cookie_principal(request: web.Request, tokens: Tokens) -> Principal | None:
    """Who the session cookie stands for (the same Tokens check as the bearer header)."""
    token = session_token(request)
    if not token:
        return None
    return tokens.authenticate(f"Bearer {token}")


def csrf_token(admin_token: str, session: str) -> str:
    """The CSRF value of a session: HMAC-SHA256 of its token, keyed by the admin's."""
    key = hashlib.sha256(b"spotbag-csrf\0" + admin_token.encode()).digest()
    return hmac.new(key, session.encode(), hashlib.sha256).hexdigest()


def same_origin(request: web.Request) -> bool:
    """True unless the request names an Origin whose host is not the daemon's.

    Only the host (and port) is compared: behind a reverse proxy that ends TLS the page
    is https while the daemon hears http. A proxy that rewrites Host should pass the
    original in X-Forwarded-Host (a header no other site's page can make a browser send
    here without a CORS preflight, which the daemon never grants)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    host = urlsplit(origin).netloc
    return bool(host) and host in (request.host, request.headers.get("X-Forwarded-Host"))


def over_https(request: web.Request) -> bool:
    """Whether the browser reached the daemon over HTTPS (directly, or through a proxy
    that says so): then the cookies are Secure. Trusting the header can only add the
    flag, never take it away."""
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def csrf_problem(request: web.Request, admin_token: str) -> str | None:
    """Why a cookie-authenticated request may not change state; None when it may."""
    if request.method in SAFE_METHODS:
        return None
    if not same_origin(request):
        return f"cross-origin request from {request.headers.get('Origin')!r} refused"
    token = session_token(request) or ""
    given = request.headers.get(CSRF_HEADER, "")
    if not given or not hmac.compare_digest(
        given.encode(errors="surrogateescape"), csrf_token(admin_token, token).encode()
    ):
        return (
            f"a request authenticated by the session cookie must send the {CSRF_HEADER} "
            f"header (the {CSRF_COOKIE} cookie's value); log in again if the page is old"
        )
    return None


def set_session(response: web.StreamResponse, request: web.Request, token: str, admin: str) -> None:
    """Put `token` into the session cookie and its CSRF value into the readable one."""
    for name, value, httponly in (
        (SESSION_COOKIE, encode_token(token), True),
        (CSRF_COOKIE, csrf_token(admin, token), False),
    ):
        response.set_cookie(
            name, value, path="/", samesite="Strict", secure=over_https(request), httponly=httponly
        )


def clear_session(response: web.StreamResponse) -> None:
    for name in (SESSION_COOKIE, CSRF_COOKIE):
        response.del_cookie(name, path="/", samesite="Strict")
