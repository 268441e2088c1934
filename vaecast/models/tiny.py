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

import contextlib
import functools
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from vaecast.codecs.colour import Yuv420Frames
from vaecast.codecs.quantize import yuv420_on_device
from vaecast.errors import InvalidRequestError
from vaecast.models.base import (
    DecodePlan,
    StreamPlan,
    causal_plan,
    causal_stream_plan,
    check_video_geometry,
)
from vaecast.models.op_threads import per_thread_control, thread_ops
from vaecast.models.streaming import CausalStream, Emit, StreamingDecoder

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
# A step's 4 sub-frames are drawn in this many parts at once on a CPU, one pool
# thread each (`_TinyStream`).
TAIL_PARTS = 2


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
    value_range = (0.0, 1.0)

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

    def open_stream(self, first_block_shape: tuple[int, ...]) -> _TinyStream:
        return _TinyStream(self._net, self.device)


class _TinyStream(CausalStream):
    """Its state: what `TinyDecoderNet.head` returned for the next step.

    On a CPU the decode is spread over threads whose operators run single-threaded
    (`op_threads`), instead of one thread whose operators each split over every
    core. This thread runs each step's head (the 1/8-resolution layers: what the
    next step needs), then hands the step's 4 sub-frames to `TAIL_PARTS` pool
    threads (2 each: ~2/3 of the work), which also make their YUV 4:2:0 (the
    server's host conversion, `DecodedChunk.yuv420`: on this thread it would be the
    busiest thread's work); while they draw, this thread runs the next step's head,
    then hands the frames drawn before on (`emit`). A head with the pool idle (the
    first after latent 0, or each step of a stream of one-latent blocks) keeps this
    thread's operator threads: it has the cores to itself. Measured on 2 cores
    (81 frames at 832x480, in-process, alternating rounds): decode + x264 beside it
    2.74 -> 2.12 s (8 rounds), the whole pipeline into a null sink 2.42 -> 2.01 s
    (10 rounds). An operator split over both cores waits at its end for its slowest
    thread, so every slice of a core that x264 took stalled the other core too;
    single-threaded operators on three threads just take turns with it.

    The frames are the same as `TinyDecoderNet.forward`'s one step at a time, bit for
    bit: each sub-frame is drawn by the same operators from the same inputs (latent
    0's frame, drawn as a batch of one sub-frame, may differ in the last bit where a
    kernel is chosen by batch size). The pipeline
    never holds frames back across blocks (a stream's next block may be long in
    coming): the last step of each block is drawn and emitted before `push`
    returns. Latent 0's frame is drawn at once on this thread's own operator
    threads: it is the first fragment's, and only its last sub-frame is drawn.
    """

    def __init__(self, net: TinyDecoderNet, device: torch.device) -> None:
        super().__init__(device, torch.float32)
        self._net = net
        self._state: list[torch.Tensor] | None = None
        threads = torch.get_num_threads()
        self._pipelined = device.type == "cpu" and threads >= 2 and per_thread_control()
        # Measured on 2 cores (one operator thread each); on more, the cores shared out.
        self._part_threads = max(1, round(threads / (TAIL_PARTS + 1)))
        self._pool: ThreadPoolExecutor | None = None
        self._drawing: _Drawing | None = None

    def step(self, latent: torch.Tensor, index: int) -> torch.Tensor:
        head = self._net.head(latent.transpose(1, 2), self._state)
        self._state = head.last
        # The first latent stands for frame 0 alone: its last sub-frame.
        return self._tail(head, TEMPORAL_SCALE - 1 if index == 0 else 0, TEMPORAL_SCALE)

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        if not self._pipelined:
            super().push(block, emit)
            return
        for latent in self._latents(block):
            if self._next == 0 and self._drawing is None:
                self._add(self.step(latent, 0), emit)
                continue
            # With no step being drawn (the pool idle: the first step after latent 0,
            # or every step of a stream whose blocks are one latent each) the head has
            # the cores to itself, so it keeps this thread's operator threads.
            pool_busy = self._drawing is not None
            with thread_ops(self._part_threads) if pool_busy else contextlib.nullcontext():
                drawing = self._start(latent)
            with thread_ops(self._part_threads):
                self._emit_drawn(emit)
            self._drawing = drawing
        with thread_ops(self._part_threads):
            self._emit_drawn(emit)

    def close(self) -> None:
        if self._pool is not None:
            # No pool thread may still be writing into frames once the decode is over.
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._drawing = None
        super().close()
        self._state = None

    def _tail(
        self, head: StepHead, start: int, stop: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sub-frames `start:stop` of a one-step head, into `out` if given."""
        quarter_h, quarter_w = 2 * head.base.shape[2], 2 * head.base.shape[4]
        base = head.base[0, start:stop].reshape(stop - start, quarter_h, quarter_w, -1)
        return self._net.tail(head.sub[start:stop], head.sub_past[start:stop], base, 1, out)

    def _start(self, latent: torch.Tensor) -> _Drawing:
        """Run the step's head here and give its sub-frames to the pool."""
        head = self._net.head(latent.transpose(1, 2), self._state)
        self._state = head.last
        height, width = (SPATIAL_SCALE * d for d in latent.shape[-2:])
        drawing = _Drawing(
            frames=torch.empty(1, 3, TEMPORAL_SCALE, height, width),
            planes=torch.empty(TEMPORAL_SCALE, height * 3 // 2, width, dtype=torch.uint8),
        )
        if self._pool is None:
            self._pool = ThreadPoolExecutor(TAIL_PARTS, thread_name_prefix="vaecast-tiny-tail")
        inference = torch.is_inference_mode_enabled()
        per_part = TEMPORAL_SCALE // TAIL_PARTS
        drawing.parts = [
            self._pool.submit(self._draw, head, start, start + per_part, drawing, inference)
            for start in range(0, TEMPORAL_SCALE, per_part)
        ]
        return drawing

    def _draw(
        self, head: StepHead, start: int, stop: int, drawing: _Drawing, inference: bool
    ) -> None:
        """On a pool thread: sub-frames `start:stop`, and their YUV 4:2:0 (the
        server's host conversion: the one thread that would make it for the whole
        chunk is this decode's busiest)."""
        with thread_ops(self._part_threads), torch.inference_mode(inference):
            frames = self._tail(head, start, stop, drawing.frames[:, :, start:stop])
            yuv420_on_device(frames, TinyDecoder.value_range, out=drawing.planes[start:stop])

    def _emit_drawn(self, emit: Emit) -> None:
        """Wait for the step being drawn, if any, and add its frames."""
        if self._drawing is None:
            return
        drawing, self._drawing = self._drawing, None
        for part in drawing.parts:
            part.result()  # a pool thread's error is the decode's
        height, width = drawing.frames.shape[-2:]
        self._add(drawing.frames, emit, Yuv420Frames(drawing.planes.numpy(), height, width))


@dataclass(slots=True)
class _Drawing:
    """One step's frames being drawn on the pool, and their YUV 4:2:0."""

    frames: torch.Tensor
    planes: torch.Tensor
    parts: list[Future[None]] = field(default_factory=list)
