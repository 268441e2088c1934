"""A WebRTC viewer's tracks: already-encoded units, sent at the pace they play.

aiortc's sender asks its track for the next frame and sends what it gets at once; a
track that returns an `av.Packet` is packetized as it is, never encoded (aiortc's
extension point for pre-encoded media is a `MediaStreamTrack` whose `recv` returns
packets). So pacing is the track's work: a WebRTC receiver plays what arrives as it
arrives, and a chunk's sixteen frames sent in one burst would play as one jump.

One `ViewerClock` per viewer maps presentation time to the loop's clock for its video
and audio tracks alike, which keeps them in step: the video track picks the start (its
first keyframe at the join point), the audio track starts at the same instant. A unit
that reached this process only after it was due (a decode slower than real time) is a
stall: the stream ran dry. A unit that was here in time but went out late all the same
(this process got no CPU soon enough: a busy host) is a late send, counted apart, for it
says nothing of the job's media. Either way the clock moves on by as much, so what
follows keeps its spacing, and the RTP timestamps move with it, as a live source's
would.

The tracks run in the peers' process (`peer_host`), on copies of the server's unit
logs that grow as the server sends their units.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from fractions import Fraction
from typing import Any

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from vaecast.codecs.access_units import AccessUnit
from vaecast.server.faces.whep.media import UnitLog, index_at

# A unit sent this much after it was due counts as late (a scheduler's wake-up is late
# by a millisecond or two; a frame interval at 60 fps is 17 ms).
STALL_TOLERANCE_S = 0.05


class ViewerClock:
    def __init__(self, join_s: float) -> None:
        self.join_s = join_s
        self.start_s: float | None = None
        self.stalls = 0  # units that came after they were due: the stream ran dry
        self.stalled_s = 0.0
        self.late_sends = 0  # units here in time, sent late all the same: a busy host
        self.late_s = 0.0
        self._origin = 0.0
        self._started = asyncio.Event()

    def start(self, start_s: float) -> None:
        self.start_s = start_s
        self._origin = asyncio.get_running_loop().time()
        self._started.set()

    async def started(self) -> float:
        await self._started.wait()
        assert self.start_s is not None
        return self.start_s

    def stream_time(self, media_s: float) -> float:
        """Seconds since the viewer's start at which `media_s` plays."""
        assert self.start_s is not None
        return media_s - self.start_s + self.stalled_s + self.late_s

    async def wait_until_due(self, media_s: float, arrived_at: float | None) -> None:
        """Wait until the unit at `media_s` is due; count it if it is late: a stall if
        it came (`arrived_at`, the loop's clock; None: just now) after it was due."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = self._origin + self.stream_time(media_s)
        late = now - due
        if late > STALL_TOLERANCE_S:
            if (now if arrived_at is None else arrived_at) - due > STALL_TOLERANCE_S:
                self.stalls += 1
                self.stalled_s += late
            else:
                self.late_sends += 1
                self.late_s += late
        elif late < 0:
            await asyncio.sleep(-late)


class PacedTrack(MediaStreamTrack):
    """One stream of a viewer: units from the viewer's start, paced by `clock`.

    `source` gives the units' log on the first `recv` (a job's streams exist only once
    its first fragment does; None: the job has no such stream, and the track ends).

    The video track (`leads`) starts the clock at its first keyframe presented at the
    join point or later (or, if the stream ends with none, at its last keyframe); the
    other starts at the clock's start. Ends (MediaStreamError, which stops aiortc's
    sender) after the last unit, or when the stream broke."""

    def __init__(
        self,
        kind: str,
        source: Callable[[], Coroutine[Any, Any, UnitLog | None]],
        clock: ViewerClock,
        *,
        leads: bool,
    ) -> None:
        super().__init__()
        self.kind = kind
        self._source = source
        self._units = UnitLog(Fraction(1))
        self._clock = clock
        self._leads = leads
        self._index: int | None = None
        self._start_s = 0.0
        self.sent = 0

    async def recv(self) -> av.Packet:
        try:
            if self._index is None:
                units = await self._source()
                if units is None:
                    raise MediaStreamError
                self._units = units
                self._index = await (self._first_keyframe() if self._leads else self._first_unit())
            unit = await self._next()
        except MediaStreamError:
            self.stop()
            raise
        media_s = self._units.seconds(unit)
        assert self._index is not None
        await self._clock.wait_until_due(media_s, self._units.arrived_at(self._index - 1))
        return self._packet(unit, self._clock.stream_time(media_s))

    def _packet(self, unit: AccessUnit, stream_s: float) -> av.Packet:
        time_base: Fraction = self._units.time_base
        packet = av.Packet(unit.data)
        packet.pts = max(0, round(stream_s / time_base))
        packet.time_base = time_base
        self.sent += 1
        return packet

    async def _next(self) -> AccessUnit:
        assert self._index is not None
        while True:
            await self._wait_for(self._index + 1)
            items = self._units.items()
            if self._index >= len(items):
                raise MediaStreamError
            unit = items[self._index]
            self._index += 1
            # A shared encode that lags behind may still append units from before the
            # viewer's start: they are not this viewer's.
            if self._leads or self._units.seconds(unit) >= self._start_s - 1e-6:
                return unit

    async def _wait_for(self, count: int) -> None:
        if len(self._units.items()) >= count:
            return
        try:
            await self._units.wait_for(count)
        except Exception as error:  # the stream broke: this track ends with it
            raise MediaStreamError from error

    async def _first_keyframe(self) -> int:
        index = index_at(self._units, self._clock.join_s)
        while True:
            await self._wait_for(index + 1)
            items = self._units.items()
            if index >= len(items):  # ended with no keyframe past the join point
                index = _last_keyframe(items)
                if index is None:
                    raise MediaStreamError
                break
            if items[index].keyframe:
                break
            index += 1
        self._clock.start(self._units.seconds(self._units.items()[index]))
        return index

    async def _first_unit(self) -> int:
        self._start_s = await self._clock.started()
        return index_at(self._units, self._start_s)


def _last_keyframe(items: list[AccessUnit]) -> int | None:
    for index in range(len(items) - 1, -1, -1):
        if items[index].keyframe:
            return index
    return None
