"""Push sessions: latents pushed over HTTP while a generator produces them.

`POST /v1/videos {"input": "push", ...}` creates a job whose latent source is a
LatentFeed and answers its push URL and a secret token (shown only then).
`POST /v1/videos/{id}/latents` with `X-Push-Token` appends a block; `?final=1` (or
metadata `final`) marks the last one, and an empty body with `?final=1` just ends
the session. Viewers use what every job has (`/content`, `/events`, the page) and
see the video from its first block; the length is known at the end.

The feed's queue is bounded: a push waits while it is full, which is the
backpressure a producer wants. A session that receives nothing for
`push_idle_timeout_s`, or no block within `push_first_block_timeout_s` of its start,
fails with a recorded error, and its viewers' streams end.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import secrets
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from aiohttp import web

from vaecast.codecs.aac import AAC_FRAME_SAMPLES
from vaecast.errors import (
    DecodeCancelled,
    DecodeFailedError,
    ForbiddenError,
    InvalidRequestError,
    JobInterruptedError,
    JobStateError,
    NotFoundError,
    PreconditionRequiredError,
    SessionTimeoutError,
    UnauthorizedError,
)
from vaecast.job.transitions import JobInput
from vaecast.latent_files import AUDIO_RATE_KEY, LatentFile, check_audio, load_latents
from vaecast.latent_files.frames import load_frames
from vaecast.models.layouts import layout_of
from vaecast.models.sound import AUDIO_LATENTS_KEY
from vaecast.pipeline.run import TimedAudio
from vaecast.push_ledger import (
    SEQ_HEADER,
    PushGapError,
    PushLedger,
    parse_seq,
    session_timeout,
)
from vaecast.server.config import ServerConfig
from vaecast.server.contract.models import PushAccepted
from vaecast.server.contract.shared import (
    JOB_LOOKUP_ERRORS,
    JSON,
    LATENT_BODY,
    PUSH_SEQ,
    UPLOAD_ERRORS,
    VIDEO_ID,
)
from vaecast.server.contract.spec import Param, Reply, operation
from vaecast.server.intake.uploads import read_upload
from vaecast.server.stream.job import Job, PushKind
from vaecast.server.stream.manager import JobManager

TOKEN_HEADER = "X-Push-Token"
FINAL_VALUES = frozenset({"1", "true", "yes"})
# `POST /v1/videos/{id}/latents`, as the OpenAPI document shows it (push_latents).
PUSH_LATENTS = operation(
    "Push a block of latents (or frames) to a push session",
    tag="push",
    params=(
        VIDEO_ID,
        PUSH_SEQ,
        Param("final", "query", {"type": "string", "maxLength": 5}, "1, true or yes: the last"),
    ),
    body=LATENT_BODY,
    body_required=False,
    replies=(Reply(202, "the block is queued (or was taken before)", {JSON: PushAccepted}),),
    errors=(
        *UPLOAD_ERRORS,
        *JOB_LOOKUP_ERRORS,
        JobStateError,
        PushGapError,
        PreconditionRequiredError,
        ForbiddenError,
        UnauthorizedError,
        SessionTimeoutError,
        JobInterruptedError,
        DecodeCancelled,
        DecodeFailedError,
    ),
    extra_security=("pushToken",),
)


class PushSession:
    """One push session's token, its order of pushes, and its idle watchdog."""

    def __init__(self, job: Job, manager: JobManager) -> None:
        """The session's secret is its runner's (`push_token`: Ray mode's, kept in the
        cluster), or a new one; its idle timeout is watched here unless the runner's
        says it is watched elsewhere (`watches_push_idle`)."""
        assert job.feed is not None, "a push session's job has a feed"
        self.job = job
        self.feed = job.feed
        runner = job.runner
        self.token = getattr(runner, "push_token", None) or secrets.token_urlsafe(32)
        watch_idle = getattr(runner, "watches_push_idle", True)
        self._manager = manager
        self._config: ServerConfig = manager.config
        self._pushing = asyncio.Lock()  # blocks are appended in the order they came
        self._last_push = time.perf_counter()
        self._dtype: torch.dtype | None = None
        self._block_shape: tuple[int, ...] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self.ledger = PushLedger()
        self._in_flight: set[asyncio.Future[dict[str, Any]]] = set()
        if watch_idle:
            self._watchdog = asyncio.create_task(self._watch_idle(), name=f"push-idle-{job.id}")

    def authorize(self, presented: str | None) -> None:
        if not presented:
            raise UnauthorizedError(f"pushing latents needs the session's {TOKEN_HEADER} header")
        if not hmac.compare_digest(presented.encode(), self.token.encode()):
            raise ForbiddenError(f"the {TOKEN_HEADER} is not this session's token")

    async def push(
        self, data: bytes, final: bool, params: dict[str, str], seq: int | None = None
    ) -> dict[str, Any]:
        """Append block `seq` (or only end the session); the 202 body. A block already
        taken is answered again with its answer (`PushLedger`).

        The push runs to its end even if the producer's connection drops meanwhile (the
        handler is cancelled, not the push): a block the session took is then recorded
        as taken, so that the producer's retry is a replay, not a second copy."""
        task = asyncio.ensure_future(self._push(data, final, params, seq))
        self._in_flight.add(task)
        task.add_done_callback(self._forget)
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Future[dict[str, Any]]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a push whose producer left fails silently

    def replayed(self, seq: int | None) -> bool:
        """Whether block `seq` was taken already (then the push is a replay, answered
        even after the session ended); raises for a gap or a missing index."""
        return self.ledger.replay(seq) is not None

    async def _push(
        self, data: bytes, final: bool, params: dict[str, str], seq: int | None
    ) -> dict[str, Any]:
        async with self._pushing:
            answer = self.ledger.replay(seq)
            if answer is not None:
                return answer
            await self._sync()
            self.check_open()
            self._last_push = time.perf_counter()
            if data:
                latents, audio, final_in_file = await asyncio.to_thread(
                    self._parse_block, data, params
                )
                final = final or final_in_file
                self.check_open()  # it may have ended while the block was parsed
                assert self._dtype is not None
                await self.feed.put(latents, audio, dtype=dtype_name(self._dtype))
            elif not final:
                raise InvalidRequestError("the block is empty; send latents, or ?final=1 to end")
            # Recorded before anything else can be awaited: the block is in the feed.
            answer = self.ledger.taken(seq, {"latent_frames": self.feed.latent_frames})
            if final:
                await self._end()
            self._last_push = time.perf_counter()
            return {**answer, "frames_done": self.job.record.frames_done}

    async def take(
        self, latents: torch.Tensor, audio: TimedAudio | None, *, wait_for_room: bool = True
    ) -> None:
        """Queue a block another owner read and `accept`ed (a batch's entry)."""
        async with self._pushing:  # the idle watchdog waits while a push waits
            self.check_open()
            self._last_push = time.perf_counter()
            await self.feed.put(latents, audio, wait_for_room=wait_for_room)
            self._last_push = time.perf_counter()

    async def end(self) -> None:
        """The final mark for a session whose blocks another owner pushes."""
        async with self._pushing:
            if not (self.feed.ended or self.job.record.is_final):
                await self._end()

    async def close(self) -> None:
        tasks = [*self._in_flight, *([self._watchdog] if self._watchdog else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _sync(self) -> None:
        """Before a push: take in what the feed keeps elsewhere (Ray mode: the shared
        job's first block shape and dtype; a LatentFeed keeps nothing elsewhere)."""
        shared = await self.feed.shared_state()
        if shared is not None:
            self._block_shape, dtype = shared
            self._dtype = None if dtype is None else getattr(torch, dtype)

    def check_open(self) -> None:
        if self.feed.ended:
            raise JobStateError(f"video {self.job.id} has had its final block")
        if self.job.record.is_final:
            raise JobStateError(f"video {self.job.id} has ended: {self.job.record.status.value}")

    async def _end(self) -> None:
        if self._block_shape is None:
            await self.feed.end()  # nothing was pushed: the job ends, cancelled
            return
        total = (1, self._block_shape[1], self.feed.latent_frames, *self._block_shape[3:])
        self.job.length_known(self.job.decoder.plan(total), total)
        await self.feed.end()

    def _parse_block(
        self, data: bytes, params: dict[str, str]
    ) -> tuple[torch.Tensor, TimedAudio | None, bool]:
        """Runs in a thread: the block's tensor checked against the session, its audio."""
        return self.accept(self.read(data, params), params)

    def read(self, data: bytes, params: dict[str, str], batch: int = 1) -> LatentFile:
        """Runs in a thread: a block as read, its shape (one video's, of a `batch`)
        checked against the session before any data is touched."""
        frames = self.job.push_kind is PushKind.FRAMES

        def check_shape(shape: tuple[int, ...]) -> None:
            first = self._block_shape
            if first is not None and (shape[1], *shape[3:]) != (first[1], *first[3:]):
                raise InvalidRequestError(
                    f"this block's {self._noun} are {shape[1]}x{shape[3]}x{shape[4]} (C x H x "
                    f"W); the session's first block fixed {first[1]}x{first[3]}x{first[4]}"
                )
            self._manager.check_stream_shape(self.job, self.feed.latent_frames + shape[2], shape)
            if first is None:
                self.job.decoder.plan_stream(shape)  # channels and size the decoder takes

        if frames:
            return load_frames(data, check_shape, max_batch=batch)
        layout = layout_of(self.job.decoder)
        return load_latents(
            data,
            check_shape,
            layout=lambda metadata: layout.bind({**metadata, **params}),
            max_batch=batch,
        )

    def accept(
        self, latent_file: LatentFile, params: dict[str, str]
    ) -> tuple[torch.Tensor, TimedAudio | None, bool]:
        """Runs in a thread: one video's block, read, checked against what the session
        took before (dtype), with its audio placed on the video's timeline."""
        latents = latent_file.latents
        if self._dtype is not None and latent_file.dtype != self._dtype:
            raise InvalidRequestError(
                f"this block's {self._noun} are {dtype_name(latent_file.dtype)}; "
                f"the session's first block was {dtype_name(self._dtype)}"
            )
        merged = {**latent_file.metadata, **params}
        if latent_file.audio_latents is not None:
            raise InvalidRequestError(
                f"a pushed block takes 'audio' (its waveform), not {AUDIO_LATENTS_KEY}: "
                "upload the whole clip's audio latents with its latents (POST /v1/videos)"
            )
        audio = None
        if latent_file.audio is not None:
            waveform = self._check_audio(latent_file.audio, merged.get(AUDIO_RATE_KEY))
            audio = self._place_audio(waveform, tuple(latents.shape))
        if self._block_shape is None:
            self.job.decoder.plan_stream(tuple(latents.shape))  # fixes a frames chunk size
            self._block_shape, self._dtype = tuple(latents.shape), latent_file.dtype
        final = str(latent_file.metadata.get("final", "")).lower() in FINAL_VALUES
        return latents, audio, final

    @property
    def _noun(self) -> str:
        return "frames" if self.job.push_kind is PushKind.FRAMES else "latents"

    def _check_audio(self, audio: torch.Tensor, rate_text: str | None) -> np.ndarray:
        expected = self.job.record.audio
        if expected is None:
            raise InvalidRequestError(
                "this session was created without audio: give audio_sample_rate and "
                "audio_channels when creating it"
            )
        waveform, rate = check_audio(audio, rate_text or str(expected["sample_rate"]))
        if (rate, waveform.shape[0]) != (expected["sample_rate"], expected["channels"]):
            raise InvalidRequestError(
                f"this block's audio is {waveform.shape[0]} channel(s) at {rate} Hz; the session "
                f"was created for {expected['channels']} at {expected['sample_rate']} Hz"
            )
        return waveform

    def _place_audio(self, waveform: np.ndarray, shape: tuple[int, ...]) -> TimedAudio:
        """A block's audio, starting at its first video frame; no longer than the block's
        video (plus an AAC frame of slack), so no block can ask for hours of silence."""
        start, count = self.feed.latent_frames, shape[2]
        first_frame = self._frames_of(start, shape)
        block_frames = self._frames_of(start + count, shape) - first_frame
        rate = int(self.job.record.audio["sample_rate"]) if self.job.record.audio else 0
        allowed = math.ceil(block_frames * rate / self.job.record.fps) + AAC_FRAME_SAMPLES
        if waveform.shape[1] > allowed:
            raise InvalidRequestError(
                f"this block's audio has {waveform.shape[1]} samples; its {block_frames} "
                f"video frames last {allowed - AAC_FRAME_SAMPLES} at {rate} Hz"
            )
        return TimedAudio(waveform, first_frame)

    def _frames_of(self, latent_frames: int, shape: tuple[int, ...]) -> int:
        """Video frames that the first `latent_frames` latent frames decode to."""
        return self.job.decoder.plan_stream(shape).frames_for(latent_frames)

    async def _watch_idle(self) -> None:
        """Fail the session once it has received nothing for its idle timeout, or no
        block for its first-block timeout from its start (it then holds a pending place
        that others may be refused for)."""
        idle_s = self._config.push_idle_timeout_s
        first_s = self._config.push_first_block_timeout_s
        opened = self._last_push
        while not self.job.record.is_final and not self.feed.ended:
            has_block, pushing = self._block_shape is not None, self._pushing.locked()
            wait_s, error = session_timeout(
                time.perf_counter(), opened, self._last_push, pushing, has_block, idle_s, first_s
            )
            if error is not None:
                self.job.abort(error)
                return
            await asyncio.sleep(wait_s)


class PushSessions:
    """The sessions of one server, by job id."""

    def __init__(self, manager: JobManager) -> None:
        self._manager = manager
        self.config = manager.config
        self._sessions: dict[str, Pushes] = {}

    def open(self, job: Job) -> PushSession:
        # Forget sessions whose job is gone (evicted or deleted): their ids answer 410.
        for job_id in [i for i in self._sessions if i not in self._manager.jobs]:
            del self._sessions[job_id]
        session = self._sessions[job.id] = PushSession(job, self._manager)
        return session

    def add(self, session: Pushes, job_ids: Sequence[str]) -> None:
        """Route the pushes to each of `job_ids` to `session` (a batch's)."""
        for job_id in job_ids:
            self._sessions[job_id] = session

    def get(self, job_id: str) -> Pushes:
        job = self._manager.get(job_id)  # 404 or 410 first
        session = self._sessions.get(job.id)
        if session is None and job.feed is not None and getattr(job.runner, "push_token", None):
            session = self.open(job)  # a session kept elsewhere (Ray mode), pushed to here
        if session is None and job.record.input == JobInput.PUSH and job.error is not None:
            # A session that ended in an earlier process (a restart: 409 `interrupted`).
            raise job.error.detached()
        if session is None:
            raise NotFoundError(f"video {job_id} is not a push session")
        return session

    async def close(self) -> None:
        unique = {id(s): s for s in self._sessions.values()}.values()
        await asyncio.gather(*(s.close() for s in unique))


class Pushes(Protocol):
    """What takes a job's pushes: its `PushSession`, or its batch's."""

    token: str
    job: Job

    def authorize(self, presented: str | None) -> None: ...
    def replayed(self, seq: int | None) -> bool: ...
    def check_open(self) -> None: ...
    async def push(
        self, data: bytes, final: bool, params: dict[str, str], seq: int | None = None
    ) -> dict[str, Any]: ...
    async def close(self) -> None: ...


def push_json(session: Pushes) -> dict[str, str]:
    return {"url": f"/v1/videos/{session.job.id}/latents", "token": session.token}


async def push_latents(request: web.Request, sessions: PushSessions) -> web.Response:
    """`POST /v1/videos/{id}/latents`: 202 once the block is queued (see the module)."""
    session = sessions.get(request.match_info["video_id"])
    session.authorize(request.headers.get(TOKEN_HEADER))
    seq = parse_seq(request.headers.get(SEQ_HEADER))
    # Before reading a body for nothing: a gap, a missing index, an ended session. A
    # retry of a block already taken is answered even once the session has ended.
    if not session.replayed(seq):
        session.check_open()
    upload = await read_upload(request, sessions.config)
    final = request.query.get("final", "").lower() in FINAL_VALUES
    body = await session.push(upload.data, final, {**request.query, **upload.fields}, seq)
    return web.json_response(body, status=202)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
