"""The error of an input that does not fit the model, the request size limit every family checks, and the text
check of strings read from JSON."""

from __future__ import annotations


class BadInput(ValueError):
    """The request is well-formed JSON but does not fit the model; the message says what is wrong."""


def check_count(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise BadInput(f"{count} {what} in one request; at most {limit} (SERVING_MAX_ITEMS)")


def is_unicode(text: str) -> bool:
    """Whether `text` is valid Unicode: JSON's escapes can spell a lone surrogate, which no encoding can write."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
