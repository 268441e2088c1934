"""vaecast's Python client.

- `Client` and `AsyncClient` (`vaecast.client.videos`): the whole jobs API: upload
  latents, wait for a job, download its video, its thumbnail or spritesheet
  (`StillImage`), cancel or delete it;
- `PushSession` and `AsyncPushSession` (`vaecast.client.push`): send latents (or frames)
  to a server while a generator makes them, watched from the first block;
- `ApiError` (and `PushError`, a push's): what the server refused.
"""

from __future__ import annotations

from vaecast.client.blocks import Array, encode_block, encode_frames_block
from vaecast.client.protocol import (
    DEFAULT_RETRY_S,
    DEFAULT_TIMEOUT_S,
    FIRST_BACKOFF_S,
    MAX_ANSWER_BYTES,
    MAX_BACKOFF_S,
    PUSH_SEQ_HEADER,
    PUSH_TOKEN_HEADER,
    RETRY_STATUSES,
    ApiError,
    Fps,
    PushError,
    retry_delay,
)
from vaecast.client.push import AsyncPushSession, PushSession
from vaecast.client.videos import AsyncClient, Client, StillImage

__all__ = [
    "DEFAULT_RETRY_S",
    "DEFAULT_TIMEOUT_S",
    "FIRST_BACKOFF_S",
    "MAX_ANSWER_BYTES",
    "MAX_BACKOFF_S",
    "PUSH_SEQ_HEADER",
    "PUSH_TOKEN_HEADER",
    "RETRY_STATUSES",
    "ApiError",
    "Array",
    "AsyncClient",
    "AsyncPushSession",
    "Client",
    "Fps",
    "PushError",
    "PushSession",
    "StillImage",
    "encode_block",
    "encode_frames_block",
    "retry_delay",
]
