"""The HTTP face of the reference memory server: the participant contract (SPEC R-4.3 - R-4.8)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, HTTPException, Request, status

from aml_contract.participant import AddRequest, AddResponse, SearchRequest, SearchResponse

from .auth import is_authorized
from .settings import MemoryServerSettings
from .store import RequestIdConflict, SqliteMemoryStore, TimestampOutOfRange, content_text


def _reason(text: str) -> dict[str, str]:
    # The platform's own error shape (SPEC ), reused so that errors read the same.
    return {"reason": text}


def create_app(settings: MemoryServerSettings) -> FastAPI:
    """An app serving one SQLite database. The store is opened here and closed when the app's
    lifespan ends, so an app instance serves one lifespan."""
    store = SqliteMemoryStore(settings.db_path)
    expected_key = settings.key.get_secret_value() if settings.key else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            store.close()

    def require_auth(request: Request) -> None:
        if not is_authorized(settings.auth_method, expected_key, request.headers):
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail=_reason(
                    f"missing or wrong credentials for auth method {settings.auth_method}"
                ),
            )

    app = FastAPI(title="AML reference memory server", lifespan=lifespan)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    # Sync handlers: FastAPI runs them in its thread pool, so SQLite I/O never blocks the loop.
    # Auth is a dependency, resolved before the body is validated: an unauthenticated caller
    # gets 401, never a 422 that describes the body.
    @app.post("/add", dependencies=[Depends(require_auth)])
    def add(body: AddRequest) -> AddResponse:
        try:
            store.add(body)
        except TimestampOutOfRange as exc:
            raise HTTPException(
                status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, detail=_reason(str(exc))
            ) from exc
        except RequestIdConflict as exc:
            raise HTTPException(
                status_code=status.HTTP_409_CONFLICT,
                detail=_reason(f"request_id {exc} was already stored with a different body"),
            ) from exc
        return AddResponse(
            success=True,
            request_id=body.request_id,
            user_id=body.user_id,
            session_id=body.session_id,
        )

    @app.post("/search", dependencies=[Depends(require_auth)], response_model_exclude_none=True)
    def search(body: SearchRequest) -> SearchResponse:
        items = store.search(body.user_id, content_text(body.query), body.top_k)
        return SearchResponse(data=items)

    return app
