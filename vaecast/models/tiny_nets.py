"""`tiny`'s networks and their weights: the encoder and decoder `nn.Module`s, and
building them from a weights file.

Apart from `tiny` (the decoder and encoder a caller uses) so that the architecture,
which `tools/fit_tiny.py` trains, reads on its own: its geometry constants, the
causal memory block, `TinyDecoderNet` (split into the once-per-step `head` and the
per-sub-frame `tail` that `tiny_stream` draws on pool threads), `TinyEncoderNet`,
and the loading that reads the nets' widths from the file's tensor shapes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

LATENT_CHANNELS = 16
SPATIAL_SCALE = 8
TEMPORAL_SCALE = 4
# One latent vector stands for a 4-frame, 8x8-pixel RGB patch of 768 values.
PATCH_CHANNELS = TEMPORAL_SCALE * 3 * SPATIAL_SCALE * SPATIAL_SCALE
WEIGHTS_FILE = "tiny.safetensors"

# Feature widths (the defaults; a weights file's tensor shapes give its own): per
# latent step at 1/8 resolution, per sub-frame at 1/8, per sub-frame at 1/4. Nothing
# runs at full resolution except one depth-to-space copy.
WIDTH_STEP = 64
WIDTH_SUB = 32
WIDTH_QUARTER = 24
ENCODER_WIDTH_QUARTER = 24
ENCODER_WIDTH_SUB = 32
ENCODER_WIDTH_STEP = 64
# What the decoder's frames are in: `tail` clamps them to it under inference mode.
VALUE_RANGE = (0.0, 1.0)


def _conv(cin: int, cout: int, kernel: int = 3) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel, padding=kernel // 2)


class MemBlock(nn.Module):
    """A residual block that also sees its own input one step earlier (zeros at the start).

    This is TAEHV's causal memory: the decoder's only state is the previous step's
    input to each such block.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = _conv(2 * width, width)
        self.out = _conv(width, width)

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.mix(torch.cat([x, past], dim=1)))
        return F.relu(x + self.out(h))


def _previous(x: torch.Tensor, steps: int, first: torch.Tensor | None = None) -> torch.Tensor:
    """For (N * steps, ...) laid out step-major per clip, each step's predecessor.

    The first step's predecessor is `first` (N, ...) or zeros.
    """
    seq = x.unflatten(0, (-1, steps))
    head = torch.zeros_like(seq[:, :1]) if first is None else first.unsqueeze(1)
    past = torch.cat([head, seq[:, :-1]], dim=1).flatten(0, 1)
    return past.contiguous(memory_format=torch.channels_last)


class TinyDecoderNet(nn.Module):
    """Latents (16 x h x w per step) -> 4 RGB frames (8h x 8w) per step, causal in time.

    Per latent step: a 3x3 conv and two memory blocks at 1/8 resolution; a 1x1
    "temporal grow" conv splits the features into 4 sub-frames, which then run as
    one batch: a memory block whose past is the previous sub-frame, a 3x3 conv with
    2x depth-to-space to 1/4 resolution, one residual 3x3 conv, and a 3x3 conv to
    48 channels that a 4x4 depth-to-space turns into RGB. A linear path (a 1x1 conv
    from the latent straight to the 768 values of the 4x8x8 RGB patch) is added
    before that last depth-to-space; fitting starts it at the PCA reconstruction.
    """

    def __init__(
        self, step: int = WIDTH_STEP, sub: int = WIDTH_SUB, quarter: int = WIDTH_QUARTER
    ) -> None:
        super().__init__()
        self.widths = {"step": step, "sub": sub, "quarter": quarter}
        self.linear = nn.Conv2d(LATENT_CHANNELS, PATCH_CHANNELS, 1)
        self.inp = _conv(LATENT_CHANNELS, step)
        self.mem1 = MemBlock(step)
        self.mem2 = MemBlock(step)
        self.grow = nn.Conv2d(step, TEMPORAL_SCALE * sub, 1)
        self.mem3 = MemBlock(sub)
        self.up = _conv(sub, 4 * quarter)
        self.mid = _conv(quarter, quarter)
        self.out = _conv(quarter, 3 * 16)

    def forward(
        self, z: torch.Tensor, state: Sequence[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Decode S latent steps of N clips, (N, S, 16, h, w) -> (N, 3, 4S, 8h, 8w).

        Under inference mode the output is clamped to [0, 1] (and built in place);
        while training it is not, so the loss sees the error past the range.
        `state` is what the previous call returned (None at the start of a video);
        every step's 4 sub-frames come out, also the 3 that precede frame 0.
        """
        n, steps, _, h, w = z.shape
        head = self.head(z, state)
        base = head.base.reshape(n * steps * TEMPORAL_SCALE, 2 * h, 2 * w, 48)
        return self.tail(head.sub, head.sub_past, base, n), head.last

    def head(self, z: torch.Tensor, state: Sequence[torch.Tensor] | None = None) -> StepHead:
        """The part of a decode that runs once per latent step, (N, S, 16, h, w) in.

        Everything a sub-frame's `tail` needs comes out of it, and the next call's
        state: the steps chain through the head alone, so a step's sub-frames can be
        drawn while the next step's head runs.
        """
        n, steps, _, h, w = z.shape
        flat = z.flatten(0, 1).contiguous(memory_format=torch.channels_last)
        past = [None] * 3 if state is None else list(state)
        x = F.relu(self.inp(flat))
        y = self.mem1(x, _previous(x, steps, past[0]))
        y2 = self.mem2(y, _previous(y, steps, past[1]))
        # (N*S, 4*C, h, w) -> (N*S*4, C, h, w): the 4 sub-frames of a step run as one
        # batch; sub-frame j remembers sub-frame j-1, and j=0 the previous step's last.
        sub = F.relu(self.grow(y2)).unflatten(1, (TEMPORAL_SCALE, -1)).flatten(0, 1)
        sub = sub.contiguous(memory_format=torch.channels_last)
        sub_past = _previous(sub, steps * TEMPORAL_SCALE, past[2])
        # The linear path's depth-to-space, in the tail's (quarter-resolution) layout:
        # (N*S, sub-frame, y/8, y/4 % 2, x/8, x/4 % 2, (colour, y % 4, x % 4)).
        base = (
            self.linear(flat)
            .permute(0, 2, 3, 1)
            .reshape(n * steps, h, w, TEMPORAL_SCALE, 2, 2, 48)
            .permute(0, 3, 1, 4, 2, 5, 6)
        )
        last = [
            x.unflatten(0, (n, steps))[:, -1],
            y.unflatten(0, (n, steps))[:, -1],
            sub.unflatten(0, (n, -1))[:, -1],
        ]
        return StepHead(sub, sub_past, base, last)

    def tail(
        self,
        sub: torch.Tensor,
        sub_past: torch.Tensor,
        base: torch.Tensor,
        clips: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """K sub-frames of `clips` clips (K/clips each, in order) -> (clips, 3, K/clips, 8h, 8w).

        `sub`, `sub_past` (K, C, h, w) and `base` (K, 2h, 2w, 48) are a `StepHead`'s,
        whole or any run of one step's sub-frames (each is independent of the
        others given its past). Under inference mode the frames are written into
        `out` where given (a view of that shape), else a new tensor.
        """
        q = self.mem3(sub, sub_past)
        q = F.relu(F.pixel_shuffle(self.up(q), 2))
        q = F.relu(q + self.mid(q))
        rgb = self.out(q).permute(0, 2, 3, 1)
        rgb = rgb.add_(base) if torch.is_inference_mode_enabled() else rgb + base
        # Depth-to-space of the sum, (clip, frame, y/8, y/4 % 2, x/8, x/4 % 2, colour,
        # y % 4, x % 4) -> (clip, colour, frame, y, x).
        k, h2, w2, _ = rgb.shape
        frames, h, w = k // clips, h2 // 2, w2 // 2
        blocks = rgb.reshape(clips, frames, h, 2, w, 2, 3, 4, 4).permute(0, 6, 1, 2, 3, 7, 4, 5, 8)
        if not torch.is_inference_mode_enabled():
            return blocks.reshape(clips, 3, frames, 8 * h, 8 * w)
        if out is None:
            out = torch.empty(clips, 3, frames, 8 * h, 8 * w, device=rgb.device)
        torch.clamp(blocks, 0.0, 1.0, out=out.view(blocks.shape))
        return out


@dataclass(frozen=True, slots=True)
class StepHead:
    """What `TinyDecoderNet.head` computed for S steps of N clips."""

    sub: torch.Tensor  # (N*S*4, C, h, w): each sub-frame's features
    sub_past: torch.Tensor  # (N*S*4, C, h, w): each sub-frame's predecessor's
    base: torch.Tensor  # (N*S, 4, h, 2, w, 2, 48): the linear path, per sub-frame
    last: list[torch.Tensor]  # the state for the next call


class TinyEncoderNet(nn.Module):
    """4-frame groups (N, S, 4, 3, H, W) -> latents (N, S, 16, H/8, W/8), causal in time.

    Each frame goes through a 4x4 space-to-depth and two 3x3 convs at 1/4 resolution,
    a 2x2 space-to-depth and a 1x1 conv at 1/8; a step's 4 frames are stacked on
    channels, mixed by a 3x3 conv and a memory block over steps, and a 3x3 conv
    adds its residual to a linear path (a 1x1 conv of the 768-value patch) that
    fitting starts at the PCA projection.
    """

    def __init__(
        self,
        quarter: int = ENCODER_WIDTH_QUARTER,
        sub: int = ENCODER_WIDTH_SUB,
        step: int = ENCODER_WIDTH_STEP,
    ) -> None:
        super().__init__()
        self.widths = {"quarter": quarter, "sub": sub, "step": step}
        self.linear = nn.Conv2d(PATCH_CHANNELS, LATENT_CHANNELS, 1)
        self.inp = _conv(48, quarter)
        self.res = _conv(quarter, quarter)
        self.down = nn.Conv2d(4 * quarter, sub, 1)
        self.merge = _conv(TEMPORAL_SCALE * sub, step)
        self.mem = MemBlock(step)
        self.out = _conv(step, LATENT_CHANNELS)

    def forward(
        self, groups: torch.Tensor, past: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the latents and the state to pass as `past` for the steps that follow."""
        n, steps = groups.shape[:2]
        frames = groups.flatten(0, 2)
        q = F.pixel_unshuffle(frames, 4).contiguous(memory_format=torch.channels_last)
        q = F.relu(self.inp(q))
        q = F.relu(q + self.res(q))
        e = F.relu(self.down(F.pixel_unshuffle(q, 2)))
        e = e.unflatten(0, (n * steps, TEMPORAL_SCALE)).flatten(1, 2)
        e = F.relu(self.merge(e.contiguous(memory_format=torch.channels_last)))
        e2 = self.mem(e, _previous(e, steps, past))
        # Patch channel order: (sub-frame, colour, y % 8, x % 8).
        patches = F.pixel_unshuffle(groups.flatten(0, 1).flatten(1, 2), SPATIAL_SCALE)
        z = self.linear(patches) + self.out(e2)
        return z.unflatten(0, (n, steps)), e.unflatten(0, (n, steps))[:, -1]


def decoder_patch_order() -> torch.Tensor:
    """For each output channel of `TinyDecoderNet.linear`, its index in patch order.

    The decoder's linear path emits channels as (sub-frame, y/4 % 2, x/4 % 2,
    colour, y % 4, x % 4) to match its depth-to-space; the encoder and PCA use
    (sub-frame, colour, y % 8, x % 8).
    """
    r = torch.arange(PATCH_CHANNELS)
    sub, rest = r // 192, r % 192
    ay, ax, rest = rest // 96, (rest // 48) % 2, rest % 48
    colour, ey, ex = rest // 16, (rest // 4) % 4, rest % 4
    return sub * 192 + colour * 64 + (ay * 4 + ey) * 8 + (ax * 4 + ex)


def default_weights() -> Path:
    """The shipped weights file (package data)."""
    with resources.as_file(resources.files("vaecast.models") / "weights" / WEIGHTS_FILE) as path:
        return Path(path)


def decoder_widths(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """`TinyDecoderNet`'s widths from its state's tensor shapes (keys without `dec.`)."""
    return {
        "step": int(state["inp.weight"].shape[0]),
        "sub": int(state["grow.weight"].shape[0]) // TEMPORAL_SCALE,
        "quarter": int(state["up.weight"].shape[0]) // 4,
    }


def encoder_widths(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """`TinyEncoderNet`'s widths from its state's tensor shapes (keys without `enc.`)."""
    return {
        "quarter": int(state["inp.weight"].shape[0]),
        "sub": int(state["down.weight"].shape[0]),
        "step": int(state["merge.weight"].shape[0]),
    }


def nets_from_state(state: dict[str, torch.Tensor]) -> tuple[TinyEncoderNet, TinyDecoderNet]:
    """Encoder and decoder built at the widths a weights file's shapes say, then loaded.

    The widths live in the file, not in code, so a wider fit can never be loaded
    into nets of the wrong size (`load_state_dict` would refuse a mismatch anyway).
    """
    enc = {k[4:]: v for k, v in state.items() if k.startswith("enc.")}
    dec = {k[4:]: v for k, v in state.items() if k.startswith("dec.")}
    encoder = TinyEncoderNet(**encoder_widths(enc))
    decoder = TinyDecoderNet(**decoder_widths(dec))
    encoder.load_state_dict(enc)
    decoder.load_state_dict(dec)
    return encoder, decoder


_LOAD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def _load_state(path: str) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(path).items()}


def load_nets(
    weights: str | Path | None = None, device: str | torch.device = "cpu"
) -> tuple[TinyEncoderNet, TinyDecoderNet]:
    """The encoder and decoder with weights (fp16 on disk, fp32 here); file reads are cached."""
    path = str(Path(weights) if weights is not None else default_weights())
    with _LOAD_LOCK:
        state = _load_state(path)
    encoder, decoder = nets_from_state(state)
    nets = []
    for net in (encoder, decoder):
        net = net.to(device).eval().requires_grad_(False)
        nets.append(net.to(memory_format=torch.channels_last))
    return nets[0], nets[1]
