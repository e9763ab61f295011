"""Who is asking: API tokens, their roles, and the principal a request acts as.

A token is ``cvt_<id>_<secret>``: the id is public (it names the token in listings and
in ``conveyor tokens revoke``), the secret is 256 random bits of which only a SHA-256
digest is stored. A high-entropy secret needs no slow password hash; the digest is
compared in constant time.

>>> Role.WRITE.allows(Role.READ), Role.READ.allows(Role.WRITE)
(True, False)
>>> split_token("cvt_0a1b2c3d4e5f_c2VjcmV0")
('0a1b2c3d4e5f', 'c2VjcmV0')
>>> split_token("Bearer nonsense") is None
True
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

TOKEN_PREFIX = "cvt_"
_TOKEN = re.compile(r"cvt_([0-9a-f]{12})_([A-Za-z0-9_-]{8,128})")
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}")


class Role(StrEnum):
    """What a token may do: ``read`` jobs, also ``write`` (submit, cancel, retry), or
    ``admin`` (everything, across tenants, and the operations on queues)."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    def allows(self, needed: Role) -> bool:
        """Whether this role includes ``needed``."""
        order = (Role.READ, Role.WRITE, Role.ADMIN)
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True, slots=True)
class Principal:
    """The identity a request acts as: the token that authenticated it."""

    token_id: str
    tenant: str
    role: Role
    name: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


@dataclass(frozen=True, slots=True)
class Token:
    """A stored API token (its secret is never stored, only ``secret_hash``)."""

    id: str
    tenant: str
    role: Role
    secret_hash: str
    name: str | None
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None
    expires_at: datetime | None = None  # None: never
    previous_hash: str | None = None  # the secret before a rotation, during its grace
    previous_expires_at: datetime | None = None

    @property
    def active(self) -> bool:
        """Not revoked (it may still have expired: see :meth:`valid_at`)."""
        return self.revoked_at is None

    def valid_at(self, now: datetime) -> bool:
        """Neither revoked nor expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def state_at(self, now: datetime) -> str:
        """``active``, ``expired`` or ``revoked``, as listings show it."""
        if self.revoked_at is not None:
            return "revoked"
        return "active" if self.valid_at(now) else "expired"

    def matches(self, secret: str, now: datetime) -> bool:
        """Whether ``secret`` is this token's, or its previous one still in its grace."""
        current = secret_matches(secret, self.secret_hash)
        previous = secret_matches(secret, self.previous_hash or _NO_HASH)
        in_grace = self.previous_expires_at is not None and now < self.previous_expires_at
        return current or (previous and in_grace and self.previous_hash is not None)

    def principal(self) -> Principal:
        return Principal(token_id=self.id, tenant=self.tenant, role=self.role, name=self.name)


_NO_HASH = "0" * 64


def hash_secret(secret: str) -> str:
    """Return the hex SHA-256 digest a token's secret is stored as.

    >>> hash_secret("abc")[:16]
    'ba7816bf8f01cfea'
    """
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    """Compare a presented secret with a stored digest in constant time."""
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def format_token(token_id: str, secret: str) -> str:
    return f"{TOKEN_PREFIX}{token_id}_{secret}"


def split_token(text: str) -> tuple[str, str] | None:
    """Return ``(id, secret)`` of a well-formed token, or None."""
    match = _TOKEN.fullmatch(text)
    return None if match is None else (match.group(1), match.group(2))


def check_tenant(tenant: object) -> str:
    """Return a valid tenant name or raise ValueError saying what one looks like.

    >>> check_tenant("acme-eu")
    'acme-eu'
    """
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise ValueError(
            f"a tenant is 1 to 100 letters, digits and . _ : @ - (starting with a letter or "
            f"digit), not {tenant!r}"
        )
    return tenant
