"""A handler's arguments from a stored payload: the plain handlers' way without pydantic
gives exactly what the payload model gives, and a worker of plain handlers never imports
pydantic."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest

from conveyor import JobContext, Status
from conveyor.app.registry import JobOptions, JobType, _plain_fields
from conveyor.core.jsontext import strict_compact
from conveyor.errors import InvalidPayload
from tests.processes import WorkerProcesses, wait_exit


def _job_type(fn: Any) -> JobType:
    return JobType(fn, JobOptions(name=fn.__name__))


def plain(
    ctx: JobContext,
    s: str,
    n: int,
    x: float,
    b: bool,
    anything,  # no annotation: Any
    d: int = 3,
    label: str = "x",
    maybe: Any = None,
) -> None: ...


def plain_with_kwargs(ctx: JobContext, n: int, **rest: Any) -> None: ...


FULL = {"s": "a", "n": 1, "x": 1.5, "b": True, "anything": [1, {"k": None}]}
PAYLOADS = [
    FULL,
    FULL | {"d": 4, "label": "y", "maybe": {"deep": [1]}},
    FULL | {"x": 2},  # an int for a float: the model converts it
    FULL | {"n": True},  # a bool for an int
    FULL | {"n": 1.0},  # a whole float for an int
    FULL | {"n": "5"},  # a numeric string for an int
    FULL | {"x": "1.5"},
    FULL | {"s": 5},
    FULL | {"b": 1},
    FULL | {"b": "true"},
    FULL | {"s": None},
    FULL | {"d": None},
    FULL | {"unknown": 1},
    {k: v for k, v in FULL.items() if k != "n"},  # a required argument missing
    {k: v for k, v in FULL.items() if k != "anything"},
    {},
]


def _through_the_model(job_type: JobType, payload: dict[str, Any]) -> dict[str, Any] | str:
    """What the payload model makes of ``payload``: the arguments, or the error's text."""
    import pydantic

    try:
        model = job_type.model.__pydantic_validator__.validate_python(dict(payload))
    except pydantic.ValidationError as exc:
        return f"invalid: {exc.error_count()} errors"
    return dict(model.__dict__) | (model.__pydantic_extra__ or {})


def _arguments(job_type: JobType, payload: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return job_type.arguments(payload)
    except InvalidPayload as exc:
        return f"invalid: {len(exc.errors)} errors"


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_a_plain_handlers_arguments_are_what_its_model_gives(payload: dict[str, Any]) -> None:
    job_type = _job_type(plain)
    got = _arguments(job_type, payload)
    expected = _through_the_model(job_type, payload)
    assert got == expected
    if isinstance(got, dict):  # the same values, of the same types
        assert {k: type(v) for k, v in got.items()} == {
            k: type(v)
            for k, v in expected.items()  # type: ignore[union-attr]
        }


FLAT = {"s": "a", "n": 1, "x": 1.5, "b": True, "anything": "z"}
FLAT_PAYLOADS: list[dict[str, Any]] = [
    FLAT,
    {"anything": None, "b": False, "x": -0.0, "n": -7, "s": ""},  # another order
    FLAT | {"d": 4, "label": "y", "maybe": 2.5},
    FLAT | {"label": "x"},  # a default given: kept, as the model keeps what was set
    FLAT | {"anything": 3, "maybe": None},
    FLAT | {"s": "tab\tand\x01control"},
    FLAT | {"x": 2},
    FLAT | {"n": True},
    FLAT | {"n": 1.0},
    FLAT | {"n": "5"},
    FLAT | {"s": 5},
    FLAT | {"b": 1},
    FLAT | {"s": None},
    FLAT | {"d": None},
    FLAT | {"unknown": 1},
    {k: v for k, v in FLAT.items() if k != "n"},
    {k: v for k, v in FLAT.items() if k != "anything"},
    {"s": "a"},
]


def _checked_by_the_model(job_type: JobType, payload: dict[str, Any]) -> Any:
    """What a submit's check makes of ``payload`` through the payload model alone: the
    model's dump and its text, or the error's text."""
    import pydantic

    try:
        data = job_type.model.model_validate(payload).model_dump(mode="json", exclude_unset=True)
    except pydantic.ValidationError as exc:
        return f"invalid: {exc.error_count()} errors"
    return data, strict_compact(data)


@pytest.mark.parametrize("payload", FLAT_PAYLOADS, ids=range(len(FLAT_PAYLOADS)))
def test_a_plain_handlers_payload_is_checked_as_its_model_checks_it(
    payload: dict[str, Any],
) -> None:
    """A submit's check of a plain handler's flat payload skips the model when the payload
    is exactly its arguments: the same payload, text (key order too) and value types."""
    job_type = _job_type(plain)
    try:
        got: Any = job_type.validate_text(payload)
    except InvalidPayload as exc:
        got = f"invalid: {len(exc.errors)} errors"
    expected = _checked_by_the_model(job_type, payload)
    assert got == expected
    if isinstance(got, tuple):
        assert [(k, type(v)) for k, v in got[0].items()] == [
            (k, type(v)) for k, v in expected[0].items()
        ]


def test_a_plain_handlers_batch_is_checked_as_its_model_checks_it() -> None:
    """A batch's check (submit_many) takes the same way: the payloads the model would keep
    as they are need no model; a batch with any other goes through the model, which
    converts them or raises for the first bad one."""
    job_type = _job_type(plain)
    for batch in (FLAT_PAYLOADS[:6], FLAT_PAYLOADS[:7], FLAT_PAYLOADS):
        expected = [_checked_by_the_model(job_type, p) for p in batch]
        try:
            data, texts = job_type.validate_many_text(batch)
        except InvalidPayload as exc:
            first_bad = next(e for e in expected if isinstance(e, str))
            assert first_bad == f"invalid: {len(exc.errors)} errors"
            continue
        assert list(zip(data, texts, strict=True)) == expected
        for got, (want, _) in zip(data, expected, strict=True):
            assert [(k, type(v)) for k, v in got.items()] == [(k, type(v)) for k, v in want.items()]


def test_a_plain_handlers_exact_payloads_build_no_model() -> None:
    """Payloads of exactly a plain handler's argument types, one or a batch, are checked
    without its payload model, which is built only for a payload that needs it."""
    job_type = _job_type(plain)
    job_type.validate_text(FLAT)
    job_type.validate_many_text([FLAT, FLAT_PAYLOADS[1]])
    assert job_type._model is None
    job_type.validate_text(FLAT | {"x": 2})  # an int for a float: the model converts it
    assert job_type._model is not None


@pytest.mark.parametrize(
    "payload", [{"n": 1}, {"n": 1, "extra": "kept"}, {"n": "1", "extra": 2}, {"extra": 1}]
)
def test_a_plain_handler_with_kwargs_takes_the_models_extra_arguments(
    payload: dict[str, Any],
) -> None:
    job_type = _job_type(plain_with_kwargs)
    assert _arguments(job_type, payload) == _through_the_model(job_type, payload)


def loose_defaults(ctx: JobContext, n: int, x: float = 1, s: str = None) -> None: ...  # type: ignore[assignment]  # noqa: RUF013


@pytest.mark.parametrize("payload", [{"n": 1}, {"n": 1, "x": 2.5}, {"n": 1, "s": "y"}, {"x": 1.0}])
def test_defaults_of_another_type_are_given_as_the_model_gives_them(
    payload: dict[str, Any],
) -> None:
    """pydantic does not check a default: an argument left out gets it as it is (an int
    for a float, None for a str), on the model's way and without it alike."""
    job_type = _job_type(loose_defaults)
    got, expected = _arguments(job_type, payload), _through_the_model(job_type, payload)
    assert got == expected
    if isinstance(got, dict):
        assert {k: type(v) for k, v in got.items()} == {
            k: type(v)
            for k, v in expected.items()  # type: ignore[union-attr]
        }


def test_the_arguments_are_a_new_dict_each_time() -> None:
    job_type = _job_type(plain)
    stored = dict(FULL)
    arguments = job_type.arguments(stored)
    arguments["s"] = "changed"
    assert stored == FULL
    assert job_type.arguments({**FULL})["d"] == 3


def test_which_signatures_are_plain() -> None:
    def fields(**annotated: Any) -> dict[str, tuple[Any, Any]]:
        return {name: (annotation, ...) for name, annotation in annotated.items()}

    assert _plain_fields(fields(a=str, b=int, c=float, d=bool, e=Any)) is not None
    # Anything pydantic converts or that a JSON value does not hold as it is: the model.
    for annotation in (list, dict, list[int], dict[str, int], int | None, datetime, bytes, object):
        assert _plain_fields(fields(a=annotation)) is None, annotation
    # Names pydantic does not take as fields, and a default pydantic would share.
    assert _plain_fields(fields(_private=int)) is None
    assert _plain_fields(fields(model_config=int)) is None
    assert _plain_fields({"a": (Any, [])}) is None
    assert _plain_fields({"a": (int, 1), "b": (str, None)}) == (
        {"a": int, "b": str},
        {"a": 1, "b": None},
    )


IMPORTS = """
import sys
from conveyor import Conveyor
app = Conveyor("sqlite:///unused.db")
@app.job()
def plain(ctx, n: int, x: float = 1.0) -> None: ...
job_type = app.registry.get("plain")
print(job_type.arguments({"n": 1}), "pydantic" in sys.modules)
print(job_type.validate_text({"n": 2}), "pydantic" in sys.modules)
print(job_type.validate_many_text([{"n": 3}, {"x": 0.5, "n": 4}]), "pydantic" in sys.modules)
print(job_type.arguments({"n": 1.0}), "pydantic" in sys.modules)
"""

OTHER = """
import sys
from datetime import datetime
from conveyor import Conveyor
app = Conveyor("sqlite:///unused.db")
@app.job()
def dated(ctx, when: datetime) -> None: ...
print("pydantic" in sys.modules)
"""


def test_plain_handlers_are_registered_and_called_without_pydantic(tmp_path: Any) -> None:
    # A fresh interpreter: this one has pydantic loaded. Submits' checks of payloads of
    # exactly the arguments' types need no model either. Only a payload the stored value
    # does not fit (1.0 for an int) brings in the model, and pydantic with it.
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.splitlines() == [
        "{'x': 1.0, 'n': 1} False",
        """({'n': 2}, '{"n":2}') False""",
        """([{'n': 3}, {'n': 4, 'x': 0.5}], ['{"n":3}', '{"n":4,"x":0.5}']) False""",
        "{'n': 1, 'x': 1.0} True",
    ]


def test_other_handlers_build_their_model_at_registration(tmp_path: Any) -> None:
    # So that a signature pydantic cannot check fails when the handler is registered.
    out = subprocess.run(
        [sys.executable, "-c", OTHER], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "True"


@pytest.mark.processes
async def test_a_worker_of_plain_handlers_runs_their_jobs_without_pydantic(
    db_url: str, workers: WorkerProcesses
) -> None:
    from tests.apps import plain as plain_app

    app = plain_app.app
    app.url = db_url
    await app.migrate()
    try:
        scaled = await app.submit("scale", {"x": 1.5})
        flagged = await app.submit("flag", {"on": True})
        converted = await app.submit("scale", {"x": 2, "factor": 3})  # stored as 2.0
        proc = workers.start("--burst", app="tests.apps.plain:app")
        assert await wait_exit(proc, 60) == 0, workers.log(0)
        for handle in (scaled, flagged, converted):
            await handle.refresh()
            assert handle.status is Status.SUCCEEDED, workers.log(0)
        assert scaled.result == {"value": 3.0, "label": "scaled", "pydantic": False}
        assert flagged.result == {"on": True, "pydantic": False}
        assert converted.result == {"value": 6.0, "label": "scaled", "pydantic": False}
    finally:
        await app.close()
