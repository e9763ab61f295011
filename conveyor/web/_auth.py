"""Bearer-token authentication and role checks, as FastAPI dependencies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from conveyor.client import Conveyor
from conveyor.core.auth import Principal, Role
from conveyor.errors import JobNotFound
from conveyor.web._problems import ProblemError

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description=(
        "An API token from `conveyor tokens create --tenant T --role read|write|admin`, "
        "sent as `Authorization: Bearer cvt_...`."
    ),
)

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="conveyor"'}
_INVALID = {"WWW-Authenticate": 'Bearer realm="conveyor", error="invalid_token"'}

# The role each route needs, by the route's name; None: no token needed.
ROLE_KEY = "x-conveyor-role"


def requires(app: Conveyor, role: Role) -> Callable[..., Awaitable[Principal]]:
    """Return a dependency that authenticates the request and checks its role."""

    async def principal(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> Principal:
        if credentials is None:
            raise ProblemError(
                401,
                "this endpoint needs an API token: send `Authorization: Bearer <token>` "
                "(create one with `conveyor tokens create`)",
                headers=_CHALLENGE,
            )
        found = await app.authenticate(credentials.credentials)
        if found is None:
            raise ProblemError(
                401,
                "the API token is not valid: it is malformed, unknown or revoked; "
                "create a new one with `conveyor tokens create`",
                headers=_INVALID,
            )
        if not found.role.allows(role):
            raise ProblemError(
                403,
                f"this needs a token with role {role.value!r} or above; token "
                f"{found.token_id} has role {found.role.value!r}",
            )
        return found

    return principal


def can_see(principal: Principal, tenant: str | None) -> bool:
    """Whether ``principal`` may see a job of ``tenant``: its own tenant's, or any if admin."""
    return principal.is_admin or tenant == principal.tenant


def check_visible(principal: Principal, job_id: str, tenant: str | None) -> None:
    """Raise JobNotFound for another tenant's job: its existence is not revealed."""
    if not can_see(principal, tenant):
        raise JobNotFound(job_id)
