"""The web UI the daemon serves (`GET /` and /ui/...): pages for people, on the /v1 API.

- pages.py: the routes (login form, page shells, static assets) and their security
  headers (Content-Security-Policy, nosniff);
- session.py: the token in an HttpOnly, SameSite=Strict cookie, and the CSRF check the
  API's auth middleware applies to state-changing requests authenticated by it;
- static/: plain HTML, CSS and ES modules (no build step, nothing fetched from outside
  the daemon); each page's module calls the same /v1 JSON API the CLI uses.

Part of the daemon core: it imports neither the CLI nor the offline tools.
"""

from controller.web.pages import add_routes, is_ui_path

__all__ = ["add_routes", "is_ui_path"]
