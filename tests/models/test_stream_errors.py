"""`decode_stream` when something fails mid-stream: the model raises (out of memory, say), a
block does not continue the stream, the iterator raises (a server cancels a push session so),
or the callback raises (the consumer went away). The exception comes out as it was raised, and
nothing of the decode stays alive, even while the exception and its traceback are kept (a job
keeps its error for as long as it is retained); the decoder then decodes as before."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import torch

from tests.helpers import one_torch_thread
from tests.helpers.streams import (
    CASE_NAMES,
    Case,
    PushedBlocks,
    build_case,
    count_calls,
    failing_after,
    split,
    tensor_census,
)
from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.diffusers_family import vae_lock
from vaecast.models.linear import LinearDecoder
from vaecast.models.wan import WanDecoder

FAILURES = ("model", "bad block", "iterator", "callback")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[Case, torch.Tensor]]:
    """Each case with its one-shot decode."""
    cases = {name: build_case(name) for name in CASE_NAMES}
    return {name: (case, case.decoder.decode(case.latents)) for name, case in cases.items()}


def middle_cuts(case: Case) -> list[int]:
    """Three blocks, so that chunks are published before a failure in the last two."""
    half = case.min_frames + (case.max_frames - case.min_frames) // 2
    return [half, half + 1]


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("failure", FAILURES)
def test_a_failure_mid_stream_comes_out_and_leaves_nothing_alive(
    built: dict[str, tuple[Case, torch.Tensor]], name: str, failure: str
) -> None:
    case, decoded = built[name]
    if failure == "model" and case.model_part is None:
        pytest.skip("a parameter-free decoder has no model to fail")
    error: BaseException = RuntimeError(f"{failure} failed (simulated)")
    calls = 0
    if failure == "model":
        assert case.model_part is not None
        calls = count_calls(case.model_part, lambda: case.decoder.decode(case.latents)) // 2
    seen: list[tuple[int, int | None, int]] = []

    def on_chunk(chunk: DecodedChunk) -> None:
        seen.append((chunk.index, chunk.total, chunk.frame_start))
        if failure == "callback":
            raise error

    with tensor_census() as alive:
        blocks = split(case.latents, middle_cuts(case))
        if failure == "bad block":
            blocks[2] = torch.zeros(*blocks[2].shape[:4], blocks[2].shape[4] + 1)
            error = InvalidRequestError("")
        elif failure == "iterator":
            del blocks[2]
        pushed = PushedBlocks(blocks, [False] * (len(blocks) + 1), lambda: len(seen))
        if failure == "iterator":
            pushed = PushedBlocks(blocks, [False] * (len(blocks) + 1), lambda: len(seen), error)
        del blocks
        with pushed, pytest.raises(type(error)) as caught:
            if failure == "model":
                assert case.model_part is not None
                with failing_after(case.model_part, calls, error):
                    case.decoder.decode_stream(pushed, on_chunk)
            else:
                case.decoder.decode_stream(pushed, on_chunk)
        del pushed
        # Kept, with its traceback, as a job keeps its error: it holds no tensor.
        assert caught.value.__traceback__ is not None
        assert alive() == []

    if failure != "bad block":
        assert caught.value is error
    else:
        assert "does not continue the stream" in str(caught.value)
    assert seen, "the failure came before any chunk"
    assert [index for index, _, _ in seen] == list(range(len(seen)))
    if isinstance(case.decoder, WanDecoder):
        assert not vae_lock(case.decoder.vae).locked()
    # Nothing of the failed decode is left to disturb the next one.
    assert torch.equal(case.decoder.decode(case.latents), decoded)


def test_a_failed_whole_decode_leaves_nothing_alive_either(
    built: dict[str, tuple[Case, torch.Tensor]],
) -> None:
    case, _ = built["tiny"]
    assert case.model_part is not None
    error = RuntimeError("out of memory (simulated)")
    with tensor_census() as alive:
        with failing_after(case.model_part, 2, error), pytest.raises(RuntimeError) as caught:
            case.decoder.decode_chunks(case.latents, lambda chunk: None)
        assert caught.value is error
        assert alive() == []


def test_a_failed_stream_closes_the_generator_it_was_reading() -> None:
    decoder = LinearDecoder()
    latents = torch.zeros(1, 16, 4, 1, 1)
    closed = threading.Event()

    def blocks() -> Iterator[torch.Tensor]:
        try:
            yield from split(latents, [1, 2, 3])
        finally:
            closed.set()

    def stop(chunk: DecodedChunk) -> None:
        if chunk.index == 1:
            raise RuntimeError("viewer gone")

    generator = blocks()
    with pytest.raises(RuntimeError, match="viewer gone"):
        decoder.decode_stream(generator, stop)
    assert closed.is_set()


def test_a_generator_that_fails_to_close_does_not_hide_the_error() -> None:
    def blocks() -> Iterator[torch.Tensor]:
        try:
            yield torch.zeros(1, 16, 1, 1, 1)
            yield torch.zeros(1, 16, 1, 1, 1)
        except GeneratorExit:
            raise ValueError("cannot close") from None

    def stop(chunk: DecodedChunk) -> None:
        raise RuntimeError("viewer gone")

    with pytest.raises(RuntimeError, match="viewer gone") as caught:
        LinearDecoder().decode_stream(blocks(), stop)
    assert caught.value.__notes__ == [
        "closing the latent block iterator failed too: ValueError('cannot close')"
    ]


def test_an_error_from_a_task_that_goes_on_leaves_the_task_running() -> None:
    """A server may hand the iterator an exception caught by a coroutine that then goes on:
    that coroutine's frame is in the traceback, and clearing it would close the coroutine."""

    async def handler(caught: list[BaseException], go_on: asyncio.Event) -> str:
        try:
            raise ConnectionResetError("client gone")
        except ConnectionResetError as error:
            caught.append(error)
        await go_on.wait()
        return "went on"

    async def main() -> str:
        caught: list[BaseException] = []
        go_on = asyncio.Event()
        task = asyncio.ensure_future(handler(caught, go_on))
        await asyncio.sleep(0)

        def blocks() -> Iterator[torch.Tensor]:
            yield torch.zeros(1, 16, 1, 1, 1)
            raise caught[0]

        with pytest.raises(ConnectionResetError):
            LinearDecoder().decode_stream(blocks(), lambda chunk: None)
        go_on.set()
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(main()) == "went on"


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((1, 16, 1, 2, 4), r"\(1, 16, 1, 2, 4\) does not continue the stream: .*2, 2, 3\)"),
        ((1, 4, 1, 2, 3), "does not continue the stream"),
        ((2, 16, 1, 2, 3), "does not continue the stream"),
        ((1, 16, 0, 2, 3), "a latent block needs at least 1 frame in time, got 0"),
        ((16, 1, 2, 3), r"must be BCTHW \(5 dimensions\), got 4"),
    ],
)
def test_a_block_unlike_the_first_is_refused(shape: tuple[int, ...], message: str) -> None:
    blocks = [torch.zeros(1, 16, 2, 2, 3), torch.zeros(shape)]
    chunks: list[int] = []
    with pytest.raises(InvalidRequestError, match=message):
        LinearDecoder().decode_stream(blocks, lambda chunk: chunks.append(chunk.index))
    assert chunks == [0, 1]  # the first block's chunks were out before the second came


def test_a_stream_is_refused_as_whole_latents_would_be(
    built: dict[str, tuple[Case, torch.Tensor]],
) -> None:
    linear = LinearDecoder()
    with pytest.raises(InvalidRequestError, match="ended before its first block"):
        linear.decode_stream(iter([]), lambda chunk: None)
    with pytest.raises(InvalidRequestError, match="takes 16 latent channels, got 4"):
        linear.decode_stream([torch.zeros(1, 4, 1, 2, 2)], lambda chunk: None)
    # minimax-h3 takes 3 latent frames or more: a shorter stream is refused at its end,
    # before anything of it was decoded.
    minimax = built["minimax-h3"][0].decoder
    chunks: list[int] = []
    blocks = [torch.zeros(1, 4, 1, 2, 3), torch.zeros(1, 4, 1, 2, 3)]
    with pytest.raises(InvalidRequestError, match="need at least 3 frame"):
        minimax.decode_stream(blocks, lambda chunk: chunks.append(chunk.index))
    assert chunks == []


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_builtin_decoder_has_the_streaming_contract(
    built: dict[str, tuple[Case, torch.Tensor]], name: str
) -> None:
    assert isinstance(built[name][0].decoder, ChunkedDecoder)
