"""One rendition's media as its WebRTC viewers share it: read once, encoded at most once.

`JobMedia` follows a rendition's segment log (the same log its HTTP viewers read) and
takes each fragment apart into access units as it is committed (`codecs.access_units`,
a few hundred microseconds a fragment, on the loop). The H.264 units go to every
viewer whose peer takes the job's H.264 as it is; a peer that cannot gets VP8 from one
encode per job (`codecs.transcode`), which starts with the first such viewer, and
audio goes out as Opus from one encode per job. The transcodes run in a thread, one
unit at a time, and append to logs of their own.

Every log here is a `FollowableLog`: appended to without waiting for anyone, followed
by each viewer at its own pace. So a slow or lossy peer, or one that left, holds back
nothing: not the job (whose log is the HTTP viewers' too), not another viewer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from fractions import Fraction

from vaecast.codecs.access_units import AccessUnit, AccessUnitReader
from vaecast.codecs.fmp4_reader import parse_init_segment
from vaecast.codecs.transcode import OPUS_RATE, OpusTranscoder, Vp8Transcoder
from vaecast.errors import DecodeFailedError, VaecastError
from vaecast.server.stream.segment_log import FollowableLog, SegmentLog

log = logging.getLogger("vaecast.webrtc")


class UnitLog(FollowableLog[AccessUnit]):
    """Access units of one stream, in presentation order; times in `time_base`.

    Units given with `receive` keep the loop time they came at (the peers' process
    tells a stream that ran dry from a sender that woke late by it)."""

    def __init__(self, time_base: Fraction) -> None:
        super().__init__()
        self.time_base = time_base
        self._arrivals: list[float | None] = []  # by index; None: appended without a time

    def seconds(self, unit: AccessUnit) -> float:
        return float(unit.pts * self.time_base)

    def receive(self, units: list[AccessUnit], at: float) -> None:
        """Append `units`, which came at `at` (the loop's clock)."""
        self._arrivals += [None] * (len(self) - len(self._arrivals))
        for unit in units:
            self.append(unit)
            self._arrivals.append(at)

    def arrived_at(self, index: int) -> float | None:
        """When unit `index` came, if it came through `receive`."""
        return self._arrivals[index] if index < len(self._arrivals) else None


class JobMedia:
    """The access units of one rendition, for its WebRTC viewers.

    Made when the first viewer of a rendition arrives and closed (`close`) when the last
    one has left. `count_encode(codec)` is told each time a shared encode starts."""

    def __init__(
        self, segments: SegmentLog, count_encode: Callable[[str], None] = lambda _: None
    ) -> None:
        self._segments = segments
        self._count_encode = count_encode
        self._ready = asyncio.Event()
        self._error: VaecastError | None = None
        self.reader: AccessUnitReader | None = None
        self.h264: UnitLog | None = None
        self.aac: UnitLog | None = None
        # The index in `h264` of each fragment's first unit, one entry per fragment read.
        self._fragment_starts: FollowableLog[int] = FollowableLog()
        self._vp8: UnitLog | None = None
        self._opus: UnitLog | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._start(self._follow(), "vaecast-webrtc-media")

    async def ready(self) -> AccessUnitReader:
        """Once the init segment is read: its tracks. Raises why a rendition broke first."""
        await self._ready.wait()
        if self.reader is None:
            assert self._error is not None
            raise self._error.detached()
        return self.reader

    async def join_point_s(self) -> float:
        """Where a viewer arriving now starts from: the presentation time of the first
        fragment not yet committed (its next keyframe is where its picture starts)."""
        committed = max(0, len(self._segments) - 1)  # fragments; the first segment is init
        await self._fragment_starts.wait_for(committed)
        assert self.h264 is not None
        starts = self._fragment_starts.items()
        units = self.h264.items()
        index = starts[committed] if committed < len(starts) else len(units)
        if index < len(units):
            return self.h264.seconds(units[index])
        if not units:
            return 0.0
        return self.h264.seconds(units[-1]) + float(units[-1].duration * self.h264.time_base)

    def vp8(self, from_s: float) -> UnitLog:
        """VP8 from the job's H.264, from its first keyframe at `from_s` or later: one
        encode, shared (a later viewer starts later in it)."""
        if self._vp8 is None:
            assert self.reader is not None and self.h264 is not None
            video = self.reader.video
            fps = video.timescale / max(1, self._frame_ticks())
            transcoder = Vp8Transcoder(video.width, video.height, fps, video.timescale)
            self._vp8 = UnitLog(self.h264.time_base)
            self._count_encode("vp8")
            self._start(
                self._transcode(self.h264, from_s, transcoder, self._vp8, True),
                "vaecast-webrtc-vp8",
            )
        return self._vp8

    def opus(self, from_s: float) -> UnitLog | None:
        """The job's audio as Opus from `from_s` on: one encode, shared; None without audio."""
        if self.aac is None:
            return None
        if self._opus is None:
            assert self.reader is not None and self.reader.audio is not None
            audio = self.reader.audio
            transcoder = OpusTranscoder(audio.audio_specific_config, audio.sample_rate)
            self._opus = UnitLog(Fraction(1, OPUS_RATE))
            self._count_encode("opus")
            self._start(
                self._transcode(self.aac, from_s, transcoder, self._opus, False),
                "vaecast-webrtc-opus",
            )
        return self._opus

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _frame_ticks(self) -> int:
        assert self.h264 is not None
        units = self.h264.items()
        return units[0].duration if units else 1

    def _start(self, work: object, name: str) -> None:
        task = asyncio.ensure_future(work)  # type: ignore[arg-type]
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self) -> None:
        try:
            first = True
            async for segment in self._segments.follow():
                if first:
                    self._read_init(segment)
                    first = False
                    continue
                assert self.reader is not None and self.h264 is not None
                units = self.reader.read(segment)
                self._fragment_starts.append(len(self.h264))
                for unit in units.video:
                    self.h264.append(unit)
                if self.aac is not None:
                    for unit in units.audio:
                        self.aac.append(unit)
        except VaecastError as error:
            self._end(error)
        except ValueError as error:  # not a stream this code wrote: nothing to send
            log.warning("webrtc: a fragment could not be read: %s", error)
            self._end(DecodeFailedError(f"the video's fragments could not be read: {error}"))
        else:
            self._end(None)

    def _read_init(self, segment: bytes) -> None:
        self.reader = AccessUnitReader(parse_init_segment(segment))
        self.h264 = UnitLog(Fraction(1, self.reader.video.timescale))
        if self.reader.audio is not None:
            self.aac = UnitLog(Fraction(1, self.reader.audio.sample_rate))
        self._ready.set()

    def _end(self, error: VaecastError | None) -> None:
        self._error = error
        self._ready.set()
        for stream in (self.h264, self.aac, self._fragment_starts):
            if stream is None:
                continue
            if error is None:
                stream.finish()
            else:
                stream.abort(error)

    async def _transcode(
        self,
        source: UnitLog,
        from_s: float,
        transcoder: Vp8Transcoder | OpusTranscoder,
        target: UnitLog,
        from_keyframe: bool,
    ) -> None:
        """Feed `source` from time `from_s` (from its next keyframe if `from_keyframe`)
        through `transcoder` into `target`, a unit at a time in a thread."""
        waiting_for_keyframe = from_keyframe
        try:
            async for unit in source.follow(index_at(source, from_s)):
                if waiting_for_keyframe and not unit.keyframe:
                    continue
                waiting_for_keyframe = False
                for out in await asyncio.to_thread(transcoder.transcode, unit):
                    target.append(out)
        except VaecastError as error:
            target.abort(error)
        except Exception as error:  # a codec failure ends this encode, not the job
            log.warning("webrtc: the shared encode stopped: %s", error)
            with contextlib.suppress(RuntimeError):
                target.abort(DecodeFailedError(f"the WebRTC encode failed: {error}"))
        else:
            target.finish()


def index_at(units: UnitLog, at_s: float) -> int:
    """The index of the first unit presented at `at_s` or later (the end if none yet)."""
    items = units.items()
    index = len(items)
    while index > 0 and units.seconds(items[index - 1]) >= at_s - 1e-6:
        index -= 1
    return index
