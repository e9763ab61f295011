"""Job types: a handler with its options and the payload model built from its signature."""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from conveyor.core.auth import Principal
from conveyor.core.durations import Duration, seconds
from conveyor.core.jsontext import plain_text, strict_compact, strict_compact_each
from conveyor.core.retry import Backoff
from conveyor.errors import ConfigurationError, InvalidPayload, UnknownJobType

if TYPE_CHECKING:
    import pydantic
else:
    # Imported with the first payload model (_import_pydantic): a worker whose handlers
    # take JSON's plain values runs its jobs without pydantic, and its start-up does not
    # wait the quarter of a second pydantic's import and first model cost.
    pydantic = None

Handler = Callable[..., Any]
# May the principal submit this payload? False or an exception refuses; may be async.
Authorize = Callable[[Principal, dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Per-type options, validated when built."""

    name: str
    queue: str = "default"
    max_attempts: int = 3
    timeout: float | None = None
    lease: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    priority: int = 0
    non_retryable: tuple[type[BaseException], ...] = ()
    isolation: str | None = None  # None: on the worker; "process": in a child process
    # An extra check for submits through the REST API: (principal, payload) -> bool.
    authorize: Authorize | None = None
    concurrency: int | None = None  # at most this many at once per worker process
    global_concurrency: int | None = None  # at most this many running across the cluster
    key_concurrency: int | None = None  # at most this many running per concurrency_key
    rate_limit: tuple[int, float] | None = None  # at most N starts per window, cluster-wide
    retention: tuple[tuple[str, float], ...] = ()  # (status, seconds) overrides
    retry_limit: int | None = 10  # manual retries of a job (a chain); None: no limit

    def __post_init__(self) -> None:
        for option in ("concurrency", "global_concurrency", "key_concurrency"):
            value = getattr(self, option)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigurationError(
                    f"{option} of {self.name!r} must be a positive integer, not {value!r}"
                )
        if self.retry_limit is not None and (
            not isinstance(self.retry_limit, int) or self.retry_limit < 0
        ):
            raise ConfigurationError(
                f"retry_limit of {self.name!r} must be a whole number of retries, 0 or more, "
                f"or None for no limit; not {self.retry_limit!r}"
            )
        for status, _seconds in self.retention:
            if status not in ("succeeded", "failed", "cancelled"):
                raise ConfigurationError(
                    f"retention of {self.name!r}: {status!r} is not a final status; use "
                    "succeeded, failed or cancelled"
                )
        if self.authorize is not None and not callable(self.authorize):
            raise ConfigurationError(
                f"authorize of {self.name!r} takes a function (principal, payload) -> bool, "
                f"not {self.authorize!r}"
            )
        if self.isolation not in (None, "process"):
            raise ConfigurationError(
                f"isolation of {self.name!r} must be None or 'process', not {self.isolation!r}"
            )
        if not self.name or len(self.name) > 200:
            raise ConfigurationError("a job type name must be 1 to 200 characters")
        check_queue(self.queue)
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(
                f"max_attempts of {self.name!r} must be an integer of at least 1, "
                f"not {self.max_attempts!r}"
            )
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError(f"timeout of {self.name!r} must be positive")
        if self.lease is not None and self.lease < 0.3:
            raise ConfigurationError(f"lease of {self.name!r} must be at least 0.3 seconds")
        for exc in self.non_retryable:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ConfigurationError(
                    f"non_retryable of {self.name!r} takes exception classes, not {exc!r}"
                )


def check_queue(queue: object) -> None:
    if not isinstance(queue, str) or not queue or len(queue) > 100 or "\x00" in queue:
        raise ConfigurationError(f"a queue name must be 1 to 100 characters, not {queue!r}")


def optional_seconds(value: Duration | None, what: str) -> float | None:
    """Parse an optional duration option, naming the option in the error."""
    if value is None:
        return None
    try:
        return seconds(value)
    except ValueError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None


def importable_name(fn: Handler, name: str) -> tuple[str, str]:
    """Return the module and qualified name a child process imports a handler by."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        raise ConfigurationError(
            f"handler {name!r} has isolation='process' but a child process cannot import "
            "it: define it at the top level of an importable module (not in __main__ or "
            "inside a function)"
        )
    return module, qualname


class JobType:
    """A registered handler: its options, its payload model and how to call it."""

    def __init__(self, fn: Handler, options: JobOptions) -> None:
        self.fn = fn
        self.options = options
        self.name = options.name
        self.is_async = inspect.iscoroutinefunction(fn)
        self._fields, self._extra = _payload_fields(fn, options.name)
        # A handler of ctx alone, called with an empty payload: nothing to validate.
        self._takes_nothing = not self._fields
        # A handler of JSON's plain values (see _plain_fields): its stored payloads are
        # its arguments as they are, and pydantic can check every such signature.
        self._plain = _plain_fields(self._fields)
        # Other arguments are checked now, so that a handler pydantic cannot check fails
        # at registration; the others build their model only when a payload is to be
        # checked (a worker's start-up does not wait for pydantic's model machinery).
        self._model = None
        if not self._takes_nothing and self._plain is None:
            self._model = self._build_model()
        if options.isolation == "process":
            importable_name(fn, options.name)

    @property
    def model(self) -> type[pydantic.BaseModel]:
        """The pydantic model of the handler's keyword arguments."""
        if self._model is None:
            self._model = self._build_model()
        return self._model

    def _build_model(self) -> type[pydantic.BaseModel]:
        _import_pydantic()
        config = pydantic.ConfigDict(extra=self._extra, arbitrary_types_allowed=True)  # type: ignore[typeddict-item]
        try:
            model: type[pydantic.BaseModel] = pydantic.create_model(
                f"{self.name}_payload", __config__=config, **self._fields
            )
        except (pydantic.PydanticSchemaGenerationError, TypeError) as exc:
            raise ConfigurationError(
                f"handler {self.name!r} has arguments pydantic cannot check: {exc}"
            ) from None
        return model

    def validate(self, payload: object, *, strict: bool = False) -> dict[str, Any]:
        """Check ``payload`` against the handler's signature; return it as stored (JSON).

        ``strict``: as JSON in pydantic's strict mode (``true`` is not 1, ``"5"`` not 5),
        as the REST API checks what clients send.
        """
        return self.validate_text(payload, strict=strict)[0]

    def validate_text(
        self, payload: object, *, strict: bool = False
    ) -> tuple[dict[str, Any], str | None]:
        """:meth:`validate`, and the payload's compact JSON text as the check that it is
        JSON wrote it (see :meth:`validate_many_text`; None: no text was written)."""
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise InvalidPayload(
                self.name, f"a payload is a JSON object of keyword arguments, not {payload!r}"
            )
        if not payload and self._takes_nothing:
            return {}, None
        given = payload if type(payload) is dict else dict(payload)  # see validate_many_text
        # plain_text: the common flat payload is checked in a fraction of the full walk.
        if plain_text(given):
            if self._plain is not None and not strict:
                # A plain handler's payload of exactly its arguments' types: what the
                # model's check and dump give, without them (in half the time).
                data = _as_given(given, *self._plain)
                if data is not None:
                    return data, strict_compact(data)
        else:
            _check_json_text(self.name, given)
        model_class = self.model  # before the try: its except names pydantic, imported here
        try:
            if strict:
                as_json = json.dumps(_integral(dict(payload)))
                model_class.model_validate_json(as_json, strict=True)
            model = model_class.model_validate(given)
        except pydantic.ValidationError as exc:
            raise InvalidPayload(self.name, _describe(exc), _errors(exc)) from None
        try:
            data = model.model_dump(mode="json", exclude_unset=True)
            text = strict_compact(data)
        except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
            raise InvalidPayload(
                self.name, f"the payload is not JSON-serialisable ({exc}); pass plain data"
            ) from None
        # A text without a \u escape holds nothing json_text_problem refuses.
        if "\\u" in text and not plain_text(data):
            _check_json_text(self.name, data)
        return data, text

    def validate_many(self, payloads: Sequence[object]) -> list[dict[str, Any]]:
        """:meth:`validate` for many payloads of this type at once, with the same result.

        One pydantic call checks and dumps the whole list, several times cheaper per
        payload than one call each. Anything out of the ordinary (a payload that is not
        a flat plain mapping, one pydantic refuses, data that is not JSON) takes
        :meth:`validate` one by one, which raises its usual error for the first bad one.
        """
        return self.validate_many_text(payloads)[0]

    def validate_many_text(
        self, payloads: Sequence[object]
    ) -> tuple[list[dict[str, Any]], Sequence[str | None]]:
        """:meth:`validate_many`, and each payload's compact JSON text as the check that it
        is JSON wrote it (``json.dumps(payload, separators=(",", ":"))``), for a store to
        write as it is (None where no text was written: see :meth:`validate_text`)."""
        # A dict is taken as it is (pydantic reads it, nothing keeps it), another mapping
        # copied into one; the exact type test first: isinstance against an ABC is slow.
        if self._takes_nothing or not all(
            type(p) is dict or isinstance(p, Mapping) for p in payloads
        ):
            return self._one_by_one(payloads)
        given = [p if type(p) is dict else dict(p) for p in payloads]  # type: ignore[call-overload]
        if not all(map(plain_text, given)):
            return self._one_by_one(payloads)
        if self._plain is not None:
            # A plain handler's payloads of exactly its arguments' types (validate_text):
            # no model is built for them, nor run.
            kinds, defaults = self._plain
            as_given = [_as_given(p, kinds, defaults) for p in given]
            if None not in as_given:
                exact = cast(list[dict[str, Any]], as_given)
                return exact, strict_compact_each(exact)
        try:
            models = self._many.validate_python(given)
            data: list[dict[str, Any]] = self._many.dump_python(
                models, mode="json", exclude_unset=True
            )
            texts = strict_compact_each(data)
        except (pydantic.ValidationError, ValueError, TypeError):
            return self._one_by_one(payloads)
        # What json_text_problem refuses (NUL, unpaired surrogates) the ASCII-only text
        # writes as a \u escape: a text without one needs no closer look.
        for item, text in zip(data, texts, strict=True):
            if "\\u" in text and not plain_text(item):
                _check_json_text(self.name, item)
        return data, texts

    def _one_by_one(
        self, payloads: Sequence[object]
    ) -> tuple[list[dict[str, Any]], list[str | None]]:
        """:meth:`validate_many_text` the slow way: :meth:`validate_text` for each payload,
        raising its error for the first bad one."""
        checked = [self.validate_text(p) for p in payloads]
        return [data for data, _ in checked], [text for _, text in checked]

    @functools.cached_property
    def _many(self) -> pydantic.TypeAdapter[list[Any]]:
        model = self.model  # first: it imports pydantic
        return pydantic.TypeAdapter(list[model])  # type: ignore[valid-type]

    def arguments(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Return the keyword arguments to call the handler with, from a stored payload."""
        if not payload and self._takes_nothing:
            return {}
        if self._plain is not None:
            # A stored payload of exactly the arguments' types (as a submit checks it):
            # the model would give it as it is, with the defaults of those not given.
            kinds, defaults = self._plain
            given = _as_given(payload, kinds, defaults)
            if given is not None:
                return defaults | given if defaults else given
        validator = self.model.__pydantic_validator__  # before the try, as in validate_text
        try:
            # The model's validator itself, as model_validate calls it (with its defaults):
            # a no-op job's arguments cost 6 us through model_validate and getattr per
            # field, 2 this way, and a worker builds them for every job it runs.
            model = validator.validate_python(dict(payload))
        except pydantic.ValidationError as exc:
            raise InvalidPayload(self.name, _describe(exc), _errors(exc)) from None
        # A model instance keeps its fields' values in its __dict__ (pydantic's storage),
        # the extra arguments a handler's **kwargs takes in __pydantic_extra__.
        arguments = dict(model.__dict__)
        extra = model.__pydantic_extra__
        return arguments | extra if extra else arguments


def json_text_problem(value: object, *, max_depth: int | None = None) -> str | None:
    """Say what in ``value`` a database cannot store faithfully, or None if nothing.

    NUL characters, unpaired surrogates and non-finite numbers are refused, and with
    ``max_depth`` containers nested deeper than that.

    >>> json_text_problem({"a": [1.5, float("nan")]})
    'numbers must be finite'
    >>> json_text_problem([[[1]]], max_depth=2)[:29]
    'the JSON nests deeper than 2 '
    """
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "strings must not contain NUL (\\u0000)"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "strings must not contain unpaired surrogates"
        elif isinstance(item, float) and not math.isfinite(item):
            return "numbers must be finite"
        elif isinstance(item, Mapping | list | tuple):
            if max_depth is not None and depth > max_depth:
                return (
                    f"the JSON nests deeper than {max_depth} levels: flatten the payload or "
                    "pass a reference to the data instead"
                )
            children = [*item.keys(), *item.values()] if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)
    return None


def _check_json_text(job_type: str, value: object, *, max_depth: int | None = None) -> None:
    """Refuse a payload that :func:`json_text_problem` finds fault with."""
    problem = json_text_problem(value, max_depth=max_depth)
    if problem is not None:
        raise InvalidPayload(job_type, problem)


def _integral(value: Any) -> Any:
    """``value`` with its whole floats as ints: 5.0 is the integer 5 (as in JSON Schema)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _describe(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "payload"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unexpected argument"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _errors(exc: pydantic.ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors()
    ]


def _import_pydantic() -> None:
    """Bind this module's ``pydantic`` to the module, importing it the first time."""
    if pydantic is None:
        import pydantic as module

        globals()["pydantic"] = module


# The annotations whose values pydantic hands a handler exactly as JSON decodes them, when
# they are of that very type: a str is the str, an int (not a bool) the int, a float the
# float, a bool the bool; Any (or no annotation) anything. None: any type.
_AS_DECODED: dict[object, type | None] = {str: str, int: int, float: float, bool: bool, Any: None}
_PLAIN_DEFAULTS = (str, int, float, bool, type(None))
_MISSING = object()


def _plain_fields(
    fields: Mapping[str, tuple[Any, Any]],
) -> tuple[dict[str, type | None], dict[str, Any]] | None:
    """Each argument's type and the defaults, when every argument is a plain value
    (:data:`_AS_DECODED`) with an immutable default if any, under a name pydantic takes
    as a field (not ``_private``, not ``model_config``); None otherwise.

    >>> _plain_fields({"n": (int, ...), "label": (str, "x")})
    ({'n': <class 'int'>, 'label': <class 'str'>}, {'label': 'x'})
    >>> _plain_fields({"when": (list, ...)}) is None
    True
    """
    kinds: dict[str, type | None] = {}
    defaults: dict[str, Any] = {}
    for name, (annotation, default) in fields.items():
        try:
            kind = _AS_DECODED[annotation]
        except (KeyError, TypeError):  # TypeError: an annotation that cannot be hashed
            return None
        if name.startswith("_") or name == "model_config":
            return None
        kinds[name] = kind
        if default is not ...:
            if type(default) not in _PLAIN_DEFAULTS:
                return None
            defaults[name] = default
    return kinds, defaults


def _as_given(
    payload: Mapping[str, Any], kinds: dict[str, type | None], defaults: dict[str, Any]
) -> dict[str, Any] | None:
    """A plain handler's payload as its model checks and dumps it, or None when the model
    must look: the keys given, in the handler's order, each value as it is (a submit's
    check; a worker's arguments are these with the defaults of the others). None for an
    unknown key, a required argument missing, or a value of another type than its
    argument's (an int for a float, which the model converts, or a None it refuses).

    >>> _as_given({"label": "y", "n": 1}, {"n": int, "label": str}, {"label": "x"})
    {'n': 1, 'label': 'y'}
    >>> _as_given({"n": 1.0}, {"n": int}, {}) is None
    True
    """
    data = {}
    for name, kind in kinds.items():
        value = payload.get(name, _MISSING)
        if value is _MISSING:
            if name not in defaults:
                return None
        elif kind is None or type(value) is kind:
            data[name] = value
        else:
            return None
    return data if len(data) == len(payload) else None


def _payload_fields(fn: Handler, name: str) -> tuple[dict[str, Any], str]:
    """A handler's keyword arguments (all but the context) as pydantic fields, and
    whether other keys are allowed (``**kwargs``: ``"allow"``) or not (``"forbid"``)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the signature of handler {name!r}: {exc}") from exc
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(
            f"handler {name!r} must take the job context as its first argument: "
            f"def {getattr(fn, '__name__', name)}(ctx, ...)"
        )
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception:
        hints = {}
    fields: dict[str, Any] = {}
    extra = "forbid"
    for p in params[1:]:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"handler {name!r}: argument {p.name!r} must be passable by keyword, "
                "since payloads are JSON objects of keyword arguments"
            )
        annotation = hints.get(p.name, Any)
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (annotation, default)
    return fields, extra


class Registry:
    """The job types an application knows, by name."""

    def __init__(self) -> None:
        self._types: dict[str, JobType] = {}

    def add(self, job_type: JobType) -> None:
        existing = self._types.get(job_type.name)
        if existing is not None and existing.fn is not job_type.fn:
            raise ConfigurationError(
                f"job type {job_type.name!r} is registered twice; give one of them "
                "another name with @app.job(name=...)"
            )
        self._types[job_type.name] = job_type

    def get(self, name: str) -> JobType:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownJobType(name, list(self._types)) from None

    def find(self, name: str) -> JobType | None:
        return self._types.get(name)

    def names(self) -> list[str]:
        return sorted(self._types)

    def queues(self) -> list[str]:
        return sorted({t.options.queue for t in self._types.values()}) or ["default"]
