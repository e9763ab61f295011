"""Flow-control bookkeeping for one claim: how many more jobs each type and key may start.

The backend counts what is running (and what started inside each rate window) while it
holds the lock that serialises limited claims, then walks the due jobs in claim order,
taking each one that still fits. A job that does not fit stays queued; the type or key
becomes blocked so the next query skips it, and jobs behind it are not held up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from conveyor.core.durations import seconds


class FlowLimits(Protocol):
    @property
    def local(self) -> Mapping[str, int]: ...

    @property
    def cluster(self) -> Mapping[str, int]: ...

    @property
    def per_key(self) -> Mapping[str, int]: ...

    @property
    def rate(self) -> Mapping[str, tuple[int, float]]: ...


@dataclass
class FlowCapacity:
    """Remaining capacity per type and per (type, key) during one claim.

    >>> class L:
    ...     local = {}; cluster = {"a": 2}; per_key = {"b": 1}; rate = {}
    >>> c = FlowCapacity.start(L())
    >>> c.count_running({"a": 1})
    >>> [c.take("a", None), c.take("a", None), c.take("b", "k1"), c.take("b", "k1")]
    [True, False, True, False]
    >>> sorted(c.blocked_types), sorted(c.blocked_keys)
    (['a'], [('b', 'k1')])
    """

    per_type: dict[str, int] = field(default_factory=dict)
    key_limit: dict[str, int] = field(default_factory=dict)
    per_key: dict[tuple[str, str], int] = field(default_factory=dict)
    blocked_types: set[str] = field(default_factory=set)
    blocked_keys: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def start(cls, limits: FlowLimits) -> FlowCapacity:
        capacity = cls(key_limit=dict(limits.per_key))
        for job_type, n in limits.local.items():
            capacity._cap(job_type, n)
        for job_type, n in limits.cluster.items():
            capacity._cap(job_type, n)
        for job_type, (n, _window) in limits.rate.items():
            capacity._cap(job_type, n)
        return capacity

    def _cap(self, job_type: str, n: int) -> None:
        self.per_type[job_type] = min(n, self.per_type.get(job_type, n))
        if self.per_type[job_type] <= 0:
            self.blocked_types.add(job_type)

    def count_running(self, running: Mapping[str, int]) -> None:
        """Subtract jobs already running (with live leases) from the cluster-wide caps."""
        for job_type, n in running.items():
            self._cap(job_type, self.per_type.get(job_type, 0) - n)

    def count_rate(self, job_type: str, started: int) -> None:
        """Subtract starts already inside a type's rate window."""
        self._cap(job_type, self.per_type.get(job_type, 0) - started)

    def count_keys(self, running: Mapping[tuple[str, str], int]) -> None:
        """Record jobs already running per (type, concurrency key)."""
        for (job_type, key), n in running.items():
            left = self.key_limit[job_type] - n
            self.per_key[(job_type, key)] = left
            if left <= 0:
                self.blocked_keys.add((job_type, key))

    def take(self, job_type: str, key: str | None) -> bool:
        """Take one slot for a job of ``job_type`` with ``key``; False when it does not fit."""
        if job_type in self.blocked_types:
            return False
        pair = (job_type, key) if key is not None and job_type in self.key_limit else None
        if pair is not None:
            left = self.per_key.get(pair, self.key_limit[job_type])
            if left <= 0:
                self.blocked_keys.add(pair)
                return False
            self.per_key[pair] = left - 1
            if left - 1 <= 0:
                self.blocked_keys.add(pair)
        if job_type in self.per_type:
            self.per_type[job_type] -= 1
            if self.per_type[job_type] <= 0:
                self.blocked_types.add(job_type)
        return True


def parse_rate(text: str) -> tuple[int, float]:
    """Parse a rate limit such as ``"100/m"`` or ``"20/s"`` into (count, window seconds).

    >>> parse_rate("100/m")
    (100, 60.0)
    >>> parse_rate("5/10s")
    (5, 10.0)
    """
    count, sep, per = str(text).partition("/")
    try:
        n = int(count)
        window = seconds({"s": "1s", "m": "1m", "h": "1h", "d": "1d"}.get(per, per))
    except ValueError:
        n, window = 0, 0.0
    if not sep or n < 1 or window <= 0:
        raise ValueError(
            f"invalid rate limit {text!r}: write COUNT/PERIOD such as '100/m', '20/s' or '5/10s'"
        )
    return n, window


@dataclass(frozen=True, slots=True)
class TenantLimit:
    """What one tenant's jobs may use of the cluster (None: no limit).

    ``concurrency``: at most this many of its jobs running across all workers. ``rate``:
    at most ``count`` of its jobs started in any ``window`` seconds. ``max_queued``: at
    most this many of its jobs queued; a submit beyond it is refused.
    """

    concurrency: int | None = None
    rate: tuple[int, float] | None = None
    max_queued: int | None = None

    def __post_init__(self) -> None:
        for name in ("concurrency", "max_queued"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"a tenant's {name} must be a whole number of at least 1")


def parse_tenant_limit(text: str) -> tuple[str, TenantLimit]:
    """Parse ``TENANT:concurrency=N,rate=COUNT/PERIOD,max_queued=N`` (any of the three).

    ``*`` as the tenant sets the limit of every tenant without one of its own.

    >>> parse_tenant_limit("acme:concurrency=5,rate=20/s")
    ('acme', TenantLimit(concurrency=5, rate=(20, 1.0), max_queued=None))
    """
    tenant, sep, spec = text.partition(":")
    values: dict[str, object] = {}
    try:
        for part in spec.split(","):
            name, eq, value = part.strip().partition("=")
            if not eq or name not in ("concurrency", "rate", "max_queued") or name in values:
                raise ValueError(part)
            values[name] = parse_rate(value) if name == "rate" else int(value)
        limit = TenantLimit(**values)  # type: ignore[arg-type]
    except ValueError:
        limit = None
    if not sep or not tenant or limit is None:
        raise ValueError(
            f"invalid tenant limit {text!r}: write TENANT:concurrency=N,rate=COUNT/PERIOD,"
            "max_queued=N (any of them), e.g. 'acme:concurrency=5,rate=100/m'"
        )
    return tenant, limit
