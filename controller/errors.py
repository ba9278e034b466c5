"""Errors the API turns into JSON: `{"error": {"code", "message", "detail"}}` with a fitting status."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
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
