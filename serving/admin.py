"""Admin routes (/v1/admin/*): their own key, SERVING_ADMIN_KEY, never the API key; disabled (403) when it is
not set; JSON bodies only, so a cross-site form or `text/plain` post cannot reach them."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serving.errors import BODY_ERRORS, error_responses
from serving.schemas import ReloadAnswer, ReloadRequest

_admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminKey", description="the value of SERVING_ADMIN_KEY")


def admin_check(admin_key: str | None):
    """A dependency: 403 when the service has no admin key, 401 without `Authorization: Bearer <admin_key>`,
    415 unless the body is sent as `application/json` (in this order)."""

    async def check(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_admin_bearer)) -> None:
        if admin_key is None:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                "admin routes are disabled: start the service with SERVING_ADMIN_KEY to use them")
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), admin_key.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                                "missing or wrong admin key: send the header `Authorization: Bearer <SERVING_ADMIN_KEY>`",
                                headers={"WWW-Authenticate": "Bearer"})
        content_type = request.headers.get("content-type", "")
        if content_type.split(";")[0].strip().lower() != "application/json":
            raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                                f"send the body `{{}}` with `Content-Type: application/json` "
                                f"(got {content_type or 'no content type'})")

    return check


def admin_router(admin_key: str | None, reload: Callable[[], Awaitable[dict]]) -> APIRouter:
    """/v1/admin/reload, which awaits `reload()` for its answer (serving.schemas.ReloadAnswer)."""
    router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(admin_check(admin_key))],
                       responses=error_responses(401, 403, *BODY_ERRORS))

    @router.post("/reload", response_model=ReloadAnswer)
    async def reload_now(options: ReloadRequest) -> dict:
        """Check the registry alias now and load any new version (the service also polls it). Body: `{}`."""
        return await reload()

    return router
