"""The demo as a live producer: a scene's latents a block at a time, as a generator makes them.

A push session takes latent blocks while they are produced, so the first frame can show
about as soon as a generator's first block exists. Here the demo plays that generator:
each block renders only the video frames it stands for (`scenes.scene_reel`, in order)
and encodes them with `tiny`'s encoder run incrementally (`TinyEncodeStream`, which
carries the encoder's causal state from block to block). The first block costs one
frame's render and encode, not the whole clip's.

The blocks concatenate to `scene_latents(spec)`: bit for bit whenever the block size is
a multiple of 4 latent frames (the whole-clip encode's pass), and otherwise up to
float32 rounding where oneDNN picks another convolution blocking for the smaller batch
(see `TinyEncodeStream`; at 832x480 it measured bit for bit at every block size).
`sources.scene_audio_span` gives each block's soundtrack, with `latent_block_frames`
naming its video frames.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from vaecast.demo.scenes import scene_reel
from vaecast.demo.sources import TEMPORAL_STEP, SceneSpec, check_video_geometry
from vaecast.models.tiny import TinyEncoder


def latent_block_frames(first_latent: int, latent_count: int) -> tuple[int, int]:
    """The video frames (first, count) that latent frames first_latent.. stand for.

    Latent frame 0 is video frame 0 alone; latent frame k >= 1 is frames 4k-3..4k.
    """
    if first_latent < 0 or latent_count < 1:
        raise ValueError(f"no video frames for {latent_count} latent frames from {first_latent}")
    first = 0 if first_latent == 0 else TEMPORAL_STEP * (first_latent - 1) + 1
    last = TEMPORAL_STEP * (first_latent + latent_count - 1)
    return first, last - first + 1


class LiveScene(Iterator[torch.Tensor]):
    """Iterates a scene's BCTHW latent blocks of `block_latent_frames` latent frames each
    (the last may be shorter), rendering and encoding each one when it is asked for.

    Blocking, like a generator's step: iterate it in a thread, not on an event loop.
    """

    def __init__(
        self, spec: SceneSpec, block_latent_frames: int = 1, device: str | torch.device = "cpu"
    ) -> None:
        if block_latent_frames < 1:
            raise ValueError(f"block_latent_frames must be at least 1, got {block_latent_frames}")
        # A SceneSpec built by hand was not checked, and the reel and the encoder must agree.
        check_video_geometry(spec.frames, spec.width, spec.height)
        self.spec = spec
        self.block_latent_frames = block_latent_frames
        self.latent_frames = 1 + (spec.frames - 1) // TEMPORAL_STEP  # in the whole clip
        self._reel = scene_reel(spec.scene, spec.frames, spec.height, spec.width, spec.seed)
        self._stream = TinyEncoder(device).open_stream()

    @property
    def frames_rendered(self) -> int:
        """Video frames drawn so far: only those of the blocks already produced."""
        return self._reel.next_frame

    @property
    def latents_produced(self) -> int:
        """Latent frames yielded so far."""
        return self._stream.latent_frames

    def __iter__(self) -> LiveScene:
        return self

    def __next__(self) -> torch.Tensor:
        done = self._stream.latent_frames
        if done >= self.latent_frames:
            raise StopIteration
        block = min(self.block_latent_frames, self.latent_frames - done)
        _, count = latent_block_frames(done, block)
        return self._stream.encode_block(self._reel.render(count))


def scene_latent_blocks(
    spec: SceneSpec, block_latent_frames: int = 1, device: str | torch.device = "cpu"
) -> LiveScene:
    """The scene's latents as blocks of `block_latent_frames` latent frames, each rendered
    and encoded when asked for; torch.cat(blocks, dim=2) is `scene_latents(spec)`."""
    return LiveScene(spec, block_latent_frames, device)
