"""The error of an input that does not fit the model, and the request size limit every family checks."""

from __future__ import annotations


class BadInput(ValueError):
    """The request is well-formed JSON but does not fit the model; the message says what is wrong."""


def check_count(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise BadInput(f"{count} {what} in one request; at most {limit} (SERVING_MAX_ITEMS)")
