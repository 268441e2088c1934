"""What `run_pipeline` is given and what it reports: the pipeline's interfaces.

`vaecast.pipeline.run` runs one video; these are the parts its callers inject and the
values it hands back, apart so that a caller (the server, `vaecast decode`, the
benchmarks) can build them without the pipeline's machinery: the latent sources
(`WholeLatents`, and the `LiveSource` protocol of push sessions with the audio that
comes with their blocks), the sink, the replaceable stages and the thread pools, the
output's format, and the per-fragment report (`FragmentDone`) its observer gets.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.quantize import quantize_yuv420_to_host
from vaecast.codecs.stream import Soundtrack, VideoStreamEncoder
from vaecast.models.base import ChunkCallback, ChunkedDecoder
from vaecast.pipeline.bridge import ToHost
from vaecast.pipeline.thread_priority import lowered_pool

# What builds the encoder: VideoStreamEncoder's signature.
EncoderFactory = Callable[..., VideoStreamEncoder]


class Sink(Protocol):
    """Where the fragments go, in order: the init segment first, then one per chunk."""

    async def append(self, segment: bytes) -> None: ...


class LatentSource(Protocol):
    """Runs `decoder` over its latents on the decode thread; may block for latents."""

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None: ...

    def cancel(self) -> None:
        """Callable from any thread: a decode waiting for latents stops."""

    def take_audio(self) -> list[TimedAudio]:
        """Audio that arrived with the latents since the last call."""


@dataclass(frozen=True, slots=True)
class WholeLatents:
    """A latent tensor that exists in full before the decode starts (BCTHW)."""

    latents: torch.Tensor

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        decoder.decode_chunks(self.latents.to(decoder.device), on_chunk)

    def cancel(self) -> None:
        pass  # never waits: the bridge's cancel stops it

    def take_audio(self) -> list[TimedAudio]:
        return []  # a whole video's soundtrack is given to the encoder up front


@dataclass(frozen=True, slots=True)
class TimedAudio:
    """Audio that came with a latent block: (channels, n) float32 from the block's
    first video frame on. A block brings no audio for frames before its own (the
    pipeline gives up a gap, as silence, once a later block is in)."""

    samples: np.ndarray
    first_frame: int


@dataclass(frozen=True, slots=True)
class FeedState:
    """Where a live source's blocks stand, for the audio of the fragments."""

    latent_frames: int  # in the blocks put so far, whose audio is all in `take_audio`
    ended: bool  # the last block is in
    held_back: bool  # a block waits for room in the queue: its producer is held back
    stopped: bool  # cancelled or failed: the decode is ending
    version: int  # changes whenever any of the above does


@runtime_checkable
class LiveSource(LatentSource, Protocol):
    """A latent source whose blocks, and the audio with them, arrive over time (a push
    session): with audio, each fragment waits for its audio (`vaecast.pipeline.live_audio`)."""

    def feed_state(self) -> FeedState:
        """Now; on the event loop."""

    async def feed_changed(self, version: int) -> None:
        """Return once `feed_state().version` is no longer `version`."""


@dataclass(frozen=True, slots=True)
class Stages:
    """The two replaceable steps: how a chunk reaches the host, and what encodes it."""

    to_host: ToHost = quantize_yuv420_to_host
    encoder_factory: EncoderFactory = VideoStreamEncoder


@dataclass(frozen=True, slots=True)
class Workers:
    """Threads for the decode and the encode. Each encoder is used by one thread at a
    time, whatever the pool sizes: the pipeline never runs two of its calls at once.

    `encode` opens each video's encoder and encodes its first chunk (the first
    fragment is what a viewer waits for). `encode_rest`, when given, encodes the
    chunks after it while the encoder keeps up (no chunk waiting behind the one taken):
    a pool at a lower priority (nice 10, `vaecast.pipeline.thread_priority`), so that on cores
    the decode fills the encoder takes mostly the time the decode leaves idle. A chunk
    taken with another waiting goes to `encode`: the encoder is behind, and at a
    tenth of a core's share the stream would fall further behind.
    """

    decode: Executor
    encode: Executor
    encode_rest: Executor | None = None

    @classmethod
    def for_slots(cls, slots: int) -> Workers:
        """A thread of each kind per decode slot. The rest of each video's chunks are
        encoded at a lower priority only when the process decodes one video at a time:
        then the decode beside an encoder is its own, which waits (the bounded queue)
        when its encoder falls behind; with more slots another video's decode would
        hold this one's encoder to a fraction of its share, and nothing would wait."""
        return cls(
            decode=ThreadPoolExecutor(slots, thread_name_prefix="vaecast-decode"),
            encode=ThreadPoolExecutor(slots, thread_name_prefix="vaecast-encode"),
            encode_rest=lowered_pool(slots, "vaecast-encode-low") if slots == 1 else None,
        )

    def shutdown(self) -> None:
        """Wait for every pool's work, then stop its threads."""
        for pool in (self.decode, self.encode, self.encode_rest):
            if pool is not None:
                pool.shutdown()

    def after_first(self) -> Executor:
        """Where the chunks after a video's first are encoded while the encoder keeps up."""
        return self.encode if self.encode_rest is None else self.encode_rest


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """The audio a stream will carry, before any of it exists."""

    sample_rate: int
    channels: int


@dataclass(frozen=True, slots=True)
class VideoOutput:
    """What the encoder makes of the decoded frames: a whole soundtrack up front, or
    (a push session) the format of audio that arrives with the latents."""

    fps: Fraction
    settings: EncoderSettings = EncoderSettings()  # noqa: RUF009 (frozen, immutable)
    soundtrack: Soundtrack | None = None
    audio_format: AudioFormat | None = None


@dataclass(frozen=True, slots=True)
class FragmentDone:
    """One chunk's fragment is in the sink."""

    index: int
    total: int | None  # None while a stream's length is unknown
    frame_start: int
    frames: int
    bytes: int
    encode_s: float
    decode_wait_s: float  # how long the encoder side waited for this chunk
    audio_wait_s: float = 0.0  # how long it then waited for the audio that ends it


class PipelineObserver(Protocol):
    def started(self, content_type: str) -> None:
        """The encoder is open; its init segment is about to be appended."""

    def fragment(self, done: FragmentDone) -> None:
        """A chunk's fragment was appended to the sink."""
