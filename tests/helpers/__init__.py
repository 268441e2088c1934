"""Shared test helpers: latent files, a gated decoder, and reading fMP4 streams."""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import av
import numpy as np
import torch
from safetensors.torch import save as save_safetensors

from vaecast.models.base import ChunkCallback, DecodedChunk, DecodePlan, StreamPlan
from vaecast.models.linear import LinearDecoder

GATE_TIMEOUT_S = 30.0
T = TypeVar("T")


def smooth_latents(frames: int, height: int = 6, width: int = 8, seed: int = 0) -> torch.Tensor:
    """BCTHW latents whose RGB channels vary smoothly in space and time.

    Smooth content keeps H.264 error small, so pixel comparisons can be tight.
    """
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(1, 16, frames, 2, 2, generator=generator) * 1.6 - 0.8
    return torch.nn.functional.interpolate(
        coarse, size=(frames, height, width), mode="trilinear", align_corners=True
    ).contiguous()


def safetensors_bytes(metadata: dict[str, str] | None = None, **tensors: torch.Tensor) -> bytes:
    return save_safetensors(tensors, metadata=metadata)


class GatedDecoder:
    """The linear decoder, holding chunk `hold_at` back until the test opens `gate`.

    Records how many chunks it published and how its decode ended, so tests can
    assert on progress and on where a cancel stopped it, without sleeping.
    """

    def __init__(self, hold_at: int | None = None) -> None:
        self.inner = LinearDecoder()
        self.name = "gated"
        self.latent_channels = self.inner.latent_channels
        self.value_range = self.inner.value_range
        self.device = self.inner.device
        self.hold_at = hold_at
        self.gate = threading.Event()
        self.holding = threading.Event()  # set while chunk `hold_at` waits for the gate
        self.published = 0
        self.ended_with: BaseException | None = None
        self.finished = threading.Event()

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return self.inner.plan(latent_shape)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return self.inner.plan_stream(first_block_shape)

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        self._recorded(lambda: self.inner.decode_chunks(latents, self._gated(on_chunk)))

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        return self._recorded(lambda: self.inner.decode_stream(blocks, self._gated(on_chunk)))

    def _gated(self, on_chunk: ChunkCallback) -> ChunkCallback:
        def gated(chunk: DecodedChunk) -> None:
            if chunk.index == self.hold_at:
                self.holding.set()
                if not self.gate.wait(GATE_TIMEOUT_S):
                    raise TimeoutError("the test never opened the gate")
            on_chunk(chunk)
            self.published += 1

        return gated

    def _recorded(self, decode: Callable[[], T]) -> T:
        try:
            return decode()
        except BaseException as error:
            self.ended_with = error
            raise
        finally:
            self.finished.set()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(latents)


class FailingDecoder(GatedDecoder):
    """Raises inside the decode after publishing `fail_at` chunks."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        def failing(chunk: DecodedChunk) -> None:
            if chunk.index == self.fail_at:
                raise RuntimeError("out of memory (simulated)")
            on_chunk(chunk)

        super().decode_chunks(latents, failing)


def decode_mp4(data: bytes) -> list[np.ndarray]:
    """Every frame of an MP4 as RGB24 arrays, decoded by PyAV (FFmpeg)."""
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def vaecast_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vaecast-")]


# How long a thread that must end may take to, once joined: generous, since a busy
# machine may not schedule it at once; a thread still alive after it is a leak.
THREAD_END_S = 20.0


def assert_threads_end(before: Iterable[threading.Thread], bound_s: float = THREAD_END_S) -> None:
    """Every vaecast thread started since `before` (`vaecast_threads()` then) ends: each
    is joined, within `bound_s` in all. One that lives on fails the test with its name
    and where it stands (its stack), which says why it lived.

    Threads of `before` are not this test's to end (another test's idle pool, say, that
    the garbage collector will stop): only the new ones are checked, so a thread of an
    earlier test that happens to end meanwhile is no failure either.
    """
    import sys
    import time
    import traceback

    known = {thread.ident for thread in before}
    started = [thread for thread in vaecast_threads() if thread.ident not in known]
    deadline = time.monotonic() + bound_s
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [thread for thread in started if thread.is_alive()]
    frames = sys._current_frames()
    where = {
        thread.name: "".join(traceback.format_stack(frames[thread.ident])[-4:])
        for thread in alive
        if thread.ident in frames
    }
    assert not alive, f"threads alive {bound_s:.0f} s after their end: {where}"


def split_stream(data: bytes) -> tuple[bytes, list[bytes]]:
    """(init segment, [moof+mdat, ...]) of a whole fMP4 stream; fails on anything else.
    A fragment's timed metadata (`emsg` boxes before its `moof`, as the live rendition
    writes) is part of it."""
    from vaecast.codecs.fmp4_reader import iter_boxes

    boxes = list(iter_boxes(data))
    types = [box.type for box in boxes]
    assert types[:2] == ["ftyp", "moov"], types
    media = [box for box in boxes[2:] if box.type != "emsg"]
    assert [box.type for box in media] == ["moof", "mdat"] * (len(media) // 2), types
    init = data[: boxes[1].offset + boxes[1].size]
    fragments, start = [], boxes[1].offset + boxes[1].size
    for mdat in media[1::2]:
        fragments.append(data[start : mdat.offset + mdat.size])
        start = mdat.offset + mdat.size
    return init, fragments


async def until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Yield to the loop until `predicate()` holds; fail after `timeout_s`.

    For state owned by aiohttp or the job that offers no event to wait on.
    """

    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110 - nothing to wait on
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny convs: on a busy 2-core box a second intra-op thread makes them far slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
