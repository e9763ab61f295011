"""How conveyor's PostgreSQL URL reaches the server: directly, or through a pooler.

A connection pooler in *transaction* mode (PgBouncer's ``pool_mode = transaction``)
hands each transaction to whichever server connection is free, so nothing that lives in
a server session survives from one transaction to the next: prepared statements, session
``SET``s, session-level advisory locks and LISTEN. ``Pooling(mode="transaction")`` makes
conveyor send none of them through the URL; ``listen_url`` names a direct connection that
is used only to LISTEN for wake-ups (without it, workers poll).

Configured by ``CONVEYOR_POOLER`` and ``CONVEYOR_LISTEN_URL``, ``Conveyor(pooler=...,
listen_url=...)`` or the CLI's ``--pooler`` and ``--listen-url``. See docs/postgres.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from conveyor.errors import ConfigurationError

# The pooler modes conveyor knows. A session pooler needs no setting: to conveyor it is
# the same as a direct connection.
POOLER_MODES = ("transaction",)
# Values that say "no pooler" (to override the environment from the command line).
_NO_POOLER = ("", "none", "direct", "session")


@dataclass(frozen=True, kw_only=True)
class Pooling:
    """Whether the database URL goes through a transaction pooler, and where to LISTEN.

    >>> Pooling.configured(pooler="Transaction", listen_url=None, environ={}).mode
    'transaction'
    >>> Pooling.configured(pooler=None, listen_url=None, environ={}).mode is None
    True
    """

    mode: str | None = None
    listen_url: str | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in POOLER_MODES:
            raise ConfigurationError(
                f"pooler {self.mode!r} is not a pooler mode conveyor knows: use "
                "'transaction' for PgBouncer's pool_mode = transaction (or leave it unset "
                "for a direct connection or a session pooler)"
            )
        if self.listen_url is not None and not self.listen_url.strip():
            raise ConfigurationError(
                "listen_url is empty: give a direct postgresql:// URL of the same "
                "database, or leave it unset"
            )

    @property
    def transaction(self) -> bool:
        """Whether statements go through a transaction pooler."""
        return self.mode == "transaction"

    @classmethod
    def configured(
        cls,
        *,
        pooler: str | None,
        listen_url: str | None,
        environ: Mapping[str, str] = os.environ,
    ) -> Pooling:
        """The pooling given in code, else by ``CONVEYOR_POOLER`` / ``CONVEYOR_LISTEN_URL``."""
        where = "pooler"
        if pooler is None:
            pooler = environ.get("CONVEYOR_POOLER")
            where = "CONVEYOR_POOLER"
        if listen_url is None:
            listen_url = environ.get("CONVEYOR_LISTEN_URL") or None
        mode = None if pooler is None else pooler.strip().lower()
        if mode is None or mode in _NO_POOLER:
            mode = None
        elif mode not in POOLER_MODES:
            raise ConfigurationError(
                f"{where}={pooler!r} is not a pooler mode conveyor knows: set "
                "'transaction' for PgBouncer's pool_mode = transaction, or leave it unset "
                "for a direct connection or a session pooler"
            )
        return cls(mode=mode, listen_url=listen_url)

    def changed(self, *, pooler: str | None, listen_url: str | None) -> Pooling:
        """This pooling with what is given changed (None keeps it; ``""`` unsets a
        listen URL, ``"none"`` the pooler), from the command line, say.

        >>> Pooling(mode="transaction").changed(pooler="none", listen_url=None).mode is None
        True
        """
        return Pooling.configured(
            pooler=(self.mode or "") if pooler is None else pooler,
            listen_url=self.listen_url if listen_url is None else listen_url or None,
            environ={},
        )

    @property
    def configured_any(self) -> bool:
        return self.mode is not None or self.listen_url is not None
