"""The API's OpenAPI document: the routes' own schemas, plus one submission per job type.

The document is built when first asked for, so job types registered after
:func:`~conveyor.web.create_api` are in it, and it states the limits of the API's options
(the longest ``?wait=``, the largest list of jobs).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from conveyor.app.client import Conveyor
from conveyor.web import _schemas as s
from conveyor.web._problems import FieldError, Problem, problem_responses

if TYPE_CHECKING:
    from conveyor.web._app import ApiOptions

DESCRIPTION = """\
Submit durable background jobs and follow them to their end.

`POST /jobs` answers `202 Accepted` with `Location: /jobs/{id}`; `GET /jobs/{id}` reports
status, progress and result. Poll it with `If-None-Match` (304 while unchanged) after
`Retry-After` seconds, or long-poll with `?wait=SECONDS`.

Every route but `/health/*` needs `Authorization: Bearer <token>`. A token belongs to a
tenant and has a role: `read`, `write` (submit, cancel, retry) or `admin` (every tenant,
and queue operations). Another tenant's job answers 404. Errors are
`application/problem+json` documents whose `detail` says what to do.
"""


def header(description: str) -> dict[str, Any]:
    """A response header's description, for a route's ``responses``."""
    return {"description": description, "schema": {"type": "string"}}


def submit_body(max_batch: int) -> dict[str, Any]:
    """The request body of ``POST /jobs``: one submission, or a list of them."""
    one = {"$ref": "#/components/schemas/JobSubmission"}
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        one,
                        {"type": "array", "items": one, "minItems": 1, "maxItems": max_batch},
                    ]
                },
                "example": {"type": "send_email", "payload": {"to": "a@b.c", "subject": "hi"}},
            }
        },
    }


def install(api: FastAPI, app: Conveyor, options: ApiOptions) -> None:
    """Replace ``api.openapi`` with the customised document, built once on first use."""

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = get_openapi(
                title=api.title,
                version=api.version,
                summary=api.summary,
                description=api.description,
                routes=api.routes,
            )
            _, extra = models_json_schema(
                [
                    (Problem, "validation"),
                    (FieldError, "validation"),
                    (s.JobSubmission, "validation"),
                ],
                ref_template="#/components/schemas/{model}",
            )
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in extra.get("$defs", {}).items():
                schemas.setdefault(name, definition)
            _submission_variants(app, schemas)
            _state_limits(schema, options)
            _fair_share(schema)
            api.openapi_schema = schema
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


def _fair_share(schema: dict[str, Any]) -> None:
    """Every operation that may reach the database may answer 429: its tenant has as many
    requests in progress as it may have at once (web/_shares.py)."""
    busy = problem_responses(429)[429]
    busy["headers"] = {"Retry-After": header("Seconds before sending more.")}
    for path, operations in schema.get("paths", {}).items():
        if path == "/health/live":
            continue
        for operation in operations.values():
            operation.setdefault("responses", {}).setdefault("429", busy)


def _state_limits(schema: dict[str, Any], options: ApiOptions) -> None:
    """Write this API's ``max_wait`` and ``max_batch`` where the routes declare defaults."""
    paths = schema.get("paths", {})
    for parameter in paths.get("/jobs/{job_id}", {}).get("get", {}).get("parameters", []):
        if parameter.get("name") == "wait":
            parameter["schema"]["maximum"] = options.max_wait
    submit = paths.get("/jobs", {}).get("post", {})
    if "requestBody" in submit:
        submit["requestBody"] = submit_body(options.max_batch)


def _submission_variants(app: Conveyor, schemas: dict[str, Any]) -> None:
    """Document one submission per registered job type, with its payload's own schema.

    Strings carry the API's NUL-free pattern.
    """
    base = schemas["JobSubmission"]
    variants = []
    for name in app.registry.names():
        payload = app.registry.get(name).model.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        for def_name, definition in payload.pop("$defs", {}).items():
            schemas.setdefault(def_name, _no_nul(definition))
        key = "Payload_" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        schemas[key] = _no_nul(payload)
        properties = {
            **base["properties"],
            "type": {"const": name, "type": "string", "title": "Type"},
            "payload": {"$ref": f"#/components/schemas/{key}"},
        }
        variants.append(
            {
                "type": "object",
                "title": f"Submit {name}",
                "properties": properties,
                "required": ["type", "payload"] if payload.get("required") else ["type"],
                "additionalProperties": False,
            }
        )
    if variants:
        schemas["JobSubmission"] = {
            "title": "JobSubmission",
            "description": base.get("description", ""),
            "oneOf": variants,
        }


def _no_nul(node: Any) -> Any:
    """Add the NUL-free pattern to every string schema without a pattern of its own."""
    if isinstance(node, dict):
        out = {k: _no_nul(v) for k, v in node.items()}
        if out.get("type") == "string" and "pattern" not in out and "format" not in out:
            out["pattern"] = s.NUL_FREE
        return out
    if isinstance(node, list):
        return [_no_nul(v) for v in node]
    return node
