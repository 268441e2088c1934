"""The live rendition of a job with a preview: per chunk, the final's fragment when it
is there by that chunk's playout deadline, the preview's otherwise.

One stream any player plays (`/content?variant=live`, `live/playlist.m3u8`, WHEP
`?variant=live`): one init segment, one track, and each fragment the very bytes of
the preview's or the final's fragment of that chunk, after an `emsg` box naming which
(`codecs.timed_metadata`: an ID3 `TXXX` frame `vaecast_source`, which hls.js shows as
a metadata cue). Both renditions are encoded with the same settings at the same size,
so their init segments are the same bytes, and their fragment k has the same sequence
number and decode times (`codecs.stream` numbers them by chunk). The live rendition
re-encodes nothing: no third encoder competes with the decode, and each of its chunks
decodes to exactly the frames of the rendition its record (`sources`) and its `emsg`
name.

Splicing needs each switch to land on a keyframe. `preview_keyframe` and
`final_keyframe` are asked (on the loop) as each rendition's chunk goes to its
encoder: the preview starts chunk k with a keyframe unless the live stream has
already taken the preview's chunk k-1 (a switch down to the preview must always be
possible: that is what keeps a viewer from stalling; a preview running ahead thus
has a keyframe at every chunk, and more bytes: benchmarks/results/never_stall.md); the
final starts chunk k with one only where the live stream has taken the preview's chunk
k-1 and may still take this one (a switch up). Where the live stream has not decided
chunk k-1 yet, the final's chunk k-1 is out already (each rendition's chunks are
encoded in order), the rule will take it, and chunk k follows it as it is. So a final
that is ahead, or falls behind for good, encodes as it would alone. The splice checks
the keyframe anyway: a fragment that cannot follow the live stream's last one is not
taken.

The rule (`vaecast.job.live_choice`): the live stream's first fragment goes out
`delay_s` after the first fragment of either rendition, the delay chosen from the
rates measured so far (`live_choice.start_delay_s`: at least the preview's stall-free
start; more, up to `MAX_DELAY_S`, while the final needs it or its rate is not known).
Chunk k is then due at `start + frame_start / fps`; it takes the final's fragment as
soon as that is there, and the preview's `MARGIN_S` before its deadline (at once once
the final has ended: nothing better will come). A chunk committed late moves later
deadlines by as much, as a player that stalled does. Once both renditions have
ended, nothing is left to wait for and the rest goes out at once.

A job is given one where the two decoders cut the same chunks (`lines_up`). A push
session's sound is cut into fragments by its arrival, which each rendition may see
differently: a fragment is taken only where its audio starts where the live stream's
ends (`_can_take`), and the sound after the last frame comes from the rendition
whose last chunk the live stream took.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from vaecast.codecs.fragment import Fragment, FragmentFacts
from vaecast.codecs.h264 import media_timescale
from vaecast.codecs.stream import AUDIO_TRACK_ID as AUDIO
from vaecast.codecs.stream import VIDEO_TRACK_ID as VIDEO
from vaecast.codecs.timed_metadata import emsg_id3, id3_txxx
from vaecast.errors import DecodeFailedError, VaecastError
from vaecast.job.live_choice import MAX_DELAY_S, decide, start_delay_s
from vaecast.job.record import (
    FINAL,
    LIVE,
    PREVIEW,
    JobInput,
    JobStatus,
    LiveChunk,
    SegmentAdded,
    Transition,
    VariantEnded,
)
from vaecast.job.transitions import Variant
from vaecast.models.base import ChunkedDecoder
from vaecast.playback_deadlines import Commit, stall_free_start_s
from vaecast.server.stream.finished_file import state_duration
from vaecast.server.stream.job import Job
from vaecast.server.stream.job_requests import DecodeRequest, PushRequest
from vaecast.server.stream.rendition import Rendition

log = logging.getLogger("vaecast.jobs")

# How long before a chunk's deadline the preview's fragment is taken, when the final's
# is not there: a copy takes well under a millisecond; the rest is the way to the
# viewer (a socket write, a player's append).
MARGIN_S = 0.1
# The ID3 frame that names each live fragment's source (its `emsg`).
SOURCE_KEY = "vaecast_source"
# Chunk sizes compared when a push session's plans are checked before its first block.
_PROBE_CHUNKS = 8


def lines_up(
    final: ChunkedDecoder, preview: ChunkedDecoder, request: DecodeRequest | PushRequest
) -> bool:
    """Whether a job of `request` can have a live rendition: both decoders cut its
    latents into the same chunks."""
    if isinstance(request, DecodeRequest):
        shape = tuple(request.latents.shape)
        return final.plan(shape).chunk_frames == preview.plan(shape).chunk_frames
    # A push session's length comes at its end: compare the chunk rule on a probe block
    # (the splice checks each chunk's length as it goes).
    probe = (1, final.latent_channels, 3, 32, 32)
    try:
        ours, theirs = final.plan_stream(probe), preview.plan_stream(probe)
    except Exception:  # a decoder (a plugin's) that cannot plan the probe: no splice
        return False
    return all(ours.frames_of(i) == theirs.frames_of(i) for i in range(_PROBE_CHUNKS))


@dataclass(slots=True)
class _Side:
    """One rendition the live stream takes fragments from, as the splice follows it."""

    rendition: Rendition
    commits: list[Commit] = field(default_factory=list)
    frames: int = 0  # its fragments' frames so far
    audio_ends: list[int] = field(default_factory=list)  # audio ticks to each fragment's end

    @property
    def log_closed(self) -> bool:
        return self.rendition.log.closed

    def has(self, index: int) -> bool:
        return len(self.audio_ends) > index

    def keyframe(self, index: int) -> bool:
        return self.rendition.fragments.facts[index].keyframe

    def audio_before(self, index: int) -> int:
        return self.audio_ends[index - 1] if index > 0 else 0

    def took(self, facts: FragmentFacts, at: float, fps: float) -> None:
        """Its next fragment came, at `at`."""
        ticks = dict(facts.track_ticks)
        self.audio_ends.append(self.audio_before(len(self.audio_ends)) + ticks.get(AUDIO, 0))
        if VIDEO in ticks:  # (not the sound after a push session's last frame)
            self.commits.append(Commit(at, self.frames / fps, facts.duration_s))
            self.frames += round(facts.duration_s * fps)


class LiveRendition:
    """Splices a job's live rendition (see the module docstring); `run` is its task."""

    def __init__(self, job: Job, margin_s: float = MARGIN_S, max_delay_s: float = MAX_DELAY_S):
        assert job.preview is not None and job.live is not None
        self._job = job
        self._live = job.live
        self._sides = {PREVIEW: _Side(job.preview), FINAL: _Side(job.final)}
        self._margin_s, self._max_delay_s = margin_s, max_delay_s
        self._clock = job.record.clock
        self._fps = float(job.record.fps)
        self._sources: list[Variant] = []
        self._audio_ticks = 0  # the live stream's audio so far, in its track's ticks
        self._changed = asyncio.Event()
        self._first_at: float | None = None  # either rendition's first fragment
        job.observe(self._transition)
        for side in self._sides.values():
            side.rendition.log.add_listener(_Wake(self._changed))

    # Asked by each rendition's pipeline, on the loop, as a chunk goes to its encoder.

    def preview_keyframe(self, index: int) -> bool:
        return not self._took(index - 1, PREVIEW)

    def final_keyframe(self, index: int) -> bool:
        # Chunk index-1 not taken yet: the final's is out already (chunks are encoded in
        # order), so the live stream will take it, and this one follows it as it is.
        return index >= len(self._sources) and self._took(index - 1, PREVIEW)

    def _took(self, index: int, source: Variant) -> bool:
        return 0 <= index < len(self._sources) and self._sources[index] == source

    # The splice.

    async def run(self) -> None:
        """The live rendition, to its end; records how it ended, never raises."""
        try:
            await self._splice()
        except VaecastError as error:
            self._ended(JobStatus.FAILED, error)
        except asyncio.CancelledError:
            if not self._live.log.closed:
                self._live.log.abort(self._job.error or DecodeFailedError("cancelled"))
            raise
        except Exception as error:
            log.exception("job %s: its live rendition failed", self._job.id)
            self._ended(JobStatus.FAILED, DecodeFailedError(f"internal error: {error}"))
        else:
            self._job.apply(VariantEnded(LIVE, JobStatus.COMPLETED))
            self._live.log.finish()

    async def _splice(self) -> None:
        sink = self._job.sink(LIVE)
        await sink.append(await self._init_segment())
        start_at: float | None = None
        shift = 0.0  # how far the viewer's stalls moved every later deadline
        frames_taken = 0
        while not self._all_taken():
            index = len(self._sources)
            due = None if start_at is None else start_at + shift + frames_taken / self._fps
            choice = await self._choose(index, due)
            facts = self._sides[choice].rendition.fragments.facts[index]
            self._check_lengths(index)
            data = await self._sides[choice].rendition.log.read_segment(index + 1)
            self._sources.append(choice)
            self._audio_ticks = self._sides[choice].audio_ends[index]
            frames = round(facts.duration_s * self._fps)
            data = self._source_mark(index, choice, frames_taken, frames) + data
            await sink.append(Fragment(data, facts))
            committed = self._clock()
            if due is None:
                start_at = committed
            else:
                shift += max(0.0, committed - due)
            assert self._first_at is not None and start_at is not None
            delay = round(start_at - self._first_at, 4)
            self._job.apply(LiveChunk(index, choice, frames_taken, frames, len(data), delay))
            self._job.metrics.live_chunks.labels(str(choice)).inc()
            frames_taken += frames
        await self._take_tail(sink)
        await state_duration(self._live)

    def _source_mark(self, index: int, source: Variant, frame_start: int, frames: int) -> bytes:
        """Which rendition chunk `index` is, as timed metadata over its span."""
        timescale, tick = media_timescale(self._job.record.fps)
        tag = id3_txxx(SOURCE_KEY, str(source))
        return emsg_id3(frame_start * tick, timescale, frames * tick, index, tag)

    async def _take_tail(self, sink: Any) -> None:
        """A push session's sound after its last frame: the last fragment of the
        rendition the last chunk came from (or of the other, where it continues the
        same audio), once that rendition has ended. Nothing for a video without live
        audio: its last chunk's fragment carried all of its sound."""
        record = self._job.record
        if record.input != JobInput.PUSH or record.audio is None or not self._sources:
            return
        index = len(self._sources)
        last = self._sides[self._sources[-1]]
        while not (last.log_closed or self._both_ended()):
            self._changed.clear()
            await self._wait(None)
        for side in (last, *(s for s in self._sides.values() if s is not last)):
            if side.has(index) and side.audio_before(index) == self._audio_ticks:
                data = await side.rendition.log.read_segment(index + 1)
                await sink.append(Fragment(data, side.rendition.fragments.facts[index]))
                return

    async def _choose(self, index: int, due: float | None) -> Variant:
        """Which rendition's chunk `index` the live stream takes (`due`: its deadline;
        None for the first chunk), once the rule says."""
        while True:
            self._changed.clear()
            now = self._clock()
            if due is None:
                choice, wake_at = self._first(now)
            else:
                choice, wake_at = self._next(index, now, due)
            if choice is not None:
                return choice
            if self._both_ended():
                raise DecodeFailedError(
                    f"the live rendition has no fragment for chunk {index}: "
                    "its preview and final ended without one it can take"
                )
            await self._wait(wake_at)

    async def _init_segment(self) -> bytes:
        """Both renditions' init segment (the same bytes, or there is no splice)."""
        logs = [side.rendition.log for side in self._sides.values()]
        while not all(len(log) or log.closed for log in logs):
            self._changed.clear()
            await self._wait(None)
        inits = {await log.read_segment(0) for log in logs if len(log)}
        if len(inits) != 1:
            raise DecodeFailedError(
                "the live rendition cannot splice: its preview and final streams differ"
                if inits
                else "the live rendition has no stream: its preview and final both ended"
            )
        return inits.pop()

    def _first(self, now: float) -> tuple[Variant | None, float | None]:
        """The first chunk: once either rendition has it and the start delay (from the
        first fragment of either) has passed; at once when both have ended."""
        if self._first_at is None:
            return None, None
        if not self._both_ended():
            delay = self._start_delay()
            if delay is None:
                return None, None
            if now < self._first_at + delay:
                return None, self._first_at + delay
        for source in (FINAL, PREVIEW):
            if self._can_take(source, 0):
                return source, None
        return None, None

    def _next(self, index: int, now: float, due: float) -> tuple[Variant | None, float | None]:
        """Chunk `index`, due at `due`: the rule, given what can follow the last chunk."""
        final_ready = self._can_take(FINAL, index)
        preview_ready = self._can_take(PREVIEW, index)
        final_coming = final_ready or not self._sides[FINAL].log_closed
        choice = decide(now, due, self._margin_s, final_ready, preview_ready, final_coming)
        wake_at = due - self._margin_s if choice is None and preview_ready else None
        return None if choice is None else Variant(choice), wake_at

    def _can_take(self, source: Variant, index: int) -> bool:
        """Whether `source`'s chunk `index` is there and can follow the live stream so
        far: it starts on a keyframe or follows its own chunk before, and its audio
        starts where the live stream's ends (a push session's sound is cut by its
        arrival, which each rendition may have seen differently)."""
        side = self._sides[source]
        if not side.has(index) or side.audio_before(index) != self._audio_ticks:
            return False
        return index == 0 or self._sources[-1] == source or side.keyframe(index)

    def _start_delay(self) -> float | None:
        """From the rates so far: each rendition's stall-free start, from the first
        fragment of either (None: the preview's rate is not known yet)."""
        assert self._first_at is not None
        total_s = self._total_s()
        preview, final = (self._stall_free(self._sides[side], total_s) for side in (PREVIEW, FINAL))
        if preview is None:
            if not self._sides[PREVIEW].log_closed:
                return None
            preview = 0.0  # no preview (it failed): the final alone
        if final is None and self._sides[FINAL].log_closed:
            final = preview  # no final: nothing to wait for
        return start_delay_s(preview, final, self._margin_s, self._max_delay_s)

    def _stall_free(self, side: _Side, total_s: float | None) -> float | None:
        if not side.commits:
            return None
        own = stall_free_start_s(side.commits, total_s)
        assert self._first_at is not None
        return None if own is None else own + side.commits[0].at - self._first_at

    def _total_s(self) -> float | None:
        return self._job.record.length_s()

    def _all_taken(self) -> bool:
        plan = self._job.record.plan
        if plan is not None:
            return len(self._sources) >= plan.chunks
        # A push session's length comes with its last block: until then, more may come.
        return self._both_ended() and not any(
            side.has(len(self._sources)) for side in self._sides.values()
        )

    def _both_ended(self) -> bool:
        return all(side.log_closed for side in self._sides.values())

    def _check_lengths(self, index: int) -> None:
        """Both renditions' chunk `index` (where both have it) span the same frames."""
        sides = [side for side in self._sides.values() if side.has(index)]
        lengths = {side.rendition.fragments.facts[index].duration_s for side in sides}
        if len(lengths) > 1:
            raise DecodeFailedError(
                f"the live rendition cannot splice chunk {index}: the preview's and the "
                f"final's span different frames"
            )

    async def _wait(self, until: float | None) -> None:
        """Until either rendition changes, or `until` (this clock's), whichever first."""
        if until is None:
            await self._changed.wait()
            return
        timeout = until - self._clock()
        if timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def _transition(self, transition: Transition, _event: Any) -> None:
        if isinstance(transition, SegmentAdded) and transition.variant in self._sides:
            side = self._sides[transition.variant]
            facts = side.rendition.fragments.facts
            if len(facts) > len(side.audio_ends):  # a fragment (not the init segment)
                at = self._clock()
                side.took(facts[-1], at, self._fps)
                if self._first_at is None:
                    self._first_at = at
            self._changed.set()
        elif isinstance(transition, VariantEnded):
            self._changed.set()

    def _ended(self, status: JobStatus, error: VaecastError) -> None:
        error = error.detached()
        if not self._job.record.is_final:
            self._job.apply(VariantEnded(LIVE, status, error))
        if not self._live.log.closed:
            self._live.log.abort(error)


class _Wake:
    """A rendition's log listener: wakes the splice at its close (which comes after the
    rendition's `VariantEnded`). A segment wakes it through the job's `SegmentAdded`
    instead, which comes once the fragment's facts are indexed: a wake here, inside the
    log's append, would find nothing new yet."""

    def __init__(self, changed: asyncio.Event) -> None:
        self._changed = changed

    def appended(self, segment: bytes) -> None:
        pass

    def closed(self) -> None:
        self._changed.set()
