"""Live audio in the pipeline: each fragment of a push session waits for the audio
that ends it with its video.

Apart from `vaecast.pipeline.run` because it is the one part of a video's path that waits
on the event loop for something other than the decoder: the rules for how long a
chunk is held for its audio, and the encode-thread steps that take the audio in.

Audio that arrives with the latents (a push session with audio; `LiveSource`). Each
fragment carries the audio of its own video span, as an upload's do: a fragment is
written once the audio that ends it within one AAC frame of its video's end is in,
and the last chunk's fragment carries the rest, fitted to end with the video, so no
fragment is audio-only. AAC hands a frame's packet out two frames after it (see
`codecs.live_audio`), so a chunk's fragment needs two to three AAC frames (43-64 ms
at 48 kHz, 128-192 ms at 16 kHz) of audio past its video's end: in practice the
next block's, which comes with the next block's latents. So the encoder, holding a chunk,
waits on the event loop (`LiveSource.feed_changed`; the decode thread goes on
meanwhile) until one of:
- a later block is in, and with it that audio (`live_audio_needed`), or the blocks
  that came reach past it: a block brings only audio from its own first frame on
  (`TimedAudio`), so there is no more to wait for, and the gaps before it are
  silence at once. Audio sent ahead does not spare the wait for the next block:
  only a later block (or the end) tells whether the chunk ends the video;
- the last block came (the session ended): then the chunk that ends the video is
  encoded as the last, with the rest of the audio;
- a block waits for room in the feed's queue: its producer is held back, and the
  decode may be waiting for this very encoder (the bounded chunk queue), so waiting
  on could only stall all three;
- the source stopped (cancelled, failed, timed out), or the task was cancelled;
- `audio_wait_s` passed: a producer slower than that, or one that waits for a
  fragment before it sends the next block, gets the fragment with the audio it has
  (ending up to three AAC frames short of the video; the next fragments catch up).
So the wait never blocks the loop or a thread, never outlives the session, and
holds nothing but what the feed's bounded queue already bounds: the audio of the
blocks put and not yet encoded, taken into the encoder (as AAC packets) as it
comes. What it costs: each fragment waits for the next block's arrival, so a
fragment's block-to-viewer latency (`latency_s`) grows by the producer's interval
between blocks, up to `audio_wait_s` (the live demo renders its next block as soon
as the queue has room, so its wait is a block's rendering). Sessions without audio,
and sources that are no `LiveSource`, never wait: each chunk is encoded the moment
it is decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.models.base import DecodePlan, StreamPlan
from vaecast.pipeline.bridge import HostChunk
from vaecast.pipeline.interfaces import LiveSource, TimedAudio

# The longest a chunk of a push session with audio waits for the audio that ends its
# fragment with its video (module docstring).
DEFAULT_AUDIO_WAIT_S = 5.0


async def encode_aligned(
    live: LiveSource,
    plan: DecodePlan | StreamPlan,
    encoder: VideoStreamEncoder,
    chunk: HostChunk,
    call: Callable[..., Awaitable[Any]],
    max_wait_s: float,
    keyframe: bool = False,
) -> tuple[bytes, bool, float, float]:
    """Encode `chunk` once the audio that ends its fragment with its video is in, or
    there is no more to wait for (module docstring); with a keyframe first where
    `keyframe`. Returns the fragment, whether it
    ended the video, how long the chunk waited for audio, and when its encode began.

    Once a later block (or the end) is in, each try takes in the audio that came (the
    encoder then holds it as AAC packets, not the feed as PCM) and encodes only if
    enough is in; between tries the wait is on the event loop, for the feed's next
    change, never past `max_wait_s` (0: no wait)."""
    loop = asyncio.get_running_loop()
    frame_end = chunk.frame_start + chunk.frame_count
    taken = time.perf_counter()
    deadline = loop.time() + max_wait_s
    while True:
        state = live.feed_state()
        if isinstance(plan, StreamPlan):
            video_in = plan.frames_for(state.latent_frames)  # of the blocks put
            more_follows = video_in > frame_end
        else:  # a push whose length was known before its decode began: ended
            video_in = plan.frames if state.ended else frame_end
            more_follows = frame_end < plan.frames
        last = state.ended and not more_follows
        settled = encoder.audio_sample_at(video_in)  # no more audio comes before this
        need = encoder.live_audio_needed(frame_end, more_follows)
        # Whether this chunk ends the video is known only once a later block, or the
        # end, is in: until then it waits, whatever audio came ahead.
        stop_waiting = state.ended or state.held_back or state.stopped or loop.time() >= deadline
        if stop_waiting or more_follows:
            encode_from = time.perf_counter()
            fragment = await call(
                _encode_live,
                chunk.pixels,
                live.take_audio(),
                settled,
                None if stop_waiting or settled >= need else need,
                True if last else (False if more_follows else None),
                keyframe,
            )
            if fragment is not None:
                return fragment, last, encode_from - taken, encode_from
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await live.feed_changed(state.version)


def _encode_live(
    encoder: VideoStreamEncoder,
    pixels: Any,
    audio: list[TimedAudio],
    settled: int,
    need: int | None,
    last: bool | None,
    keyframe: bool,
) -> bytes | None:
    """On the encode thread: take in the audio that came and settle the gaps before
    `settled`; then the chunk's fragment, or None while fewer than `need` samples are
    in (the audio stays in the encoder for the next try)."""
    append_audio(encoder, audio)
    encoder.settle_audio(settled)
    if need is not None and encoder.audio_received < need:
        return None
    if keyframe:  # (asked only then: an injected encoder need not know the option)
        return encoder.encode_chunk(pixels, last=last, keyframe=True)
    return encoder.encode_chunk(pixels, last=last)


def append_audio(encoder: VideoStreamEncoder, audio: list[TimedAudio]) -> None:
    for piece in audio:
        encoder.append_audio(piece.samples, at_sample=encoder.audio_sample_at(piece.first_frame))
