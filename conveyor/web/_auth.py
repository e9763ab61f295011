"""Bearer-token authentication and role checks, as FastAPI dependencies.

Each dependency authenticates the request's token against the application in
``request.app.state.conveyor`` and yields the :class:`~conveyor.app.tenants.TenantView` of
its principal: the routes act only through it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from conveyor.app.client import Conveyor
from conveyor.app.tenants import TenantView
from conveyor.core.auth import Principal, Role
from conveyor.web._guards import within
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


def conveyor_of(request: Request) -> Conveyor:
    """The application this API serves."""
    app: Conveyor = request.app.state.conveyor
    return app


async def authenticate(
    app: Conveyor,
    credentials: HTTPAuthorizationCredentials | None,
    role: Role,
    *,
    timeout: float = 0.5,
) -> Principal:
    """Return the principal of the request's token; 401 without a valid one, 403 if its
    role is below ``role``, 503 if the database does not answer within ``timeout``."""
    if credentials is None:
        raise ProblemError(
            401,
            "this endpoint needs an API token: send `Authorization: Bearer <token>` "
            "(create one with `conveyor tokens create`)",
            headers=_CHALLENGE,
        )
    found = await within(
        timeout, app.authenticate(credentials.credentials), "checking the API token"
    )
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


def requires(role: Role) -> Callable[..., Awaitable[TenantView]]:
    """Return a dependency that authenticates the request, checks its role and yields the
    principal's view of the application."""

    async def view(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> TenantView:
        app = conveyor_of(request)
        timeout = request.app.state.options.db_timeout
        principal = await authenticate(app, credentials, role, timeout=timeout)
        if credentials is not None:  # its next requests count to its tenant's share
            request.app.state.shares.remember(credentials.credentials, principal.tenant)
        return TenantView(app, principal)

    return view


Reader = Annotated[TenantView, Depends(requires(Role.READ))]
Writer = Annotated[TenantView, Depends(requires(Role.WRITE))]
Admin = Annotated[TenantView, Depends(requires(Role.ADMIN))]
