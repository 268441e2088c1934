"""`taehv`: the TAEHV tiny video decoder, a fast causal preview decoder for Wan 2.1 latents.

Architecture: TAEHV ("Tiny AutoEncoder for Hunyuan Video") by Ollin Boer Bohan
(madebyollin/taehv, MIT license), written here in our own code. Module layout and
parameter names follow the published `taehv.py` (`decoder.<index>...` in an
`nn.Sequential`) so that the published weights (`taew2_1.safetensors`, `taew2_1.pth`,
and the other TAEHV files) load as they are. No weights ship with vaecast.

The decoder runs 2-D convs frame by frame. Its only memory is in `MemBlock`s: each
sees its own input one step earlier (zeros at the start), so it is causal. `TGrow`
blocks multiply the frame rate by expanding channels into sub-frames (x2 twice, 4
frames per latent), and the first 3 frames of a clip are dropped, so T latents give
1 + 4(T-1) frames: Wan's convention. Latents are taken as diffusion models emit them
(normalized); output is RGB in [0, 1].

This is the reference's *sequential* path: every conv sees one frame (batch 1), and
every latent frame comes in as its own contiguous tensor, so a decode is
bit-identical whatever the chunking and however a stream splits its latents. The
reference's parallel path batches frames, which picks other conv kernels and
differs by rounding (MODEL_CARD.md, "Reference parity").

`TAEHVDecoder.from_weights` loads a published file and reads the decoder's shape off
it; `TAEHVDecoder(net)` wraps a network built some other way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vaecast.models.base import (
    DecodePlan,
    StreamPlan,
    causal_plan,
    causal_stream_plan,
)
from vaecast.models.streaming import CausalStream, StreamingDecoder
from vaecast.models.weights_io import WeightsError, load_strict, read_state_dict

TEMPORAL_SCALE = 4
SPATIAL_UPSAMPLES = 3
IMAGE_CHANNELS = 3
# taew2_1's feature widths per stage (1/8, 1/4, 1/2 resolution, then full).
TAEW2_1_WIDTHS = (256, 128, 64, 64)
# Per stage: the temporal stride of its TGrow (stage 0 keeps the frame rate).
TGROW_STRIDES = (1, 2, 2)
# The encoder half of a published file: not needed to decode.
ENCODER_PREFIX = "encoder."


@dataclass(frozen=True, slots=True)
class TAEHVConfig:
    """The decoder's shape: latent channels, four stage widths, output pixel-shuffle patch."""

    latent_channels: int = 16
    widths: tuple[int, int, int, int] = TAEW2_1_WIDTHS
    patch_size: int = 1

    @property
    def spatial_scale(self) -> int:
        return 2**SPATIAL_UPSAMPLES * self.patch_size

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], source: str) -> TAEHVConfig:
        """Read the shape off a TAEHV file (taew2_1: 16 channels; taew2_2: 48, patch 2; ...)."""
        needed = ("decoder.1.weight", "decoder.8.weight", "decoder.14.weight", "decoder.20.weight")
        needed += ("decoder.22.weight",)
        absent = [key for key in needed if key not in state]
        if absent:
            raise WeightsError(
                f"{source} is not a TAEHV decoder: missing keys: {', '.join(absent)}"
            )
        first = state["decoder.1.weight"]
        out_channels = int(state["decoder.22.weight"].shape[0])
        patch = math.isqrt(out_channels // IMAGE_CHANNELS)
        if IMAGE_CHANNELS * patch * patch != out_channels:
            raise WeightsError(
                f"{source}: decoder.22.weight has {out_channels} output channels, "
                f"not 3 x a square patch"
            )
        widths = (
            int(first.shape[0]),
            int(state["decoder.8.weight"].shape[0]),
            int(state["decoder.14.weight"].shape[0]),
            int(state["decoder.20.weight"].shape[0]),
        )
        return cls(latent_channels=int(first.shape[1]), widths=widths, patch_size=patch)


def _conv(cin: int, cout: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, padding=1, bias=bias)


class Clamp(nn.Module):
    """Soft clamp of the latents to (-3, 3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """Residual block over (this frame's input, the previous frame's input to this block)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            _conv(2 * width, width),
            nn.ReLU(),
            _conv(width, width),
            nn.ReLU(),
            _conv(width, width),
        )
        # Published files have no skip weights when widths match: an identity.
        self.skip = nn.Identity()

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class TGrow(nn.Module):
    """One frame (1, C, H, W) -> `stride` sub-frames (stride, C, H, W) in time order."""

    def __init__(self, width: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(width, width * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, channels, height, width = x.shape
        return self.conv(x).reshape(-1, channels, height, width)


class Upsample(nn.Module):
    """Nearest-neighbour 2x in space (parameter-free; `nn.Upsample` in the reference)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2, mode="nearest")


class TAEHVNet(nn.Module):
    """The TAEHV decoder as an `nn.Sequential` under `decoder.`, indices as published."""

    def __init__(self, config: TAEHVConfig) -> None:
        super().__init__()
        w = config.widths
        layers: list[nn.Module] = [Clamp(), _conv(config.latent_channels, w[0]), nn.ReLU()]
        for stage, stride in enumerate(TGROW_STRIDES):
            layers += [MemBlock(w[stage]) for _ in range(3)]
            layers += [Upsample(), TGrow(w[stage], stride), _conv(w[stage], w[stage + 1], False)]
        layers += [nn.ReLU(), _conv(w[3], IMAGE_CHANNELS * config.patch_size**2)]
        self.decoder = nn.Sequential(*layers)
        self.config = config

    def step(self, latent: torch.Tensor, memory: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Decode one latent frame (1, C, h, w) into its 4 raw frames, each (1, 3, H, W).

        `memory[i]` is the last input of MemBlock i (None before the first frame);
        it is updated in place. Every call below sees one frame, as in the reference's
        sequential path, so results do not depend on how a video is chunked.
        """
        frames = [latent]
        for index, block in enumerate(self.decoder):
            if isinstance(block, MemBlock):
                outputs = []
                for x in frames:
                    past = memory[index]
                    outputs.append(block(x, torch.zeros_like(x) if past is None else past))
                    memory[index] = x
                frames = outputs
            elif isinstance(block, TGrow):
                frames = [sub.unsqueeze(0) for x in frames for sub in block(x)]
            else:
                frames = [block(x) for x in frames]
        patch_size = self.config.patch_size
        if patch_size > 1:
            frames = [F.pixel_shuffle(x, patch_size) for x in frames]
        return [x.clamp(0.0, 1.0) for x in frames]


class TAEHVDecoder(StreamingDecoder):
    """TAEHV under the chunk contract: a chunk per `latents_per_chunk` latent frames.

    With the default of 1: 1 frame for latent 0, then 4 per latent. A decode keeps its
    state in its own `LatentStream`, so decodes may share one instance.
    """

    name = "taehv"
    latent_space = None  # its weights' (taew2_1: Wan 2.1's); vaecast.models.latent_space
    value_range = (0.0, 1.0)

    def __init__(
        self, net: TAEHVNet, device: str | torch.device = "cpu", latents_per_chunk: int = 1
    ) -> None:
        if latents_per_chunk < 1:
            raise ValueError(f"latents_per_chunk must be at least 1, got {latents_per_chunk}")
        self.device = torch.device(device)
        self.config = net.config
        self.latent_channels = net.config.latent_channels
        self.latents_per_chunk = latents_per_chunk
        self._net = net.to(self.device, torch.float32).eval().requires_grad_(False)

    @classmethod
    def from_weights(
        cls,
        weights: str | Path | None,
        device: str | torch.device = "cpu",
        latents_per_chunk: int = 1,
    ) -> TAEHVDecoder:
        """Load a published TAEHV file (safetensors or weights-only `.pth`); its shape
        is read off the file, and its encoder half ignored."""
        if weights is None:
            raise WeightsError(
                "the taehv decoder needs a weights file and none ships with vaecast: download "
                "taew2_1.safetensors (or .pth) from madebyollin/taehv and pass --weights PATH"
            )
        state = read_state_dict(weights)
        net = TAEHVNet(TAEHVConfig.from_state_dict(state, str(weights)))
        load_strict(net, state, str(weights), ignore_prefixes=(ENCODER_PREFIX,))
        return cls(net, device, latents_per_chunk)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return causal_plan(
            latent_shape,
            self.latent_channels,
            self.config.spatial_scale,
            TEMPORAL_SCALE,
            self.latents_per_chunk,
        )

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return causal_stream_plan(
            first_block_shape,
            self.latent_channels,
            self.config.spatial_scale,
            TEMPORAL_SCALE,
            self.latents_per_chunk,
        )

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None = None
    ) -> _TAEHVStream:
        return _TAEHVStream(self._net, self.device, self.latents_per_chunk)


class _TAEHVStream(CausalStream):
    """Its state: each MemBlock's last input (`TAEHVNet.step`'s memory)."""

    def __init__(self, net: TAEHVNet, device: torch.device, latents_per_chunk: int) -> None:
        super().__init__(device, torch.float32, latents_per_chunk)
        self._net = net
        self._memory: list[torch.Tensor | None] = [None] * len(net.decoder)

    def step(self, latent: torch.Tensor, index: int) -> torch.Tensor:
        raw = self._net.step(latent[:, :, 0], self._memory)
        # Latent 0 stands for frame 0 alone: its first 3 raw frames are the decoder's
        # start-up and are dropped, as the reference trims them.
        return torch.stack(raw[TEMPORAL_SCALE - 1 :] if index == 0 else raw, 2)

    def close(self) -> None:
        super().close()
        self._memory = []
