"""Request-scoped dependencies: the stores, the broker (`aml_gateway.services`) and who is
calling."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Annotated, Any

from fastapi import Depends, Header, HTTPException, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from aml_gateway.errors import refusal_response
from aml_gateway.limits import client_address, too_many
from aml_gateway.refusals import Refused

# Re-exported: `Services` was defined here, and callers outside the gateway import it from here.
from aml_gateway.services import Services as Services
from aml_gateway.services import key_hash
from aml_runtime.db import Document


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


ServicesDep = Annotated[Services, Depends(services)]


def bearer(authorization: str | None) -> str | None:
    if not authorization or not authorization.lower().startswith("bearer "):
        return None
    return authorization[7:].strip() or None


async def check_not_blocked(request: Request) -> None:
    """429 for an address that has used up its failed authentications, counted by every
    gateway replica together (checked before a credential is looked at; an address this
    process already knows to be blocked costs no database read). 503 when the shared count
    cannot be read: this limit fails closed (`aml_gateway.limits.Limits`)."""
    svc = services(request)
    waiting = await svc.limits.auth_failures.wait(client_address(request.scope))
    if waiting is not None:
        raise too_many(waiting, "failed authentications", svc.clock())


async def auth_failed(request: Request, status: int, reason: str) -> HTTPException:
    """The refusal of a credential, counted against the caller's address."""
    await services(request).limits.auth_failures.take(client_address(request.scope))
    return HTTPException(status, {"reason": reason})


def _cached(request: Request) -> dict[str, Any]:
    guards: dict[str, Any] = request.scope.setdefault("aml.guards", {})
    return guards


async def current_team(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Document:
    """The team whose Leaderboard API Key is the Bearer token (401 otherwise). Run before the
    body is read (`GuardedRoute`); FastAPI's own call returns the same team."""
    done = _cached(request)
    if "team" not in done:
        await check_not_blocked(request)
        token = bearer(authorization)
        if token is None:
            raise await auth_failed(request, 401, "send the Leaderboard API Key as a Bearer token")
        team = await services(request).stores.accounts.team_by_key_hash(key_hash(token))
        if team is None:
            raise await auth_failed(request, 401, "unknown Leaderboard API Key")
        done["team"] = team
    found: Document = done["team"]
    return found


async def optional_team(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Document | None:
    """No Authorization header: None. A header: it must hold a team's key (401 otherwise)."""
    if authorization is None:
        return None
    return await current_team(request, authorization)


async def require_admin(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> None:
    done = _cached(request)
    if "admin" in done:
        return
    await check_not_blocked(request)
    expected = services(request).settings.admin_token.get_secret_value()
    # A missing token is refused like a wrong one (403): admin routes answer no one else.
    given = bearer(authorization) or ""
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise await auth_failed(request, 403, "admin access required")
    done["admin"] = True


async def access_request_allowance(request: Request) -> None:
    """One access request from the caller's address (429 with Retry-After beyond the limit,
    counted by every gateway replica together), taken before the body is read."""
    done = _cached(request)
    if "access_request" in done:
        return
    svc = services(request)
    waiting = await svc.limits.access_request_rate.take(client_address(request.scope))
    if waiting is not None:
        raise too_many(waiting, "access requests", svc.clock())
    done["access_request"] = True


# The dependencies `GuardedRoute` runs before the body is read, and whether they take the
# Authorization header.
PRE_BODY: dict[Callable[..., Awaitable[Any]], bool] = {
    access_request_allowance: False,
    current_team: True,
    optional_team: True,
    require_admin: True,
}


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        yield from _calls(sub)
        if sub.call is not None:
            yield sub.call


class GuardedRoute(APIRoute):
    """A route whose guards (authentication, the access-request limit) run before FastAPI
    reads and parses the body, which it otherwise does before any dependency: an unknown
    caller gets its 401/403/429 without the gateway reading what it sent.

    A refusal raised by a guard or the route is answered here by `refusal_response`, the
    same function the app registers (`install_error_handlers`): a router mounted on an app
    of its own, as some tests do, answers exactly as the gateway does."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        guards = [call for call in dict.fromkeys(_calls(self.dependant)) if call in PRE_BODY]

        async def guarded(request: Request) -> Response:
            try:
                for guard in guards:
                    if PRE_BODY[guard]:
                        await guard(request, request.headers.get("authorization"))
                    else:
                        await guard(request)
                return await handler(request)
            except Refused as refused:
                return refusal_response(refused)

        return guarded


TeamDep = Annotated[Document, Depends(current_team)]
OptionalTeamDep = Annotated[Document | None, Depends(optional_team)]
AdminDep = Annotated[None, Depends(require_admin)]
