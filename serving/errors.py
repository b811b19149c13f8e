"""The one error body every route answers with, and the OpenAPI declaration of the statuses each route can give
(in place of FastAPI's default 422 schema, which describes a `detail` array this service never sends)."""

from __future__ import annotations

from pydantic import BaseModel, Field

MEANING = {
    400: "the body is not valid JSON",
    401: "missing or wrong key: send `Authorization: Bearer <key>`",
    403: "the route is disabled on this service",
    404: "no such model, or not the version being served",
    409: "the request conflicts with the service's state (e.g. the served model takes no unit references, or the "
         "unit limit is reached): what and why is in `detail`",
    413: "the body is larger than SERVING_MAX_BODY_BYTES",
    415: "the body was not sent as `Content-Type: application/json`",
    422: "the request does not fit the API or the model: what and where is in `detail`",
    503: "not ready (no model loaded yet) or shutting down; retry after `Retry-After` seconds",
    504: "no answer within SERVING_REQUEST_TIMEOUT_S; the request's queued work was dropped",
}
# What a JSON body route can answer besides its own 2xx: bad JSON, too large, not JSON, invalid.
BODY_ERRORS = (400, 413, 415, 422)


class NotReady(Exception):
    """No model of this family is loaded (yet), or it changed under a queued request."""


class RetryLater(RuntimeError):
    """Work that may succeed when sent again: a worker process died and was replaced."""


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer of this service."""

    detail: str = Field(description="what is wrong, in one line")


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """`responses=` for a route that can answer `statuses` with an ErrorBody."""
    return {status: {"model": ErrorBody, "description": MEANING[status]} for status in sorted(statuses)}
