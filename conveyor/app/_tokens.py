"""API tokens: created with a secret shown once, authenticated in constant time, revoked.

:class:`Tokens` is the facade's token service (``app.create_token``, ``app.authenticate``,
...). It also runs a job type's ``authorize=`` check, the other half of deciding what a
principal may do.
"""

from __future__ import annotations

import inspect
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta

from conveyor.app.registry import Registry
from conveyor.core.auth import (
    Principal,
    Role,
    Token,
    check_tenant,
    format_token,
    hash_secret,
    secret_matches,
    split_token,
)
from conveyor.core.durations import Duration, seconds
from conveyor.core.model import JSON
from conveyor.errors import ConfigurationError, Forbidden, TokenNotFound
from conveyor.store import TokenStore

# last_used_at of a token is written at most this often (seconds), not on every request.
TOUCH_EVERY = 60.0
# Compared against when a token id is unknown, so that both paths hash and compare.
_NO_SECRET = "0" * 64


class Tokens:
    """Create, authenticate, list and revoke API tokens of one application's store."""

    def __init__(self, store: Callable[[], Awaitable[TokenStore]], registry: Registry) -> None:
        self._store = store
        self._registry = registry
        self._touched: dict[str, float] = {}  # token id -> monotonic time written

    async def create(
        self,
        *,
        tenant: str,
        role: Role | str,
        name: str | None = None,
        expires: Duration | None = None,
    ) -> tuple[Token, str]:
        """Create an API token, valid for ``expires`` (a duration; None: until revoked);
        return it and its secret, which is not kept: show it once."""
        lifetime = _duration("expires", expires, minimum=1.0) if expires is not None else None
        try:
            check_tenant(tenant)
            role = Role(role)
        except ValueError as exc:
            raise ConfigurationError(
                f"{exc}" if "tenant" in str(exc) else "a role is read, write or admin"
            ) from None
        if name is not None and (len(name) > 200 or "\x00" in name):
            raise ConfigurationError("a token name must be at most 200 characters, without NUL")
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        store = await self._store()
        now = await store.now()
        token = Token(
            id=token_id,
            tenant=tenant,
            role=role,
            secret_hash=hash_secret(secret),
            name=name,
            created_at=now,
            expires_at=None if lifetime is None else now + timedelta(seconds=lifetime),
        )
        await store.create_token(token)
        return token, format_token(token_id, secret)

    async def authenticate(self, presented: str) -> Principal | None:
        """Return the principal of a presented API token, or None if it is not valid.

        Unknown, malformed, revoked and expired tokens are all None, and so is a rotated
        token's old secret after its grace. The secret's digest is compared in constant
        time; ``last_used_at`` is written at most once a minute per token.
        """
        parts = split_token(presented)
        if parts is None:
            return None
        token_id, secret = parts
        store = await self._store()
        token = await store.find_token(token_id)
        matches = secret_matches(secret, token.secret_hash if token else _NO_SECRET)
        if token is None or not token.active:
            return None
        if token.expires_at is not None or token.previous_hash is not None:
            at = await store.now()  # only tokens that can expire pay for the clock
            if not token.valid_at(at) or not token.matches(secret, at):
                return None
        elif not matches:
            return None
        now = time.monotonic()
        if now - self._touched.get(token_id, -TOUCH_EVERY) >= TOUCH_EVERY:
            self._touched[token_id] = now
            await store.touch_token(token_id)
        return token.principal()

    async def list(self) -> list[Token]:
        """Return every API token (revoked ones too), newest first."""
        return await (await self._store()).list_tokens()

    async def rotate(self, token_id: str, *, grace: Duration = 0) -> tuple[Token, str]:
        """Give a live token a new secret and return it (shown once); the old secret keeps
        working for ``grace`` (a duration; 0: stops at once)."""
        period = _duration("grace", grace, minimum=0.0)
        store = await self._store()
        secret = secrets.token_urlsafe(32)
        until = await store.now() + timedelta(seconds=period) if period > 0 else None
        token = await store.rotate_token(
            token_id, secret_hash=hash_secret(secret), grace_until=until
        )
        if token is None:
            raise TokenNotFound(token_id)
        return token, format_token(token_id, secret)

    async def revoke(self, token_id: str) -> Token:
        """Revoke an API token: requests bearing it are refused from now on."""
        token = await (await self._store()).revoke_token(token_id)
        if token is None:
            raise TokenNotFound(token_id)
        self._touched.pop(token_id, None)
        return token

    async def authorize(self, principal: Principal, type: str, payload: Mapping[str, JSON]) -> None:
        """Run the ``authorize=`` check of a job type for ``principal``; raise Forbidden.

        Types without a check, and types this application does not know (submitting them
        fails anyway), pass.
        """
        job_type = self._registry.find(type)
        check = job_type.options.authorize if job_type is not None else None
        if job_type is None or check is None:
            return
        data = job_type.validate(payload)
        try:
            allowed = check(principal, data)
            if inspect.isawaitable(allowed):
                allowed = await allowed
        except Forbidden:
            raise
        except Exception as exc:
            raise Forbidden(
                f"the authorisation check of {type!r} refused this payload for tenant "
                f"{principal.tenant!r}: {exc}"
            ) from None
        if not allowed:
            raise Forbidden(
                f"tenant {principal.tenant!r} may not submit {type!r} jobs with this payload "
                "(refused by the job type's authorisation check)"
            )


def _duration(name: str, value: Duration, *, minimum: float) -> float:
    """A duration option in seconds, at least ``minimum`` and at most ten years."""
    try:
        result = seconds(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None
    if not minimum <= result <= 10 * 366 * 86_400:
        raise ConfigurationError(
            f"{name} must be between {minimum:g} seconds and ten years, not {value!r}"
        )
    return result
