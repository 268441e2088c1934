"""`decode_stream`, for every decoder: however the latents are split into blocks, and however
the blocks arrive (ahead of the decoder or while it waits for them), the chunks are the one-shot
decode bit for bit, numbered and placed contiguously, and each is published as soon as the
latents it needs have arrived."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import one_torch_thread
from tests.helpers.streams import CASE_NAMES, Case, PushedBlocks, build_case, split
from vaecast.models.base import DecodedChunk, DecodePlan

# Per decoder: hypothesis examples (each a full stream of a few latent frames).
EXAMPLES = 25


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


class Cases:
    """Decoders built once per module, and their one-shot decodes per length."""

    def __init__(self) -> None:
        self._cases: dict[str, Case] = {}
        self._decoded: dict[tuple[str, int], torch.Tensor] = {}

    def case(self, name: str) -> Case:
        if name not in self._cases:
            self._cases[name] = build_case(name)
        return self._cases[name]

    def decoded(self, name: str, frames: int) -> torch.Tensor:
        if (name, frames) not in self._decoded:
            case = self.case(name)
            self._decoded[name, frames] = case.decoder.decode(case.latents[:, :, :frames])
        return self._decoded[name, frames]


@pytest.fixture(scope="module")
def cases() -> Cases:
    return Cases()


def stream(
    case: Case, latents: torch.Tensor, cuts: Sequence[int], early: Sequence[bool]
) -> tuple[DecodePlan, list[DecodedChunk], PushedBlocks]:
    """`decode_stream` over `latents` cut at `cuts`, pushed from another thread."""
    chunks: list[DecodedChunk] = []

    def keep(chunk: DecodedChunk) -> None:
        chunks.append(
            DecodedChunk(chunk.frames.clone(), chunk.index, chunk.total, chunk.frame_start)
        )

    with PushedBlocks(split(latents, cuts), early, lambda: len(chunks)) as pushed:
        plan = case.decoder.decode_stream(pushed, keep)
    return plan, chunks, pushed


def assert_same(streamed: torch.Tensor, whole: torch.Tensor) -> None:
    assert streamed.shape == whole.shape
    differ = streamed != whole
    assert not differ.any(), (
        f"{int(differ.sum())} values differ, by up to {(streamed - whole).abs().max().item():.3g}, "
        f"in frames {sorted(set(differ.nonzero()[:, 2].tolist()))}"
    )


def check_stream(cases: Cases, name: str, frames: int, cuts: Sequence[int], early: Sequence[bool]):
    case = cases.case(name)
    latents = case.latents[:, :, :frames]
    first_block = split(latents, cuts)[0]
    stream_plan = case.decoder.plan_stream(first_block.shape)
    plan, chunks, pushed = stream(case, latents, cuts, early)

    # The chunks are the one-shot decode, bit for bit, whatever the blocks.
    assert_same(torch.cat([c.frames for c in chunks], dim=2), cases.decoded(name, frames))
    # ... numbered and placed contiguously, as the returned plan (the whole decode's) says.
    assert plan == case.decoder.plan(latents.shape)
    assert [c.index for c in chunks] == list(range(plan.chunks))
    assert tuple(c.frame_count for c in chunks) == plan.chunk_frames
    assert tuple(c.frame_start for c in chunks) == plan.chunk_starts
    # ... as the stream plan, known from the first block, said: only the last may be short.
    for chunk in chunks:
        assert chunk.frames.shape[3:] == (stream_plan.height, stream_plan.width)
        assert chunk.frame_start == stream_plan.chunk_start(chunk.index)
        planned = stream_plan.frames_of(chunk.index)
        assert chunk.frame_count == planned or (chunk is chunks[-1] and chunk.frame_count < planned)
    # ... each published as soon as the latents it needs had arrived: by the time the
    # decoder asked for more, it had committed all it could.
    for received, published in pushed.asked:
        assert published == case.committed(received), pushed.asked
    # The total is known once the iterator has ended, and only then.
    ended = pushed.ended_with_chunks
    assert ended is not None
    assert [c.total for c in chunks] == [None] * ended + [plan.chunks] * (plan.chunks - ended)
    assert [c.is_final for c in chunks] == [False] * (plan.chunks - 1) + [ended < plan.chunks]


@pytest.mark.parametrize("name", CASE_NAMES)
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_any_split_streams_the_one_shot_decode(cases: Cases, name: str, data: st.DataObject):
    case = cases.case(name)
    frames = data.draw(st.integers(case.min_frames, case.max_frames), label="frames")
    cuts = data.draw(st.sets(st.integers(1, frames - 1)) if frames > 1 else st.just(set()))
    early = data.draw(st.lists(st.booleans(), min_size=len(cuts) + 2, max_size=len(cuts) + 2))
    check_stream(cases, name, frames, sorted(cuts), early)


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("blocks", ["one block", "one frame per block"])
@pytest.mark.parametrize("arrival", ["ahead", "while waited for"])
def test_the_extreme_splits(cases: Cases, name: str, blocks: str, arrival: str) -> None:
    frames = cases.case(name).max_frames
    cuts = [] if blocks == "one block" else list(range(1, frames))
    check_stream(cases, name, frames, cuts, [arrival == "ahead"] * (len(cuts) + 2))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_decode_chunks_is_a_stream_of_one_block_with_its_total_known(
    cases: Cases, name: str
) -> None:
    case = cases.case(name)
    chunks: list[DecodedChunk] = []
    case.decoder.decode_chunks(case.latents, chunks.append)
    plan = case.decoder.plan(case.latents.shape)
    assert [(c.index, c.total, c.frame_start) for c in chunks] == [
        (index, plan.chunks, start) for index, start in enumerate(plan.chunk_starts)
    ]
    assert [c.is_final for c in chunks] == [False] * (plan.chunks - 1) + [True]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_frames_for_counts_what_any_prefix_of_a_stream_decodes_to(cases: Cases, name: str) -> None:
    case = cases.case(name)
    _, channels, _, h, w = case.latents.shape
    plan = case.decoder.plan_stream((1, channels, 1, h, w))
    assert plan.frames_for(0) == 0
    for frames in range(1, 40):
        if frames >= case.min_frames:
            assert plan.frames_for(frames) == case.decoder.plan((1, channels, frames, h, w)).frames
    if name == "minimax-h3":  # too short to decode alone, but counted all the same
        assert [plan.frames_for(n) for n in (1, 2, 5, 6)] == [1, 5, 17, 18]


def test_the_encoder_can_open_on_the_first_block(cases: Cases) -> None:
    """The stream plan needs the first block's shape only, whatever its length."""
    tiny = cases.case("tiny").decoder
    for frames in (1, 3):
        plan = tiny.plan_stream((1, 16, frames, 60, 104))
        assert (plan.height, plan.width, plan.first_chunk_frames, plan.chunk_frames) == (
            480,
            832,
            1,
            4,
        )
    grouped = cases.case("taehv-grouped").decoder.plan_stream((1, 16, 1, 2, 3))
    assert (grouped.first_chunk_frames, grouped.chunk_frames) == (5, 8)
    assert [grouped.chunk_start(i) for i in range(4)] == [0, 5, 13, 21]
    minimax = cases.case("minimax-h3").decoder.plan_stream((1, 4, 1, 2, 3))
    assert (minimax.height, minimax.width, minimax.frames_of(0), minimax.frames_of(5)) == (
        8,
        12,
        17,
        17,
    )
