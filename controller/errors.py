"""The root of spotbag's errors, and the errors the API turns into JSON:
`{"error": {"code", "message", "detail"}}` with a fitting status.

Every exception class of controller/ derives from SpotbagError (tests/test_architecture.py
checks it), so the API and the CLI map any of them in one place: the API answers
`status` with `code` (a 5xx other than 503 as a logged internal error), the CLI prints
the message and exits with `exit_code`. drivers/ and policies/ stand alone (they import
nothing of the controller) and keep their own roots, DriverError and
InsufficientCredit; the controller turns those into its own errors where they cross
into the API.
"""

from __future__ import annotations

from typing import Any


class SpotbagError(Exception):
    """Root of spotbag's errors. Subclasses set what a caller sees by default."""

    status = 500  # the HTTP status the API answers with when this reaches it
    code = "error"  # machine-readable, in the API's error body
    exit_code = 1  # the CLI's exit status when this reaches it


class ApiError(SpotbagError):
    status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        detail: Any = None,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail if detail is not None else {}
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "detail": self.detail}}


class InvalidBag(ApiError):
    status = 400
    code = "invalid_bag"


class NoVmTypeFits(ApiError):
    status = 422
    code = "no_vm_type_fits"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class InsufficientBalance(ApiError):
    status = 402
    code = "insufficient_balance"


class Forbidden(ApiError):
    status = 403
    code = "forbidden"
