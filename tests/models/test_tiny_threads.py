"""`tiny`'s CPU decode spread over threads (`TinyStream`): the same frames as the
network's own forward, bit for bit; YUV 4:2:0 made on the pool equal to the
quantizer's; nothing held back across blocks; no thread, and no operator-thread
setting, left behind however the decode ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import vaecast.models.tiny as tiny
import vaecast.models.tiny_stream as tiny_stream
from tests.helpers.streams import tensor_census
from vaecast.codecs.quantize import quantize_to_host, quantize_yuv420_to_host
from vaecast.models.base import DecodedChunk
from vaecast.models.op_threads import per_thread_control
from vaecast.models.tiny import LATENT_CHANNELS, TinyDecoder
from vaecast.pipeline.bridge import chunk_to_host

POOL_PREFIX = "vaecast-tiny-tail"

pytestmark = pytest.mark.skipif(
    not per_thread_control(), reason="torch's operator threads are not OpenMP's here"
)


@pytest.fixture(autouse=True)
def two_operator_threads() -> Iterator[None]:
    """The spread decode is for 2+ operator threads (CI's 2 cores); set that here."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def decoder() -> TinyDecoder:
    return TinyDecoder()


@pytest.fixture(scope="module")
def latents() -> torch.Tensor:
    # 6 latent steps of a 96x64 video: big enough that the pool's two parts run at once.
    return torch.randn(1, LATENT_CHANNELS, 6, 8, 12, generator=torch.Generator().manual_seed(3))


def pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(POOL_PREFIX)]


def decode(decoder: TinyDecoder, latents: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    with torch.inference_mode():
        decoder.decode_chunks(latents, lambda chunk: chunks.append(chunk))
    return chunks


def reference(decoder: TinyDecoder, latents: torch.Tensor) -> torch.Tensor:
    """The network's forward one step at a time, as the stream was before it was spread
    over threads; latent 0 stands for its last sub-frame."""
    steps, state = [], None
    with torch.inference_mode():
        for t in range(latents.shape[2]):
            step = latents[:, :, t : t + 1].clone(memory_format=torch.contiguous_format)
            video, state = decoder._net(step.transpose(1, 2), state)
            steps.append(video)
    return torch.cat(steps, dim=2)[:, :, tiny.TEMPORAL_SCALE - 1 :]


def whole(decoder: TinyDecoder, latents: torch.Tensor) -> torch.Tensor:
    return torch.cat([c.frames for c in decode(decoder, latents)], dim=2)


def test_the_frames_are_the_forwards_bit_for_bit(decoder, latents):
    seen_pool: list[list[str]] = []
    chunks: list[DecodedChunk] = []

    def keep(chunk: DecodedChunk) -> None:
        seen_pool.append(pool_threads())
        chunks.append(chunk)

    with torch.inference_mode():
        decoder.decode_chunks(latents, keep)
    got, expected = torch.cat([c.frames for c in chunks], dim=2), reference(decoder, latents)
    # Latent 0's frame is drawn alone (a batch of one sub-frame, not four): a kernel
    # chosen for that batch may round differently in the last bit.
    assert torch.allclose(got[:, :, :1], expected[:, :, :1], rtol=0, atol=1e-6)
    assert torch.equal(got[:, :, 1:], expected[:, :, 1:])
    assert any(seen_pool), "the decode never used its pool: the test checked the plain path"


def test_the_pools_yuv420_is_the_quantizers(decoder, latents):
    chunks = decode(decoder, latents)
    # Latent 0's frame is drawn on the calling thread at once (the first fragment's).
    assert chunks[0].yuv420 is None
    for chunk in chunks[1:]:
        assert chunk.yuv420 is not None
        expected = quantize_yuv420_to_host(chunk.frames, decoder.value_range)
        assert np.array_equal(chunk.yuv420.planes, expected.planes)
        # The bridge takes it for the YUV conversion and converts afresh for any other.
        assert chunk_to_host(chunk, quantize_yuv420_to_host, decoder.value_range) is chunk.yuv420
        rgb = chunk_to_host(chunk, quantize_to_host, decoder.value_range)
        assert isinstance(rgb, np.ndarray) and rgb.shape == (4, 64, 96, 3)


@pytest.mark.parametrize("splits", [[1, 1, 1, 1, 1, 1], [2, 4], [1, 5], [3, 3]])
def test_a_stream_in_blocks_gives_the_same_frames(decoder, latents, splits):
    blocks, start = [], 0
    for size in splits:
        blocks.append(latents[:, :, start : start + size])
        start += size
    chunks: list[DecodedChunk] = []
    with torch.inference_mode():
        decoder.decode_stream(iter(blocks), chunks.append)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), whole(decoder, latents))


def test_each_blocks_frames_are_out_before_the_next_block_is_asked_for(decoder, latents):
    chunks: list[DecodedChunk] = []
    asked_with: list[int] = []

    def blocks() -> Iterator[torch.Tensor]:
        for start in (0, 2, 5):
            asked_with.append(len(chunks))
            yield latents[:, :, start : {0: 2, 2: 5, 5: 6}[start]]
        asked_with.append(len(chunks))

    with torch.inference_mode():
        decoder.decode_stream(blocks(), chunks.append)
    # A stream's next block may be long in coming: no frame waits for it.
    assert asked_with == [0, 2, 5, 6]


def test_the_callers_operator_threads_are_given_back(decoder, latents):
    decode(decoder, latents)
    assert torch.get_num_threads() == 2
    assert pool_threads() == []


def test_a_pool_error_fails_the_decode_and_leaves_no_thread(decoder, latents, monkeypatch):
    real_tail = tiny.TinyDecoderNet.tail
    calls = 0

    def failing_tail(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        if threading.current_thread().name.startswith(POOL_PREFIX) and calls >= 4:
            raise RuntimeError("tail broke")
        return real_tail(self, *args, **kwargs)

    monkeypatch.setattr(tiny.TinyDecoderNet, "tail", failing_tail)
    with tensor_census() as alive:
        with pytest.raises(RuntimeError, match="tail broke") as caught, torch.inference_mode():
            decoder.decode_chunks(latents, lambda chunk: None)
        # The error is kept with its traceback, as a job keeps it: it holds no tensor.
        assert caught.value.__traceback__ is not None
        assert alive() == []
    assert pool_threads() == []
    assert torch.get_num_threads() == 2


def test_a_callback_error_waits_for_the_pool_then_stops(decoder, latents):
    def stop_at_two(chunk: DecodedChunk) -> None:
        if chunk.index == 2:
            raise ValueError("consumer gone")

    with pytest.raises(ValueError, match="consumer gone"), torch.inference_mode():
        decoder.decode_chunks(latents, stop_at_two)
    assert pool_threads() == []
    assert torch.get_num_threads() == 2


def test_without_per_thread_control_the_plain_path_gives_the_same_frames(
    decoder, latents, monkeypatch
):
    spread = torch.cat([c.frames for c in decode(decoder, latents)], dim=2)
    monkeypatch.setattr(tiny_stream, "per_thread_control", lambda: False)
    chunks = decode(decoder, latents)
    assert all(c.yuv420 is None for c in chunks)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), spread)


def test_one_operator_thread_takes_the_plain_path(decoder, latents):
    torch.set_num_threads(1)
    seen_pool: list[list[str]] = []
    with torch.inference_mode():
        decoder.decode_chunks(latents, lambda chunk: seen_pool.append(pool_threads()))
    assert not any(seen_pool)
