"""`tiny`'s streaming decode on a CPU, spread over threads (`TinyStream`).

Apart from `tiny` because it is its own concern: a thread pool, operator-thread
settings (`op_threads`) and the YUV 4:2:0 made beside the frames, arranged so that
the decode and x264 share a few cores well; the frames stay bit for bit those of
`TinyDecoderNet.forward`, and with fewer than 2 operator threads (or no per-thread
control) it is the plain `CausalStream` path.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from vaecast.codecs.colour import Yuv420Frames
from vaecast.codecs.quantize import yuv420_on_device
from vaecast.models.op_threads import per_thread_control, thread_ops
from vaecast.models.streaming import CausalStream, Emit
from vaecast.models.tiny_nets import (
    SPATIAL_SCALE,
    TEMPORAL_SCALE,
    VALUE_RANGE,
    StepHead,
    TinyDecoderNet,
)

# A step's 4 sub-frames are drawn in this many parts at once on a CPU, one pool
# thread each (`TinyStream`).
TAIL_PARTS = 2


class TinyStream(CausalStream):
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
            yuv420_on_device(frames, VALUE_RANGE, out=drawing.planes[start:stop])

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
