"""The `mochi` decoder: causal chunks, a latent frame each, that are the Mochi pipeline's
whole-clip decode to rounding (spatial tiling included); the frame-wise fallback, bit-identical
to the frame-wise decode, and how far that is from the whole clip; the leading frames it drops;
loading without the hub."""

from __future__ import annotations

import ast
import copy
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLMochi

import vaecast.models.mochi
from tests.helpers import one_torch_thread
from tests.helpers.tiny_pipelines import run_case
from tests.helpers.tiny_pipelines.mochi import CASES, LATENT_CHANNELS, VAE_CONFIG, tiny_vae
from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.mochi import MochiDecoder
from vaecast.models.registry import get_decoder
from vaecast.models.weights_io import WeightsError


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLMochi:
    return tiny_vae()


@pytest.fixture(scope="module")
def decoder(vae: AutoencoderKLMochi) -> MochiDecoder:
    """The frame-wise decoder (it turns frame-wise decoding on for `vae`)."""
    return MochiDecoder(vae, causal=False)


@pytest.fixture(scope="module")
def whole_vae() -> AutoencoderKLMochi:
    return tiny_vae()


@pytest.fixture(scope="module")
def causal(whole_vae: AutoencoderKLMochi) -> MochiDecoder:
    """The causal pass a latent frame at a time (the default steps 4 after the first)."""
    return MochiDecoder(whole_vae, block_latents=1)


def streams_causally(decoder: MochiDecoder) -> bool:
    """Whether it streams a latent frame at a time (causal), not the frame-wise batches."""
    batches = getattr(decoder.chunking, "batches", None)
    return batches is not None and batches.first == 1


def latents(frames: int, height: int = 2, width: int = 2, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, LATENT_CHANNELS, frames, height, width, generator=generator)


def pipeline_decode(vae: AutoencoderKLMochi, latents: torch.Tensor) -> torch.Tensor:
    """pipeline_mochi.py's decode step, verbatim."""
    has_latents_mean = hasattr(vae.config, "latents_mean") and vae.config.latents_mean is not None
    has_latents_std = hasattr(vae.config, "latents_std") and vae.config.latents_std is not None
    if has_latents_mean and has_latents_std:
        latents_mean = (
            torch.tensor(vae.config.latents_mean)
            .view(1, 12, 1, 1, 1)
            .to(latents.device, latents.dtype)
        )
        latents_std = (
            torch.tensor(vae.config.latents_std)
            .view(1, 12, 1, 1, 1)
            .to(latents.device, latents.dtype)
        )
        latents = latents * latents_std / vae.config.scaling_factor + latents_mean
    else:
        latents = latents / vae.config.scaling_factor
    with torch.no_grad():
        return vae.decode(latents, return_dict=False)[0]


def collect(decoder: MochiDecoder, z: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))
    )
    return chunks


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Over frames clamped to the value range [-1, 1] (peak to peak 2)."""
    mse = float(((a.clamp(-1, 1) - b.clamp(-1, 1)) ** 2).mean())
    return 10 * math.log10(2.0**2 / mse)


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [
        (1, (1,)),  # 6 frames, 5 dropped
        (2, (7,)),
        (3, (7, 6)),
        (5, (7, 12, 6)),
        (6, (7, 12, 12)),
    ],
)
def test_chunks_are_the_pipelines_framewise_decode_bit_for_bit(
    vae: AutoencoderKLMochi, decoder: MochiDecoder, frames: int, chunk_frames: tuple[int, ...]
) -> None:
    z = latents(frames, seed=frames)
    chunks = collect(decoder, z)
    assert vae.use_framewise_decoding  # the decoder turned it on
    expected = pipeline_decode(vae, z)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), expected)
    assert tuple(c.frame_count for c in chunks) == chunk_frames
    assert sum(chunk_frames) == 6 * frames - 5
    assert [c.index for c in chunks] == list(range(len(chunk_frames)))
    assert {c.total for c in chunks} == {len(chunk_frames)}
    plan = decoder.plan(z.shape)
    assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    assert (plan.chunk_frames, plan.height, plan.width) == (chunk_frames, 16, 16)
    assert expected.std() > 0.01


def test_the_decoder_turns_framewise_decoding_on() -> None:
    vae = tiny_vae()
    assert not vae.use_framewise_decoding  # diffusers' default: the whole clip at once
    assert not streams_causally(MochiDecoder(vae, causal=False))
    assert vae.use_framewise_decoding


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [(1, (1,)), (2, (1, 6)), (3, (1, 6, 6)), (5, (1, 6, 6, 6, 6))],
)
def test_causal_chunks_are_the_pipelines_whole_clip_decode(
    whole_vae: AutoencoderKLMochi, causal: MochiDecoder, frames: int, chunk_frames: tuple[int, ...]
) -> None:
    # The pipeline's own path.
    assert streams_causally(causal) and not whole_vae.use_framewise_decoding
    z = latents(frames, seed=frames)
    chunks = collect(causal, z)
    expected = pipeline_decode(whole_vae, z)
    streamed = torch.cat([c.frames for c in chunks], dim=2)
    assert streamed.shape == expected.shape
    assert torch.allclose(streamed, expected, rtol=0, atol=1e-5)
    assert tuple(c.frame_count for c in chunks) == chunk_frames
    plan = causal.plan(z.shape)
    assert plan.chunk_frames == chunk_frames
    assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    assert expected.std() > 0.01


def test_a_causal_stream_commits_each_latent_frame_as_it_arrives(causal: MochiDecoder) -> None:
    z = latents(4, seed=4)
    arrived: list[int] = []
    published: list[tuple[int, int]] = []

    def blocks() -> Iterator[torch.Tensor]:
        for t in range(4):
            arrived.append(t)
            yield z[:, :, t : t + 1]

    causal.decode_stream(blocks(), lambda c: published.append((c.index, len(arrived))))
    assert published == [(0, 1), (1, 2), (2, 3), (3, 4)]
    plan = causal.plan_stream(z.shape)
    assert (plan.first_chunk_frames, plan.chunk_frames, plan.frames_for(4)) == (1, 6, 19)


def test_causal_with_spatial_tiling_is_the_vaes_tiled_whole_clip_decode() -> None:
    vae = tiny_vae(seed=1)
    vae.enable_tiling(32, 32, 24, 24)
    decoder = MochiDecoder(vae)
    z = latents(3, height=5, width=6, seed=3)
    expected = pipeline_decode(vae, z)
    streamed = torch.cat([c.frames for c in collect(decoder, z)], dim=2)
    assert streamed.shape[3:] == (40, 48)
    assert torch.allclose(streamed, expected, rtol=0, atol=1e-5)


def test_a_structure_the_causal_pass_does_not_know_is_decoded_whole_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Exact still: the whole clip at once, its chunks at the end; nothing on the VAE
    changed."""
    vae = tiny_vae()
    # Where an attention over time (and its norm) would be: the pass knows none.
    vae.decoder.block_out.norms[0] = torch.nn.Identity()
    vae.decoder.block_out.attentions[0] = torch.nn.Identity()
    with pytest.raises(WeightsError, match="mochi cannot stream this decoder causally"):
        MochiDecoder(vae, causal=True)
    with caplog.at_level("WARNING", logger="vaecast.models.mochi"):
        decoder = MochiDecoder(vae)
    assert not streams_causally(decoder) and not vae.use_framewise_decoding
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "mochi: decoding each clip whole before streaming it, exactly: the causal pass does "
        "not know this decoder (decoder.block_out"
    )
    z = latents(6, seed=6)
    chunks = collect(decoder, z)
    assert [c.frame_count for c in chunks] == [19, 12]  # latents 0-3, then 4-5
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), pipeline_decode(vae, z))


def test_framewise_against_the_whole_clip_decode(vae: AutoencoderKLMochi) -> None:
    """What the module docstring states: batches decode as clips of their own (no cache),
    so the first batch is the whole decode's (to rounding) and the rest is 24-26 dB off it."""
    whole_vae = tiny_vae()
    framewise = MochiDecoder(vae, causal=False)
    for frames in (5, 9):
        z = latents(frames, seed=frames)
        whole = pipeline_decode(whole_vae, z)
        streamed = framewise.decode(z)
        # Causal convs: the first batch only differs by the rounding of longer convs.
        assert torch.allclose(streamed[:, :, :7], whole[:, :, :7], rtol=0, atol=1e-5)
        assert 24 < psnr(streamed, whole) < 26.5
        assert 0.5 < float((streamed - whole).abs().max()) < 0.9


@pytest.mark.parametrize("split", [[1] * 5, [2, 2, 1], [3, 2], [1, 4], [5]])
def test_streams_are_the_whole_decode(decoder: MochiDecoder, split: list[int]) -> None:
    z = latents(5, seed=5)
    whole = collect(decoder, z)
    chunks: list[DecodedChunk] = []
    plan = decoder.decode_stream(
        list(z.split(split, dim=2)),
        lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start)),
    )
    assert plan == decoder.plan(z.shape)
    assert [c.frame_count for c in chunks] == [7, 12, 6]
    for got, expected in zip(chunks, whole, strict=True):
        assert torch.equal(got.frames, expected.frames)
        assert (got.index, got.frame_start) == (expected.index, expected.frame_start)


def test_a_stream_commits_each_batch_as_its_latents_arrive(decoder: MochiDecoder) -> None:
    z = latents(5, seed=5)
    arrived: list[int] = []
    published: list[tuple[int, int]] = []

    def blocks() -> Iterator[torch.Tensor]:
        for t in range(5):
            arrived.append(t)
            yield z[:, :, t : t + 1]

    decoder.decode_stream(blocks(), lambda c: published.append((c.index, len(arrived))))
    assert published == [(0, 2), (1, 4), (2, 5)]  # the last lone latent once the stream ends


def test_the_stream_plan(decoder: MochiDecoder) -> None:
    plan = decoder.plan_stream((1, LATENT_CHANNELS, 1, 2, 3))
    assert (plan.first_chunk_frames, plan.chunk_frames, plan.height, plan.width) == (7, 12, 16, 24)
    for frames in (1, 2, 5, 8):
        assert plan.frames_for(frames) == decoder.plan((1, LATENT_CHANNELS, frames, 2, 3)).frames


def test_spatial_tiling_is_the_vaes_own() -> None:
    vae = tiny_vae(seed=1)
    z = latents(3, height=5, width=6, seed=3)
    vae.enable_tiling(32, 32, 24, 24)
    decoder = MochiDecoder(vae, causal=False)
    expected = pipeline_decode(vae, z)
    chunks = collect(decoder, z)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), expected)
    assert [c.frame_count for c in chunks] == [7, 6]
    plan = decoder.plan(z.shape)
    assert expected.shape[3:] == (plan.height, plan.width) == (40, 48)
    vae.use_tiling = False
    assert not torch.equal(expected, pipeline_decode(vae, z))  # the tiles really were there


def test_keeping_the_leading_frames_and_other_batch_sizes() -> None:
    """`drop_last_temporal_frames` off: 6 frames per latent; batches of 3 latents."""
    vae = tiny_vae()
    vae.drop_last_temporal_frames = False
    vae.num_latent_frames_batch_size = 3
    decoder = MochiDecoder(vae, causal=False)
    z = latents(4, seed=4)
    chunks = collect(decoder, z)
    assert [c.frame_count for c in chunks] == [18, 6]
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), pipeline_decode(vae, z))
    plan = decoder.plan_stream(z.shape)
    assert (plan.first_chunk_frames, plan.chunk_frames, plan.frames_for(4)) == (18, 18, 24)


def test_a_config_without_mean_and_std_only_scales() -> None:
    torch.manual_seed(0)
    vae = AutoencoderKLMochi(
        **VAE_CONFIG, latents_mean=None, latents_std=None, scaling_factor=0.5
    ).eval()
    z = latents(2, seed=2)
    assert torch.equal(MochiDecoder(vae, causal=False).decode(z), pipeline_decode(vae, z))


def test_the_pipelines_frames_from_its_latents() -> None:
    """MochiPipeline from tiny random components (its default whole-clip decode): its
    output_type="latent" tensor, through the decoder and the pipeline's post-processing,
    is its "np" output (to 1e-5)."""
    (case,) = CASES
    run = run_case(case)
    decoder = MochiDecoder(run.pipeline.vae)
    chunks = collect(decoder, run.latents)
    assert [c.frame_count for c in chunks] == [1, 24]  # latent 0, then a block of 4
    video = torch.cat([c.frames for c in chunks], dim=2)
    frames = run.pipeline.video_processor.postprocess_video(video, output_type="np")[0]
    assert frames.shape == run.frames.shape == (25, 16, 16, 3)
    assert np.allclose(frames, run.frames, rtol=0, atol=1e-5)
    assert run.frames.std() > 0.01


def test_bad_latents_are_refused(decoder: MochiDecoder) -> None:
    with pytest.raises(InvalidRequestError, match="this model takes 12 latent channels, got 16"):
        decoder.plan((1, 16, 5, 2, 2))
    with pytest.raises(InvalidRequestError, match=r"must be BCTHW \(5 dimensions\), got 4"):
        decoder.plan((12, 5, 2, 2))
    with pytest.raises(InvalidRequestError, match="this model takes 12 latent channels, got 4"):
        decoder.decode_stream([torch.zeros(1, 4, 1, 2, 2)], lambda chunk: None)


def test_is_a_chunked_decoder(decoder: MochiDecoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == ("mochi", 12, (-1, 1))
    chunking = decoder.chunking
    # 6 frames per latent, the first 5 of the video dropped: latent 0 stands for 1.
    assert (chunking.spatial_scale, chunking.frames_per_latent, chunking.group_opening_frames) == (
        8,
        6,
        1,
    )


def test_the_diffusers_internals_we_drive_still_exist(vae: AutoencoderKLMochi) -> None:
    """Fails loudly on a diffusers upgrade that changes the frame-wise loop we reproduce."""
    MochiDecoder.check_internals(vae)
    assert vae.num_latent_frames_batch_size == 2 and vae.drop_last_temporal_frames
    assert not vae.use_tiling


def test_missing_internals_fail_at_load() -> None:
    import diffusers

    stale = SimpleNamespace(
        config={"latent_channels": 12, "latents_mean": None, "latents_std": None},
        decoder=SimpleNamespace(),
        use_framewise_decoding=False,
    )
    with pytest.raises(WeightsError) as error:
        MochiDecoder.check_internals(stale)
    message = str(error.value)
    assert message.startswith(
        f"diffusers {diffusers.__version__}'s AutoencoderKLMochi no longer has "
        "num_latent_frames_batch_size, drop_last_temporal_frames, "
    )
    assert "decoder.forward(hidden_states, conv_cache)" in message
    assert message.endswith(
        "config.scaling_factor, which vaecast's mochi decoder relies on; "
        "install diffusers>=0.35,<0.43"
    )


@pytest.mark.parametrize("layout", ["vae folder", "pipeline folder"])
def test_loads_from_a_local_diffusers_folder(
    vae: AutoencoderKLMochi, decoder: MochiDecoder, tmp_path: Path, layout: str
) -> None:
    if layout == "pipeline folder":
        pipeline = CASES[0].build()
        pipeline.save_pretrained(tmp_path)
        vae = pipeline.vae
    else:
        vae.save_pretrained(tmp_path)
    z = latents(3)
    whole = copy.deepcopy(vae)
    whole.use_framewise_decoding = False  # as the folder loads: the decode is the whole clip's
    expected = pipeline_decode(whole, z)
    for loaded in (
        MochiDecoder.from_weights(tmp_path),
        get_decoder("mochi", device="cpu", weights=tmp_path),
        get_decoder("diffusers", device="cpu", weights=tmp_path),
    ):
        assert isinstance(loaded, MochiDecoder) and streams_causally(loaded)
        assert not loaded.vae.use_framewise_decoding
        assert torch.allclose(loaded.decode(z), expected, rtol=0, atol=1e-5)


def test_weights_must_be_a_local_folder(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="the mochi decoder needs --weights"):
        MochiDecoder.from_weights(None)
    with pytest.raises(WeightsError, match="is not a folder"):
        MochiDecoder.from_weights(tmp_path / "vae.safetensors")
    with pytest.raises(WeightsError, match=r"has neither config\.json nor vae/config\.json"):
        MochiDecoder.from_weights(tmp_path)


def test_a_callback_error_leaves_the_vae_usable(
    vae: AutoencoderKLMochi, decoder: MochiDecoder
) -> None:
    def fail(chunk: DecodedChunk) -> None:
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        decoder.decode_chunks(latents(3), fail)
    z = latents(3)
    assert torch.equal(decoder.decode(z), pipeline_decode(vae, z))


def test_vaecast_imports_without_diffusers(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers is needed to load the model, never to import its module."""
    for module in (vaecast.models.mochi,):
        tree = ast.parse(Path(module.__file__).read_text())
        modules = [
            alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names
        ]
        modules += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert "torch" in modules  # the scan sees the imports
        assert not [m for m in modules if str(m).split(".")[0] == "diffusers"], module.__name__
    monkeypatch.setitem(sys.modules, "diffusers", None)  # what an absent package looks like
    with pytest.raises(WeightsError, match=r"the mochi decoder needs diffusers>=0\.35,<0\.43"):
        MochiDecoder.from_weights("x")


def test_blocks_of_latents_are_the_whole_clip_decode_too(whole_vae: AutoencoderKLMochi) -> None:
    """By default latent 0 is a chunk of its own, then blocks of 4 latent frames, each one
    step of the causal pass: the same frames, in any split of a stream."""
    decoder = MochiDecoder(whole_vae)
    z = latents(10, seed=10)
    chunks = collect(decoder, z)
    assert [c.frame_count for c in chunks] == [1, 24, 24, 6]
    assert decoder.plan(z.shape).chunk_frames == (1, 24, 24, 6)
    whole = torch.cat([c.frames for c in chunks], dim=2)
    torch.testing.assert_close(whole, pipeline_decode(whole_vae, z), rtol=0, atol=1e-5)
    published: list[int] = []
    received = 0

    def blocks() -> Iterator[torch.Tensor]:
        nonlocal received
        for block in z.split([3, 1, 6], dim=2):
            received += block.shape[2]
            yield block

    streamed: list[torch.Tensor] = []

    def on_chunk(chunk: DecodedChunk) -> None:
        streamed.append(chunk.frames.clone())
        published.append(received)

    decoder.decode_stream(blocks(), on_chunk)
    assert torch.equal(torch.cat(streamed, dim=2), whole)
    assert published == [3, 10, 10, 10]  # latent 0 at once; each block once it is whole
    plan = decoder.plan_stream(z[:, :, :1].shape)
    assert (plan.first_chunk_frames, plan.chunk_frames) == (1, 24)
