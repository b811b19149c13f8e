"""Bearer-token check for /v1/*, active only when SERVING_API_KEY is set."""

from __future__ import annotations

import secrets

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

_bearer = HTTPBearer(auto_error=False, description="the value of SERVING_API_KEY, when the service has one")


def api_key_guard(api_key: str | None) -> list:
    """The dependencies of a guarded router: none without a key (nothing to solve per request), else one that
    answers 401 unless the request carries `Authorization: Bearer <api_key>` (and documents the scheme)."""
    return [] if api_key is None else [Depends(api_key_check(api_key))]


def api_key_check(api_key: str):
    """A dependency that answers 401 unless the request carries `Authorization: Bearer <api_key>`."""

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), api_key.encode()):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check
