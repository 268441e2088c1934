"""A push session of B videos: one generator's batch (`num_videos_per_prompt`), pushed
as one stream of blocks and watched as B videos.

`POST /v1/videos {"input": "push", "batch": B, ...}` makes B jobs, each a push session
of its own (its feed, its decode, its viewers), and one `BatchPushSession` that owns
their pushes: one token, one index sequence, one push URL (any of the B videos'
`/latents` takes the whole batch). Each block is `(B, C, t, H, W)` latents (or
`(B, 3, t, H, W)` frames), read once and split: entry b goes to video b, with its audio
(`(B, channels, n)`, one waveform each, or one `(channels, n)` for all). A video the
user cancelled is skipped from then on, so the others go on; once all have ended, a
push is 409.

The B videos need not decode at once: with fewer decode slots than videos, a video
that waits for its slot takes its blocks without waiting for room (backpressure comes
from the videos that decode), so that the batch cannot deadlock on its own queues.
What the waiting videos hold is bounded by `max_upload_bytes`, what one upload of the
whole batch's latents could hold: past it, a push is 413 and says to raise
`--decode-slots`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import torch

from vaecast.errors import InvalidRequestError, JobStateError, PayloadTooLargeError
from vaecast.latent_files import LatentFile
from vaecast.pipeline.run import TimedAudio
from vaecast.push_ledger import PushLedger
from vaecast.server.intake.push import PushSession, PushSessions
from vaecast.server.stream.job import Job, JobStatus


class BatchPushSession:
    """B push sessions fed from one stream of batched blocks; see the module docstring."""

    def __init__(self, sessions: Sequence[PushSession], max_held_bytes: int) -> None:
        assert len(sessions) > 1
        self.sessions = list(sessions)
        self.max_held_bytes = max_held_bytes  # by the videos that wait for a slot
        self.token = sessions[0].token
        self.job = sessions[0].job  # its push URL is the batch's
        self.ledger = PushLedger()
        self._pushing = asyncio.Lock()
        self._in_flight: set[asyncio.Future[dict[str, Any]]] = set()

    @property
    def batch(self) -> int:
        return len(self.sessions)

    def authorize(self, presented: str | None) -> None:
        self.sessions[0].authorize(presented)

    def replayed(self, seq: int | None) -> bool:
        return self.ledger.replay(seq) is not None

    def check_open(self) -> None:
        if not self._open():
            ids = ", ".join(session.job.id for session in self.sessions)
            raise JobStateError(f"every video of this batch ({ids}) has ended")

    def _open(self) -> list[PushSession]:
        return [s for s in self.sessions if not (s.feed.ended or s.job.record.is_final)]

    async def push(
        self, data: bytes, final: bool, params: dict[str, str], seq: int | None = None
    ) -> dict[str, Any]:
        """As `PushSession.push`, for the whole batch."""
        task = asyncio.ensure_future(self._push(data, final, params, seq))
        self._in_flight.add(task)
        task.add_done_callback(self._forget)
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Future[dict[str, Any]]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled():
            task.exception()

    async def _push(
        self, data: bytes, final: bool, params: dict[str, str], seq: int | None
    ) -> dict[str, Any]:
        async with self._pushing:
            answer = self.ledger.replay(seq)
            if answer is not None:
                return answer
            self.check_open()
            if data:
                entries = await asyncio.to_thread(self._split, data, params)
                final = final or any(entry[2] for entry in entries)
                waiting = {s for s in self._open() if s.job.record.status is JobStatus.QUEUED}
                self._check_held(waiting, entries)
                for session, (latents, audio, _) in zip(self.sessions, entries, strict=True):
                    if session in self._open():  # one the user cancelled is skipped
                        await session.take(latents, audio, wait_for_room=session not in waiting)
            elif not final:
                raise InvalidRequestError("the block is empty; send latents, or ?final=1 to end")
            frames = [session.feed.latent_frames for session in self.sessions]
            answer = self.ledger.taken(seq, {"latent_frames": max(frames)})
            if final:
                for session in self._open():
                    await session.end()
            return answer

    def _check_held(
        self,
        waiting: set[PushSession],
        entries: Sequence[tuple[torch.Tensor, TimedAudio | None, bool]],
    ) -> None:
        """Refuse the block (before any video takes it) if the videos that wait for a
        decode slot would hold more than the budget with it."""
        if not waiting:
            return
        held = sum(getattr(s.feed, "held_bytes", 0) for s in waiting)
        adding = sum(
            latents.element_size() * latents.nelement()
            for session, (latents, _, _) in zip(self.sessions, entries, strict=True)
            if session in waiting
        )
        if held + adding > self.max_held_bytes:
            ids = ", ".join(sorted(s.job.id for s in waiting))
            raise PayloadTooLargeError(
                f"{len(waiting)} video(s) of this batch ({ids}) wait for a decode slot and "
                f"would hold {held + adding} bytes of blocks, past {self.max_held_bytes}: "
                f"run the server with --decode-slots {self.batch} to decode the batch at once"
            )

    def _split(
        self, data: bytes, params: dict[str, str]
    ) -> list[tuple[torch.Tensor, TimedAudio | None, bool]]:
        """Runs in a thread: the block read once, then each video's entry checked by its
        own session."""
        first = self._open()[0]
        latent_file = first.read(data, params, batch=self.batch)
        batch = int(latent_file.latents.shape[0])
        if batch != self.batch:
            raise InvalidRequestError(
                f"this session is a batch of {self.batch} videos; the block holds {batch}"
            )
        audio = latent_file.audio
        if audio is not None and audio.ndim == 3 and audio.shape[0] != batch:
            raise InvalidRequestError(
                f"audio of shape {tuple(audio.shape)} is for {audio.shape[0]} videos; the "
                f"block holds {batch}: send (B, channels, samples) or one (channels, samples)"
            )
        entries = []
        for index, session in enumerate(self.sessions):
            own_audio = audio[index] if audio is not None and audio.ndim == 3 else audio
            entry = LatentFile(
                latent_file.latents[index : index + 1],
                latent_file.metadata,
                own_audio,
                latent_file.dtype,
            )
            entries.append(session.accept(entry, params))
        return entries

    async def close(self) -> None:
        for task in self._in_flight:
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        await asyncio.gather(*(session.close() for session in self.sessions))


def open_batch(sessions: PushSessions, jobs: Sequence[Job]) -> BatchPushSession:
    """The batch session of `jobs` (B push jobs), taking the pushes to any of them."""
    entries = [sessions.open(job) for job in jobs]
    batch = BatchPushSession(entries, sessions.config.limits.max_upload_bytes)
    for entry in entries[1:]:
        entry.token = batch.token  # one secret for the batch
    sessions.add(batch, [job.id for job in jobs])
    return batch
