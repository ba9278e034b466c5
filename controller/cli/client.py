"""A small synchronous client of the spotbag HTTP API (used by the CLI).

Where to connect and with which token: explicit arguments, else SPOTBAG_URL /
SPOTBAG_TOKEN, else the files a daemon on this host writes into its state
directory (api.url, token), else http://127.0.0.1:8787.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.errors import SpotbagError

DEFAULT_URL = "http://127.0.0.1:8787"


class ClientError(SpotbagError):
    """The API answered with an error (status, code, message) or could not be reached (status 0)."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail or {}


def _q(identifier: str) -> str:
    """An id as one path segment (a '/' or '?' in it must not change the route)."""
    return urllib.parse.quote(identifier, safe="")


def default_state_dir() -> Path:
    for candidate in (os.environ.get("SPOTBAG_STATE_DIR"), os.environ.get("STATE_DIRECTORY")):
        if candidate:
            return Path(candidate.split(":")[0]).expanduser()
    return Path.home() / ".local" / "state" / "spotbag"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass
class Client:
    url: str
    token: str
    timeout_s: float = 60.0

    @classmethod
    def discover(
        cls,
        url: str | None = None,
        token: str | None = None,
        state_dir: str | os.PathLike | None = None,
    ) -> Client:
        state = Path(state_dir).expanduser() if state_dir else default_state_dir()
        url = url or os.environ.get("SPOTBAG_URL") or _read(state / "api.url") or DEFAULT_URL
        token = token or os.environ.get("SPOTBAG_TOKEN") or _read(state / "token")
        return cls(url.rstrip("/"), token)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        raw: bool = False,
        answers: tuple[int, ...] = (),
    ) -> Any:
        """The route's JSON answer (with `raw`: its bytes and headers); an error status
        raises ClientError, except those in `answers`, whose JSON is returned too."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        all_headers = {"Accept": "application/json", **(headers or {})}
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        # Imported here: urllib.request brings http.client, email and ssl (~35 ms of CPU),
        # which the offline commands (fit, simulate, ...) import this module without using.
        from urllib.request import Request, urlopen

        request = Request(url, data=data, method=method, headers=all_headers)
        try:
            with urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
                if raw:
                    return payload, dict(response.headers)
                return json.loads(payload) if payload else None
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            if exc.code in answers:
                return json.loads(payload)
            try:
                error = json.loads(payload)["error"]
                raise ClientError(
                    exc.code, error["code"], error["message"], error.get("detail")
                ) from None
            except (ValueError, KeyError, TypeError):
                raise ClientError(
                    exc.code, "http_error", f"HTTP {exc.code}: {payload[:200]!r}"
                ) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(
                0,
                "unreachable",
                f"cannot reach the spotbag daemon at {self.url} ({reason}); "
                "is it running (spotbag serve)? Set --url or SPOTBAG_URL.",
            ) from None

    # --- the API, one method per route ----------------------------------------------------

    def health(self) -> dict[str, Any]:
        """GET /healthz: 200, or the 503 of a daemon starting or failing (`status` says)."""
        return self.request("GET", "/healthz", answers=(503,))

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self.request("POST", "/v1/bags", body=spec, headers=headers)

    def bags(self, state: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/bags", query={"state": state, "limit": limit})["bags"]

    def bag(self, bag_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/bags/{_q(bag_id)}")

    def cancel(self, bag_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/bags/{_q(bag_id)}/cancel")

    def jobs(
        self, bag_id: str, state: str | None = None, after: int | None = None, limit: int = 100
    ) -> dict[str, Any]:
        return self.request(
            "GET",
            f"/v1/bags/{_q(bag_id)}/jobs",
            query={"state": state, "after": after, "limit": limit},
        )

    def job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{_q(job_id)}")

    def log(
        self, job_id: str, attempt: int | None = None, offset: int = 0
    ) -> tuple[bytes, dict[str, str]]:
        return self.request(
            "GET",
            f"/v1/jobs/{_q(job_id)}/log",
            query={"attempt": attempt, "offset": offset},
            raw=True,
        )

    def vms(self, include_ended: bool = False, limit: int | None = None) -> dict[str, Any]:
        query = {"all": "true" if include_ended else None, "limit": limit}
        return self.request("GET", "/v1/vms", query=query)

    def hopping(self, limit: int = 200) -> dict[str, Any]:
        return self.request("GET", "/v1/hopping", query={"limit": limit})

    def preempt(self, vm_id: str, notice_s: int = 0) -> dict[str, Any]:
        query = f"?notice_s={notice_s}" if notice_s else ""
        return self.request("POST", f"/v1/vms/{_q(vm_id)}/preempt{query}")

    def rebalance(self, vm_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/vms/{_q(vm_id)}/rebalance")

    def accounts(self) -> dict[str, Any]:
        return self.request("GET", "/v1/accounts")

    def create_account(
        self,
        name: str,
        cpu_hours: float = 0.0,
        unlimited: bool = False,
        note: str = "",
        budget_usd: float | None = None,
        notify: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name,
            "cpu_hours": cpu_hours,
            "unlimited": unlimited,
            "note": note,
        }
        if budget_usd is not None:
            body["budget_usd"] = budget_usd
        if notify:
            body["notify"] = notify
        return self.request("POST", "/v1/accounts", body=body)

    def set_account_budget(self, name: str, budget_usd: float | None) -> dict[str, Any]:
        return self.set_account(name, {"budget_usd": budget_usd})

    def set_account(self, name: str, change: dict[str, Any]) -> dict[str, Any]:
        """PATCH an account: `budget_usd`, `notify` or both."""
        return self.request("PATCH", f"/v1/accounts/{_q(name)}", body=change)

    def set_bag_budget(self, bag_id: str, budget_usd: float | None) -> dict[str, Any]:
        return self.request("PATCH", f"/v1/bags/{_q(bag_id)}", body={"budget_usd": budget_usd})

    def events(
        self,
        bag: str | None = None,
        kind: str | None = None,
        since: int | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> dict[str, Any]:
        query = {"bag": bag, "kind": kind, "since": since, "after": after, "limit": limit}
        return self.request("GET", "/v1/events", query=query)

    def credit(self, name: str, cpu_hours: float, note: str = "") -> dict[str, Any]:
        body = {"cpu_hours": cpu_hours, "note": note}
        return self.request("POST", f"/v1/accounts/{_q(name)}/credit", body=body)

    def account(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/accounts/{_q(name)}")

    def ledger(self, name: str, after: int = 0, limit: int = 1000, csv: bool = False) -> Any:
        query = {"after": after, "limit": limit, "format": "csv" if csv else None}
        if csv:
            return self.request("GET", f"/v1/accounts/{_q(name)}/ledger", query=query, raw=True)
        return self.request("GET", f"/v1/accounts/{_q(name)}/ledger", query=query)

    def create_token(self, account: str, note: str = "") -> dict[str, Any]:
        return self.request("POST", f"/v1/accounts/{_q(account)}/tokens", body={"note": note})

    def tokens(self, account: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/accounts/{_q(account)}/tokens")

    def revoke_token(self, account: str, token_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/accounts/{_q(account)}/tokens/{_q(token_id)}")

    def report(self, bag: str | None = None, account: str | None = None, fmt: str = "json") -> Any:
        """A cost report (dict for json; (bytes, headers) for csv and html)."""
        query = {"bag": bag, "account": account, "format": fmt}
        return self.request("GET", "/v1/reports", query=query, raw=fmt != "json")
