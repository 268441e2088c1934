"""Schemathesis hooks for vaecast's media types (loaded by `schema_fuzz` through
SCHEMATHESIS_HOOKS): how to send an SDP offer, and how to read the answers that are
not JSON so their schemas (strings) are checked rather than skipped."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.serializer("application/sdp")
def sdp_offer(context: Any, value: Any) -> bytes:
    """An SDP offer is text (what was generated for its string schema)."""
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogatepass")


@schemathesis.deserializer("video/mp4", "image/png")
def media_bytes(context: Any, response: Any) -> str:
    """Bytes, as the string their schema describes (latin-1: every byte a character)."""
    return bytes(response.content).decode("latin-1")
