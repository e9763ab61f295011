"""Errors as ``application/problem+json`` (RFC 9457), each with a message a person can act on."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Send

from conveyor.core.lifecycle import IllegalTransition
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    DatabaseUnavailable,
    Forbidden,
    IdempotencyConflict,
    InvalidDependency,
    InvalidPayload,
    InvalidState,
    JobNotFound,
    ScheduleNotFound,
    TokenNotFound,
    TooManyQueued,
    UnknownJobType,
)

log = logging.getLogger("conveyor.web")

PROBLEM_JSON = "application/problem+json"
# Seconds a client should wait before trying again after a 503 or a 429.
RETRY_AFTER = "2"


class FieldError(BaseModel):
    """One invalid field: where it is, what is wrong, and pydantic's error type."""

    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """An error (RFC 9457): ``title`` names the kind, ``detail`` says what to do."""

    type: str = Field("about:blank", description="A URI naming the kind of problem.")
    title: str = Field(description="The HTTP status phrase.")
    status: int = Field(description="The HTTP status code.")
    detail: str = Field(description="What went wrong and what to do about it.")
    instance: str | None = Field(None, description="The path of the request.")
    errors: list[FieldError] | None = Field(
        None, description="The invalid fields, for 422 answers."
    )


class ProblemError(StarletteHTTPException):
    """An HTTP error answered as a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(status_code=status, detail=detail, headers=headers)
        self.errors = errors


def problem_body(
    status: int, detail: str, instance: str | None, errors: list[dict[str, Any]] | None = None
) -> bytes:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors is not None:
        body["errors"] = errors
    return json.dumps(body, separators=(",", ":")).encode()


def problem(
    status: int,
    detail: str,
    instance: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> Response:
    return Response(
        problem_body(status, detail, instance, errors),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


async def send_problem(send: Send, status: int, detail: str, instance: str | None) -> None:
    """Answer with a problem from plain ASGI (middleware that runs before routing)."""
    body = problem_body(status, detail, instance)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of these error codes, as problem documents."""
    return {
        code: {
            "description": f"{HTTPStatus(code).phrase} (a problem document saying what to do)",
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for code in codes
    }


# Which conveyor error is which HTTP status.
_STATUS: list[tuple[type[Exception], int]] = [
    (JobNotFound, 404),
    (TokenNotFound, 404),
    (ScheduleNotFound, 404),
    (Forbidden, 403),
    (IdempotencyConflict, 409),
    (TooManyQueued, 429),
    (InvalidState, 409),
    (IllegalTransition, 409),
    (UnknownJobType, 422),
    (InvalidPayload, 422),
    (InvalidDependency, 422),
    (ConfigurationError, 422),
    (DatabaseUnavailable, 503),
]


def _field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = [p if isinstance(p, int) else str(p) for p in err.get("loc", ())]
        out.append({"loc": loc, "msg": str(err.get("msg", "")), "type": str(err.get("type", ""))})
    return out


def _describe(errors: list[dict[str, Any]]) -> str:
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err["loc"] if p not in ("query", "path", "header"))
        parts.append(f"{where or 'request'}: {err['msg']}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


def install_handlers(api: FastAPI) -> None:
    """Answer every error, expected or not, with a problem document."""

    async def on_http(request: Request, exc: Exception) -> Response:
        exc = cast(StarletteHTTPException, exc)
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        if exc.status_code == 404 and not isinstance(exc, ProblemError):
            detail = f"no route {request.url.path!r}: see /openapi.json for the API's routes"
        elif exc.status_code == 405 and not isinstance(exc, ProblemError):
            detail = f"{request.method} is not allowed on {request.url.path!r}"
        errors = exc.errors if isinstance(exc, ProblemError) else None
        return problem(
            exc.status_code,
            detail,
            request.url.path,
            headers=dict(exc.headers or {}),
            errors=errors,
        )

    async def on_validation(request: Request, exc: Exception) -> Response:
        errors = _field_errors(cast(RequestValidationError, exc))
        return problem(422, _describe(errors), request.url.path, errors=errors)

    async def on_conveyor(request: Request, exc: Exception) -> Response:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 400)
        errors = exc.errors if isinstance(exc, InvalidPayload) and exc.errors else None
        # An API client cannot register a handler: tell it what the server runs instead.
        detail = exc.for_client if isinstance(exc, UnknownJobType) else str(exc)
        # The database is down or slow: say when to try again.
        headers = {"Retry-After": RETRY_AFTER} if status == 503 else None
        return problem(status, detail, request.url.path, headers=headers, errors=errors)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return problem(
            500,
            "the server failed unexpectedly; the error is in its log. Retry later, and "
            "report it if it persists",
            request.url.path,
        )

    api.add_exception_handler(StarletteHTTPException, on_http)
    api.add_exception_handler(RequestValidationError, on_validation)
    api.add_exception_handler(ConveyorError, on_conveyor)
    api.add_exception_handler(IllegalTransition, on_conveyor)
    api.add_exception_handler(Exception, on_unexpected)


def status_of(exc: Exception) -> int:
    """The HTTP status of a conveyor error (400 for one not listed)."""
    return next((code for kind, code in _STATUS if isinstance(exc, kind)), 400)
