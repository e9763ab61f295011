"""The OpenAPI document is exact: schemathesis generates requests for every operation and
checks that no answer is a 5xx and that every answer (code, headers, content type, body)
is one the document declares. The run is bounded to stay fast."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.core.result import Err

from conveyor import Conveyor
from tests.apiserver import api_for_tests, serving
from tests.apps.api import build

EXAMPLES_PER_OPERATION = 15


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    yield application
    await application.close()


@pytest.mark.parametrize("role", ["read", "write", "admin"])
async def test_every_operation_conforms_to_the_openapi_document(app: Conveyor, role: str) -> None:
    """With each role's token: a token that may not call an operation gets a documented
    answer (403) there, never an undocumented one."""
    _, secret = await app.create_token(tenant="acme", role=role)
    job = await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
    done = await app.submit("add", {"a": 3, "b": 4}, tenant="acme")
    await app.cancel(done.id)
    api = api_for_tests(app)
    with serving(app, api) as server:
        failures = await asyncio.to_thread(
            _run_schemathesis, server.base_url, secret, [job.id, done.id]
        )
    assert not failures, "\n\n".join(failures)


def _run_schemathesis(base_url: str, secret: str, known_ids: list[str]) -> list[str]:
    headers = {"Authorization": f"Bearer {secret}"}
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers)
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # the API's own schema is invalid: say where
        operations.append(result.ok())
    assert len(operations) >= 14
    for operation in operations:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case: schemathesis.Case[Any]) -> None:
            generated = str((case.path_parameters or {}).get("job_id", ""))
            if generated and len(generated) % 2:
                # About half the time a job that exists, so that 200 answers are checked too.
                case.path_parameters["job_id"] = known_ids[len(generated) % len(known_ids)]
            if case.query:
                # A cursor is opaque: only one the server handed out is valid.
                case.query.pop("cursor", None)
                # A long poll is valid up to a minute: keep the run short.
                if isinstance(case.query.get("wait"), int | float):
                    case.query["wait"] = min(case.query["wait"], 0.2)
            # That a job may only wait for jobs that exist cannot be said in a schema.
            for item in case.body if isinstance(case.body, list) else [case.body]:
                if isinstance(item, dict):
                    item.pop("depends_on", None)
            case.call_and_validate(base_url=base_url, headers=headers)

        try:
            check()
        except Exception as exc:
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    return failures
