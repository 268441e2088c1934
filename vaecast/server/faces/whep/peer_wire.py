"""The pipe between the server and its WebRTC peers' process: one message a frame.

A frame is a 4-byte big-endian length, then a pickle of one message: a tuple whose
first item names it. Both ends are this package's code, in a process the server
started, so pickle trusts no one it should not: a client's offer crosses as a str
field, never as bytes to unpickle. Messages (`peer_process` sends the first list,
`peer_host` the second):

- `("start", WebRtcSettings, log_level)`: the first message, once;
- `("open", session_id, PeerPlan)`: make a peer for an offer;
- `("stream", key, time_base)`, `("units", key, [AccessUnit, ...])`,
  `("end", key, error_message | None)`: a stream of units, as the server's log grows;
- `("bind", session_id, kind, key | None)`: the stream a session's track sends
  (None: it has none, and ends);
- `("close", session_id)`; `("drop", media_key)`: the streams of a rendition no session
  reads any more; `("census", request_id)`; `("exit",)`.

- `("answer", session_id, sdp)`, `("refused", session_id, reason)`;
- `("ended", session_id, outcome)`: a session the server should close;
- `("playout", session_id, stalls, stalled_s, late_sends, playing)`: a session's
  stalls so far (units that came after they were due) and how long they lasted, its
  late sends (units here in time that this process sent late), and whether its tracks
  have started; `("census", request_id, counts)`;
- `("log", level, logger, message)`: the peers' log lines, which the server logs.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass
from typing import Any

HEADER = struct.Struct(">I")
# A frame's largest: a batch of units is at most what one fragment holds, and an
# offer at most MAX_OFFER_BYTES; past this the other end is not this code.
MAX_FRAME_BYTES = 256 * 1024 * 1024

Message = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class PeerPlan:
    """What a viewer's peer is made of, decided on the server's side."""

    video_codec: str  # a VideoCodec's value
    join_s: float
    offer_sdp: str
    takes_audio: bool


def frame(message: Message) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> Message | None:
    """The next message, or None once the other end has closed the pipe."""
    try:
        header = await reader.readexactly(HEADER.size)
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"a {length}-byte frame on the peers' pipe")
        message = pickle.loads(await reader.readexactly(length))
    except asyncio.IncompleteReadError:
        return None
    if not isinstance(message, tuple) or not message:
        raise ValueError("the peers' pipe carried something other than a message")
    return message
