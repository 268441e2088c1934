"""`tiny`: the embedded default model, a small causal video autoencoder.

An encoder and a decoder with Wan 2.1's latent geometry (16 latent channels, 8x
spatial and 4x temporal compression; T latents <-> 1 + 4(T-1) frames), fitted on
procedural and real video by `tools/fit_tiny.py`, so that `vaecast serve` streams a real
neural decode of real latents with nothing to download. Its latents are its own:
they are not Wan 2.1 latents, and a Wan pipeline's output does not decode with it
(use `wan2.1`). It is a demo and test model, not a production VAE.

TAEHV-style and causal: the decoder's only state is, for each memory block, that
block's input one step earlier, so latent t decodes to frames that do not depend on
latents after t, and streaming decode is the reference decode. The shipped weights,
`weights/tiny.safetensors` (fp16 on disk, fp32 in memory; keys `enc.*` and `dec.*`),
are described in MODEL_CARD.md: architecture, training data, how they were fitted
and how well they reconstruct.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from vaecast.errors import InvalidRequestError
from vaecast.models.base import (
    DecodePlan,
    StreamPlan,
    causal_plan,
    causal_stream_plan,
    check_video_geometry,
)
from vaecast.models.streaming import StreamingDecoder
from vaecast.models.tiny_nets import (
    ENCODER_WIDTH_QUARTER,
    ENCODER_WIDTH_STEP,
    ENCODER_WIDTH_SUB,
    LATENT_CHANNELS,
    PATCH_CHANNELS,
    SPATIAL_SCALE,
    TEMPORAL_SCALE,
    VALUE_RANGE,
    WEIGHTS_FILE,
    WIDTH_QUARTER,
    WIDTH_STEP,
    WIDTH_SUB,
    MemBlock,
    StepHead,
    TinyDecoderNet,
    TinyEncoderNet,
    decoder_patch_order,
    decoder_widths,
    default_weights,
    encoder_widths,
    load_nets,
    nets_from_state,
)
from vaecast.models.tiny_stream import TAIL_PARTS, TinyStream

__all__ = [
    "ENCODER_WIDTH_QUARTER",
    "ENCODER_WIDTH_STEP",
    "ENCODER_WIDTH_SUB",
    "LATENT_CHANNELS",
    "PATCH_CHANNELS",
    "SPATIAL_SCALE",
    "TAIL_PARTS",
    "TEMPORAL_SCALE",
    "VALUE_RANGE",
    "WEIGHTS_FILE",
    "WIDTH_QUARTER",
    "WIDTH_STEP",
    "WIDTH_SUB",
    "MemBlock",
    "StepHead",
    "TinyDecoder",
    "TinyDecoderNet",
    "TinyEncodeStream",
    "TinyEncoder",
    "TinyEncoderNet",
    "TinyStream",
    "check_video_shape",
    "decoder_patch_order",
    "decoder_widths",
    "default_weights",
    "encode_video",
    "encoder_widths",
    "load_nets",
    "nets_from_state",
    "video_to_groups",
]


def video_to_groups(video: torch.Tensor) -> torch.Tensor:
    """(N, 3, 1 + 4(T-1), H, W) -> (N, T, 4, 3, H, W); frame 0 fills the first group alone."""
    first = video[:, :, :1].expand(-1, -1, TEMPORAL_SCALE - 1, -1, -1)
    padded = torch.cat([first, video], dim=2)
    return padded.unflatten(2, (-1, TEMPORAL_SCALE)).permute(0, 2, 3, 1, 4, 5)


def check_video_shape(shape: Sequence[int]) -> tuple[int, int, int, int, int]:
    """Validate a BCTHW video shape the encoder takes; returns it as a tuple."""
    if len(shape) != 5:
        raise InvalidRequestError(f"video must be BCTHW (5 dimensions), got {len(shape)}")
    n, c, t, h, w = (int(d) for d in shape)
    if n < 1 or c != 3:
        raise InvalidRequestError(f"video must hold RGB frames (3 channels), got {c}")
    check_video_geometry(t, w, h, SPATIAL_SCALE, TEMPORAL_SCALE)
    return n, c, t, h, w


class TinyEncoder:
    """Encodes BCTHW video in [0, 1] into `tiny` latents (BCTHW, 16 channels)."""

    def __init__(
        self, device: str | torch.device = "cpu", weights: str | Path | None = None
    ) -> None:
        self.device = torch.device(device)
        self._net, _ = _cached_nets(None if weights is None else str(weights), str(self.device))

    def encode(self, video: torch.Tensor, steps_per_pass: int = 4) -> torch.Tensor:
        """Latents for a (N, 3, 1 + 4(T-1), H, W) video: (N, 16, T, H/8, W/8)."""
        check_video_shape(video.shape)
        groups = video_to_groups(video.to(self.device, torch.float32))
        latents, past = [], None
        with torch.inference_mode():
            for start in range(0, groups.shape[1], steps_per_pass):
                z, past = self._net(groups[:, start : start + steps_per_pass], past)
                latents.append(z)
        return torch.cat(latents, dim=1).transpose(1, 2).contiguous()

    def open_stream(self, steps_per_pass: int = 4) -> TinyEncodeStream:
        """An incremental encode of one video: give `encode_block` its frames in order."""
        return TinyEncodeStream(self._net, self.device, steps_per_pass)

    def encode_stream(
        self, blocks: Iterable[torch.Tensor], steps_per_pass: int = 4
    ) -> Iterator[torch.Tensor]:
        """Latent blocks, each as soon as its frames arrive (1 + 4k frames, then 4k each)."""
        stream = self.open_stream(steps_per_pass)
        for block in blocks:
            yield stream.encode_block(block)


class TinyEncodeStream:
    """One video encoded a block of frames at a time, carrying the encoder's causal state.

    The state is what `TinyEncoder.encode` carries between its passes: the last step's
    input to the memory block. Each block's steps run in passes aligned, from the start
    of the video, to multiples of `steps_per_pass`, as `encode`'s are; so blocks of a
    multiple of `steps_per_pass` latent frames give `encode`'s latents bit for bit.
    Other blocks batch fewer steps per pass, and oneDNN may block a convolution
    differently for another batch size: the same sums, rounded differently (measured on
    a 2-core AVX-512 CPU: at most 2.4e-7 on latents up to ~14 at 64x48 and 64x96; none
    at 832x480, 81 frames, blocks of 1-5 latent frames).
    """

    def __init__(self, net: TinyEncoderNet, device: torch.device, steps_per_pass: int) -> None:
        if steps_per_pass < 1:
            raise ValueError(f"steps_per_pass must be at least 1, got {steps_per_pass}")
        self._net, self.device, self._per_pass = net, device, steps_per_pass
        self._past: torch.Tensor | None = None
        self._geometry: tuple[int, int, int] | None = None  # N, H, W of the first block
        self.latent_frames = 0  # encoded so far

    def encode_block(self, frames: torch.Tensor) -> torch.Tensor:
        """Latents (N, 16, k, H/8, W/8) for the video's next frames (N, 3, t, H, W).

        The first block starts at frame 0: t = 1 + 4(k-1), frame 0 alone making latent
        frame 0. Every later block continues the video with t = 4k frames.
        """
        if self._geometry is None:
            n, _, _, h, w = check_video_shape(frames.shape)
            groups = video_to_groups(frames.to(self.device, torch.float32))
            self._geometry = (n, h, w)
        else:
            shape = tuple(frames.shape)
            n, h, w = self._geometry
            if len(shape) != 5 or (shape[0], shape[1], *shape[3:]) != (n, 3, h, w):
                raise InvalidRequestError(
                    f"a later block must be ({n}, 3, 4k, {h}, {w}) like the first, got {shape}"
                )
            if shape[2] < 1 or shape[2] % TEMPORAL_SCALE:
                raise InvalidRequestError(
                    f"a later block must hold {TEMPORAL_SCALE}k frames, got {shape[2]}"
                )
            frames = frames.to(self.device, torch.float32)
            groups = frames.unflatten(2, (-1, TEMPORAL_SCALE)).permute(0, 2, 3, 1, 4, 5)
        latents = []
        with torch.inference_mode():
            start = 0
            while start < groups.shape[1]:
                step = self.latent_frames + start
                stop = min(groups.shape[1], start + self._per_pass - step % self._per_pass)
                z, self._past = self._net(groups[:, start:stop], self._past)
                latents.append(z)
                start = stop
        self.latent_frames += groups.shape[1]
        return torch.cat(latents, dim=1).transpose(1, 2).contiguous()


def encode_video(
    video: torch.Tensor, device: str | torch.device = "cpu", weights: str | Path | None = None
) -> torch.Tensor:
    """Encode BCTHW video in [0, 1] (1 + 4k frames, sides multiples of 8) into latents."""
    return TinyEncoder(device, weights).encode(video)


@functools.lru_cache(maxsize=8)
def _cached_nets(weights: str | None, device: str) -> tuple[TinyEncoderNet, TinyDecoderNet]:
    return load_nets(weights, device)


class TinyDecoder(StreamingDecoder):
    """The `tiny` decoder under the chunk contract: 1 frame for latent 0, then 4 per latent.

    `weights` None is the shipped file; loaded networks are shared by every decoder
    and encoder of the same file and device.
    """

    name = "tiny"
    latent_channels = LATENT_CHANNELS
    value_range = VALUE_RANGE

    def __init__(
        self, device: str | torch.device = "cpu", weights: str | Path | None = None
    ) -> None:
        self.device = torch.device(device)
        _, self._net = _cached_nets(None if weights is None else str(weights), str(self.device))

    @classmethod
    def from_weights(
        cls, weights: str | Path | None, device: str | torch.device = "cpu"
    ) -> TinyDecoder:
        """`--weights` for `tiny`: another fit of this architecture (None: the shipped one)."""
        return cls(device, weights)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return causal_plan(latent_shape, self.latent_channels, SPATIAL_SCALE, TEMPORAL_SCALE)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return causal_stream_plan(
            first_block_shape, self.latent_channels, SPATIAL_SCALE, TEMPORAL_SCALE
        )

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None = None
    ) -> TinyStream:
        return TinyStream(self._net, self.device)
