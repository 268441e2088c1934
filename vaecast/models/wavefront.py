"""Streaming a non-causal decoder exactly, layer by layer: each frame of each layer
computed once, as soon as the frames it depends on are in.

A decoder built from these parts maps a clip to what its whole-clip forward gives,
whatever pieces the clip arrives in:
- a temporal conv (`TemporalConv`) of odd kernel k, stride and dilation 1, whose clip is
  padded by repeating its first frame (p = (k - 1) / 2 times, or k - 1 when causal) and
  its last (p times, none when causal): output frame t reads input frames t - p .. t + p,
  so the stage keeps its last k - 1 input frames and emits each output frame once the p
  frames after it are in, padding only where the clip itself starts and ends;
- per-position ops (`Pointwise`: norms over channels, activations, a per-clip
  scale-shift, a rearrangement of each frame into several), applied to whatever arrives;
- residual sums (`Residual`): the shortcut's frames wait in a FIFO until the main branch
  (which lags by its convs' p) has caught up with them;
- dropping a clip's first frames once (`DropFirst`, as a temporal upsampler does).
A `Chain` of stages is a stage. Pushing a clip's frames in any pieces then calling
`finish` gives its frames in order, each computed once, as the whole forward computes
it: the work is the whole forward's (no margins recomputed), and an output frame comes
as soon as the cone of work it depends on is done. Each frame equals the whole
forward's within float rounding (a kernel may accumulate differently over a shorter
input); `vaecast/models/ltx_wavefront.py` checks that at load for the decoders it
builds.

`WavefrontStream` is one decode through such a net as a `LatentStream`: each latent
block goes in as it arrives, and the frames out are cut into the chunks of its
`MarginWindows` geometry (the same chunk plan as the windowed stream's), each emitted
as soon as its last frame is out. `WavefrontChunking` is a family's chunking through it,
with the windowed chunking beside it for the streams it does not take.

Written here rather than taken from a library: the streaming convs we know of (audio
codecs' streaming modules) are built into their own models' layers, while these stages
wrap the layers of a model that was written to see the whole clip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from vaecast.models.base import DecodePlan, StreamPlan
from vaecast.models.margin_windows import MarginChunking, MarginWindows, MarginWindowStream
from vaecast.models.streaming import Emit, Prepare

# Positions (frames x height x width) a piece of a `Chain` covers at least.
PIECE_POSITIONS = 64 * 64
# Where a stage sends each run of output frames (BCTHW) it computes, in order.
Sink = Callable[[torch.Tensor], None]


class Stage(Protocol):
    """A layer (or a run of layers) of a net, fed a clip's frames in pieces."""

    def push(self, frames: torch.Tensor, out: Sink) -> None:
        """Send `out` the output frames that `frames` (the clip's next) make computable."""
        ...

    def finish(self, out: Sink) -> None:
        """The clip ended: send `out` the output frames left."""
        ...


class Pointwise:
    """An op on each frame alone."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._op = op

    def push(self, frames: torch.Tensor, out: Sink) -> None:
        out(self._op(frames))

    def finish(self, out: Sink) -> None:
        pass


class TemporalConv:
    """A conv of `kernel` frames over the clip padded as described above: `conv` is the
    module that convolves an already padded input (its own padding is spatial only)."""

    def __init__(self, conv: Callable[[torch.Tensor], torch.Tensor], kernel: int, causal: bool):
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"an odd temporal kernel expected, not {kernel}")
        self._conv = conv
        self._kernel = kernel
        self._before = kernel - 1 if causal else (kernel - 1) // 2
        self._after = kernel - 1 - self._before
        self._context: torch.Tensor | None = None  # the last kernel - 1 input frames
        self._last: torch.Tensor | None = None  # the clip's last frame so far

    def push(self, frames: torch.Tensor, out: Sink) -> None:
        if self._context is None:  # the clip's start: its first frame repeated
            self._context = frames[:, :, :1].repeat(1, 1, self._before, 1, 1)
        self._last = frames[:, :, -1:]
        self._convolve(torch.cat([self._context, frames], dim=2), out)

    def finish(self, out: Sink) -> None:
        if self._context is None or self._last is None:
            return
        padded = torch.cat([self._context, self._last.repeat(1, 1, self._after, 1, 1)], dim=2)
        self._context = self._last = None
        self._convolve(padded, out)

    def _convolve(self, inputs: torch.Tensor, out: Sink) -> None:
        keep = self._kernel - 1
        # The frames the next push reads, copied where a view would hold a long input.
        context = inputs[:, :, inputs.shape[2] - keep :]
        self._context = context.clone() if inputs.shape[2] > 2 * keep + 1 else context
        if inputs.shape[2] >= self._kernel:
            out(self._conv(inputs))


def conv3d(module: torch.nn.Conv3d) -> Callable[[torch.Tensor], torch.Tensor]:
    """`module`'s forward, but through oneDNN's kernel for every float32 CPU input.

    PyTorch's `Conv3d` picks oneDNN for large inputs and its own im2col kernel for
    small ones (batch x channels x frames x height under 20,480), which on a piece of a
    few frames is several times slower and rounds differently from the whole clip's
    call. The same kernel for every piece keeps a stream's work the whole decode's."""
    weight, bias = module.weight, module.bias
    stride, dilation, groups = module.stride, module.dilation, module.groups
    padding = tuple(int(p) for p in module.padding)
    pad: tuple[int, ...] | None = None
    if module.padding_mode != "zeros":  # padded first, then convolved unpadded
        pad = tuple(p for size in reversed(padding) for p in (size, size))
        padding = (0, 0, 0)
    mkldnn = getattr(torch.ops.aten, "mkldnn_convolution", None)

    def forward(frames: torch.Tensor) -> torch.Tensor:
        if pad is not None:
            frames = F.pad(frames, pad, mode=module.padding_mode)
        if (
            mkldnn is not None
            and frames.device.type == "cpu"
            and frames.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled  # a user who turned oneDNN off keeps it off
        ):
            return mkldnn(frames.contiguous(), weight, bias, padding, stride, dilation, groups)
        return F.conv3d(frames, weight, bias, stride, padding, dilation, groups)

    return forward


class Residual:
    """`main(x) + shortcut(x)`, each output frame summed once both sides have it."""

    def __init__(self, main: Stage, shortcut: Stage) -> None:
        self._main = main
        self._shortcut = shortcut
        self._waiting: list[torch.Tensor] = []  # the shortcut's frames, in order

    def push(self, frames: torch.Tensor, out: Sink) -> None:
        self._shortcut.push(frames, self._waiting.append)
        self._main.push(frames, lambda main: out(self._sum(main)))

    def finish(self, out: Sink) -> None:
        self._shortcut.finish(self._waiting.append)
        self._main.finish(lambda main: out(self._sum(main)))
        if self._waiting:
            raise RuntimeError("a residual's two branches ended at different frames")

    def _sum(self, main: torch.Tensor) -> torch.Tensor:
        needed, parts = main.shape[2], []
        while needed:
            if not self._waiting:
                raise RuntimeError("a residual's main branch ran ahead of its shortcut")
            head = self._waiting[0]
            if head.shape[2] <= needed:
                parts.append(self._waiting.pop(0))
                needed -= head.shape[2]
            else:
                parts.append(head[:, :, :needed])
                self._waiting[0] = head[:, :, needed:]
                needed = 0
        shortcut = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        return main + shortcut


class DropFirst:
    """The clip's first `count` frames dropped."""

    def __init__(self, count: int) -> None:
        self._left = count

    def push(self, frames: torch.Tensor, out: Sink) -> None:
        dropped = min(self._left, frames.shape[2])
        self._left -= dropped
        if dropped < frames.shape[2]:
            out(frames[:, :, dropped:])

    def finish(self, out: Sink) -> None:
        pass


class Chain:
    """Stages one after another, run so that the chain's first output frames need
    little more than the work they depend on, in conv calls that are worth making.

    Each stage has an inbox of the frames it has yet to take. Within one push (or the
    finish) the chain repeatedly runs the last stage whose inbox is ready, so frames
    go on toward the output before more are computed upstream (depth first). An inbox
    is ready when it holds a piece, `PIECE_POSITIONS` positions' worth of frames (at
    least one), or when no more frames can reach it in this call (every stage before it
    has run dry, and at the finish has finished): then it is taken whole. So where
    frames are large they go on one at a time, and where they are small (the latent
    levels, whose convs cost about their weights' memory traffic per call whatever they
    compute) a call takes all that one push or the finish brings."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self._stages = list(stages)
        self._inboxes: list[list[torch.Tensor]] = [[] for _ in self._stages]

    def push(self, frames: torch.Tensor, out: Sink) -> None:
        self._inboxes[0].append(frames)
        self._run(out, final=False)

    def finish(self, out: Sink) -> None:
        self._run(out, final=True)

    def _run(self, out: Sink, final: bool) -> None:
        count = len(self._stages)
        sinks = [inbox.append for inbox in self._inboxes[1:]] + [out]
        dry = 0  # stages [0, dry) can be given nothing more in this call
        while True:
            index = self._last_ready(dry)
            if index is not None:
                self._stages[index].push(self._take(index), sinks[index])
            elif dry < count:  # the first stage not dry has an empty inbox
                if final:
                    self._stages[dry].finish(sinks[dry])
                dry += 1
            else:
                return

    def _last_ready(self, dry: int) -> int | None:
        for index in range(len(self._stages) - 1, -1, -1):
            inbox = self._inboxes[index]
            if inbox and (index <= dry or _frames(inbox) >= _piece(inbox[0])):
                return index
        return None

    def _take(self, index: int) -> torch.Tensor:
        """A piece of the inbox, or all of it where it holds less."""
        inbox = self._inboxes[index]
        frames = inbox[0] if len(inbox) == 1 else torch.cat(inbox, dim=2)
        count = min(frames.shape[2], _piece(frames))
        taken, rest = frames[:, :, :count], frames[:, :, count:]
        inbox[:] = [rest] if rest.shape[2] else []  # in place: the sinks append to it
        return taken


def _frames(inbox: list[torch.Tensor]) -> int:
    return sum(frames.shape[2] for frames in inbox)


def _piece(frames: torch.Tensor) -> int:
    return max(1, PIECE_POSITIONS // (frames.shape[3] * frames.shape[4]))


# (batch, dtype, device) -> a fresh net for one decode.
NetFactory = Callable[[int, torch.dtype, torch.device], Stage]


class WavefrontStream:
    """One decode through a net from `make_net`. A `LatentStream`."""

    def __init__(self, windows: MarginWindows, prepare: Prepare, make_net: NetFactory) -> None:
        self._windows = windows
        self._prepare = prepare
        self._make_net = make_net
        self._net: Stage | None = None
        self._pending: list[torch.Tensor] = []  # frames out, not yet in a chunk
        self._pending_frames = 0
        self._chunks = 0
        self._frames_out = 0
        self._closed = False

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        latents = self._prepare(block)
        if self._net is None:
            assert not self._closed, "a closed stream decodes nothing"
            self._net = self._make_net(int(latents.shape[0]), latents.dtype, latents.device)
        self._net.push(latents.contiguous(), lambda frames: self._take(frames, emit))

    def finish(self, latent_frames: int, emit: Emit) -> None:
        if self._net is None:
            return
        self._net.finish(lambda frames: self._take(frames, emit))
        if self._pending_frames:
            self._emit_chunk(self._pending_frames, emit)
        expected = self._windows.first_frame(latent_frames)
        if self._frames_out != expected:
            raise RuntimeError(
                f"{latent_frames} latent frames decoded to {self._frames_out} frames, "
                f"expected {expected}"
            )

    def close(self) -> None:
        self._net = None
        self._pending = []
        self._closed = True

    def _take(self, frames: torch.Tensor, emit: Emit) -> None:
        self._pending.append(frames)
        self._pending_frames += frames.shape[2]
        self._frames_out += frames.shape[2]
        while self._pending_frames >= self._next_chunk():
            self._emit_chunk(self._next_chunk(), emit)

    def _next_chunk(self) -> int:
        windows = self._windows
        if self._chunks == 0:
            return windows.first_frame(windows.chunk_latents)
        return windows.temporal_scale * windows.chunk_latents

    def _emit_chunk(self, count: int, emit: Emit) -> None:
        pending = self._pending[0] if len(self._pending) == 1 else torch.cat(self._pending, dim=2)
        emit(pending[:, :, :count])
        rest = pending[:, :, count:]
        self._pending = [rest] if rest.shape[2] else []
        self._pending_frames -= count
        self._chunks += 1


@dataclass(frozen=True, slots=True)
class WavefrontChunking:
    """A family's `Chunking` through `WavefrontStream`, where `takes(first block shape)`
    says so; its windowed chunking (`margins`, the same chunk plan) otherwise."""

    margins: MarginChunking
    make_net: NetFactory
    takes: Callable[[tuple[int, ...]], bool]

    @property
    def latent_channels(self) -> int:
        return self.margins.latent_channels

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return self.margins.plan(latent_shape)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return self.margins.plan_stream(first_block_shape)

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> WavefrontStream | MarginWindowStream:
        if not self.takes(first_block_shape):
            return self.margins.open_stream(first_block_shape, latent_frames)
        return WavefrontStream(self.margins.windows, self.margins.prepare, self.make_net)
