"""The `cogvideox` decoder: chunks bit-identical to the CogVideoX pipelines' decode (spatial tiling
included), its batches' chunk sizes, what a stream can commit before it ends, CogVideoX 1.5's
padded latents, and loading without the hub."""

from __future__ import annotations

import ast
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLCogVideoX

import vaecast.models.cogvideox
import vaecast.models.frame_batches
from tests.helpers import one_torch_thread
from tests.helpers.tiny_pipelines import TinyPipelineCase, run_case
from tests.helpers.tiny_pipelines.cogvideox import (
    COGVIDEOX_1_0,
    COGVIDEOX_1_5,
    LATENT_CHANNELS,
    tiny_vae,
)
from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.cogvideox import CogVideoXDecoder, CogVideoXLatents
from vaecast.models.layouts import BTCHW, layout_of
from vaecast.models.registry import get_decoder
from vaecast.models.weights_io import WeightsError

WAIT_S = 30.0


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLCogVideoX:
    return tiny_vae()


@pytest.fixture(scope="module")
def decoder(vae: AutoencoderKLCogVideoX) -> CogVideoXDecoder:
    return CogVideoXDecoder(vae)


def latents(frames: int, height: int = 2, width: int = 3, seed: int = 0) -> torch.Tensor:
    """BCTHW latents, as the layout makes them of what the pipeline returns."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, LATENT_CHANNELS, frames, height, width, generator=generator)


def pipeline_decode(vae: AutoencoderKLCogVideoX, latents: torch.Tensor) -> torch.Tensor:
    """pipeline_cogvideox.py's `decode_latents`, verbatim, on BTCHW latents."""
    latents = latents.permute(
        0, 2, 1, 3, 4
    )  # [batch_size, num_channels, num_frames, height, width]
    latents = 1 / vae.config.scaling_factor * latents
    with torch.no_grad():
        return vae.decode(latents).sample


def btchw(latents: torch.Tensor) -> torch.Tensor:
    return latents.permute(0, 2, 1, 3, 4)


def collect(decoder: CogVideoXDecoder, z: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))
    )
    return chunks


def stream(decoder: CogVideoXDecoder, z: torch.Tensor, split: list[int]) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_stream(
        list(z.split(split, dim=2)),
        lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start)),
    )
    return chunks


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [
        (1, (1,)),
        (2, (8,)),
        (3, (9,)),
        (4, (8, 8)),  # even: batches of 2 from the start
        (7, (9, 8, 8)),  # odd: the first batch takes 3
        (8, (8, 8, 8, 8)),
    ],
)
def test_chunks_are_the_pipelines_decode_bit_for_bit(
    vae: AutoencoderKLCogVideoX,
    decoder: CogVideoXDecoder,
    frames: int,
    chunk_frames: tuple[int, ...],
) -> None:
    z = latents(frames, seed=frames)
    chunks = collect(decoder, z)
    expected = pipeline_decode(vae, btchw(z))
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), expected)
    assert tuple(c.frame_count for c in chunks) == chunk_frames
    assert [c.index for c in chunks] == list(range(len(chunk_frames)))
    assert {c.total for c in chunks} == {len(chunk_frames)}
    plan = decoder.plan(z.shape)
    assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    assert (plan.chunk_frames, plan.height, plan.width) == (chunk_frames, 16, 24)
    assert expected.shape[2:] == (sum(chunk_frames), 16, 24) and expected.std() > 0.01


def test_the_vaes_own_frame_counts(decoder: CogVideoXDecoder) -> None:
    """CogVideoX's published geometry: 13 latents are 49 frames, 12 are 48 (the VAE's comment)."""
    assert decoder.plan((1, LATENT_CHANNELS, 13, 60, 90)).chunk_frames == (9,) + (8,) * 5
    assert decoder.plan((1, LATENT_CHANNELS, 12, 60, 90)).frames == 48
    assert decoder.plan((1, LATENT_CHANNELS, 21, 1, 1)).frames == 81  # CogVideoX 1.5, unpadded
    assert [decoder.chunking.batch_frames(1, n) for n in (1, 2, 3)] == [1, 8, 9]


def test_spatial_tiling_is_the_vaes_own() -> None:
    """With tiling on and latents larger than a tile, batches go tile by tile, blended in place."""
    vae = tiny_vae(seed=1)
    z = latents(5, height=6, width=7, seed=5)
    untiled = pipeline_decode(vae, btchw(z))
    vae.enable_tiling(
        tile_sample_min_height=32,
        tile_sample_min_width=32,
        tile_overlap_factor_height=1 / 4,
        tile_overlap_factor_width=1 / 4,
    )
    decoder = CogVideoXDecoder(vae)
    expected = pipeline_decode(vae, btchw(z))
    chunks = collect(decoder, z)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), expected)
    assert [c.frame_count for c in chunks] == [9, 8]
    plan = decoder.plan(z.shape)
    assert expected.shape[3:] == (plan.height, plan.width) == (48, 56)
    assert not torch.equal(expected, untiled)  # the tiles really were there
    assert torch.equal(stream(decoder, z, [1] * 5)[1].frames, chunks[1].frames)


@pytest.mark.parametrize(
    ("frames", "split"),
    [
        (1, [1]),
        (2, [1, 1]),  # nothing is committed before the third latent, so 2 decodes exactly
        (3, [1, 1, 1]),
        (7, [1] * 7),
        (7, [2, 2, 2, 1]),
        (7, [3, 4]),
        (7, [7]),
        (9, [2, 5, 1, 1]),
    ],
)
def test_odd_streams_are_the_whole_decode(
    decoder: CogVideoXDecoder, frames: int, split: list[int]
) -> None:
    z = latents(frames, seed=frames)
    whole = collect(decoder, z)
    chunks = stream(decoder, z, split)
    assert [c.frame_count for c in chunks] == [c.frame_count for c in whole]
    for got, expected in zip(chunks, whole, strict=True):
        assert torch.equal(got.frames, expected.frames)
        assert (got.index, got.frame_start) == (expected.index, expected.frame_start)
    # Every chunk but the last is published before the stream ends, so without a total.
    assert [c.total for c in chunks[:-1]] == [None] * (len(chunks) - 1)


def test_a_stream_commits_each_batch_as_its_latents_arrive(decoder: CogVideoXDecoder) -> None:
    """Batch 0 once latents 0-2 are in, then each pair: the odd lengths' batches."""
    z = latents(7, seed=7)
    arrived: list[int] = []
    published: list[tuple[int, int]] = []  # (chunk index, latent frames arrived by then)

    def blocks() -> Iterator[torch.Tensor]:
        for t in range(7):
            arrived.append(t)
            yield z[:, :, t : t + 1]

    decoder.decode_stream(blocks(), lambda c: published.append((c.index, len(arrived))))
    assert published == [(0, 3), (1, 5), (2, 7)]


def test_the_stream_plan_is_the_odd_lengths(decoder: CogVideoXDecoder) -> None:
    plan = decoder.plan_stream((1, LATENT_CHANNELS, 1, 2, 3))
    assert (plan.first_chunk_frames, plan.chunk_frames, plan.height, plan.width) == (9, 8, 16, 24)
    for frames in (1, 3, 5, 13, 21):
        assert plan.frames_for(frames) == decoder.plan((1, LATENT_CHANNELS, frames, 2, 3)).frames


@pytest.mark.parametrize("frames", [4, 6])
def test_an_even_stream_is_refused_at_its_end(decoder: CogVideoXDecoder, frames: int) -> None:
    """Its batches are not the odd ones it committed: refused, never decoded wrongly in full."""
    published: list[int] = []
    with pytest.raises(InvalidRequestError, match=r"must have an odd number of latent frames"):
        decoder.decode_stream(
            list(latents(frames).split(1, dim=2)), lambda c: published.append(c.frame_count)
        )
    assert published == [9, 8][: (frames - 1) // 2]
    # The same latents as one tensor decode exactly (their length is known from the start).
    z = latents(frames)
    assert [c.frame_count for c in collect(decoder, z)] == [8] * (frames // 2)


def test_a_whole_decode_inside_a_stream_callback_keeps_its_own_length(
    vae: AutoencoderKLCogVideoX, decoder: CogVideoXDecoder
) -> None:
    inner: list[torch.Tensor] = []

    def on_chunk(chunk: DecodedChunk) -> None:
        if chunk.index == 0:
            inner.append(decoder.decode(latents(4, seed=4)))

    decoder.decode_stream(list(latents(3).split(1, dim=2)), on_chunk)
    assert torch.equal(inner[0], pipeline_decode(vae, btchw(latents(4, seed=4))))


def test_bad_latents_are_refused(decoder: CogVideoXDecoder) -> None:
    with pytest.raises(InvalidRequestError, match="this model takes 4 latent channels, got 16"):
        decoder.plan((1, 16, 13, 60, 90))
    with pytest.raises(InvalidRequestError, match=r"at least 1 frame\(s\) in time, got 0"):
        decoder.plan((1, LATENT_CHANNELS, 0, 2, 2))
    with pytest.raises(InvalidRequestError, match="this model takes 4 latent channels, got 16"):
        decoder.decode_stream([torch.zeros(1, 16, 1, 2, 2)], lambda chunk: None)


def test_the_layout_is_btchw_and_drops_cogvideox_1_5s_padding() -> None:
    layout = CogVideoXDecoder.latent_layout
    assert isinstance(layout, CogVideoXLatents)
    assert layout.bind({}) is BTCHW
    tensor = torch.arange(1 * 8 * 4 * 2 * 2, dtype=torch.float32).view(1, 8, 4, 2, 2)
    # num_frames=25: 7 latent frames, padded to 8 by CogVideoX 1.5's pipelines.
    bound = layout.bind({"num_frames": "25"})
    assert bound.bcthw_shape((1, 8, 4, 2, 2)) == (1, 4, 7, 2, 2)
    assert torch.equal(bound.to_bcthw(tensor), tensor[:, 1:].permute(0, 2, 1, 3, 4))
    assert bound.bcthw_shape((1, 7, 4, 2, 2)) == (1, 4, 7, 2, 2)  # CogVideoX 1.0: no padding
    assert bound.bcthw_shape((7, 4, 2, 2)) == (1, 4, 7, 2, 2)
    with pytest.raises(
        InvalidRequestError,
        match=r"num_frames=25 makes 7 latent frames \(8 as CogVideoX 1\.5 pads them\), but these "
        r"latents have 9",
    ):
        bound.bcthw_shape((1, 9, 4, 2, 2))
    with pytest.raises(InvalidRequestError, match=r"num_frames=29 makes 8 latent frames, but"):
        layout.bind({"num_frames": "29"}).bcthw_shape((1, 9, 4, 2, 2))
    with pytest.raises(InvalidRequestError, match="num_frames"):
        layout.bind({"num_frames": "many"})


@pytest.mark.parametrize(
    "case", [COGVIDEOX_1_0, COGVIDEOX_1_5], ids=["cogvideox-1.0", "cogvideox-1.5"]
)
def test_the_pipelines_frames_from_its_latents(case: TinyPipelineCase) -> None:
    """CogVideoXPipeline from tiny random components: its output_type="latent" tensor,
    through the layout and the decoder and the pipeline's post-processing, is its "np"
    output (equal; the bar is 1e-5)."""
    run = run_case(case)
    # With output_type="latent", CogVideoX 1.5's pipeline hands back its padding frame too.
    assert run.latents.shape == ((1, 8, 4, 2, 2) if case is COGVIDEOX_1_5 else (1, 7, 4, 2, 2))
    decoder = CogVideoXDecoder(run.pipeline.vae)
    bound = layout_of(decoder).bind(case.params)
    z = bound.to_bcthw(run.latents)
    assert tuple(z.shape) == bound.bcthw_shape(tuple(run.latents.shape)) == (1, 4, 7, 2, 2)
    chunks = collect(decoder, z)
    assert [c.frame_count for c in chunks] == [9, 8, 8]
    video = torch.cat([c.frames for c in chunks], dim=2)
    frames = run.pipeline.video_processor.postprocess_video(video, output_type="np")[0]
    assert frames.shape == run.frames.shape == (25, 16, 16, 3)
    assert np.allclose(frames, run.frames, rtol=0, atol=1e-5)
    assert np.array_equal(frames, run.frames)
    assert run.frames.std() > 0.01


def test_is_a_chunked_decoder(decoder: CogVideoXDecoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == ("cogvideox", 4, (-1, 1))
    assert (decoder.chunking.spatial_scale, decoder.latent_layout.temporal_scale) == (8, 4)


def test_the_diffusers_internals_we_drive_still_exist(vae: AutoencoderKLCogVideoX) -> None:
    """Fails loudly on a diffusers upgrade that changes the batch loop we reproduce."""
    CogVideoXDecoder.check_internals(vae)
    assert vae.num_latent_frames_batch_size == 2 and vae.post_quant_conv is None
    assert not vae.use_tiling  # the default, and a loaded VAE's


def test_missing_internals_fail_at_load() -> None:
    import diffusers

    stale = SimpleNamespace(config={"scaling_factor": 1.0}, decoder=SimpleNamespace())
    with pytest.raises(WeightsError) as error:
        CogVideoXDecoder.check_internals(stale)
    assert str(error.value).startswith(
        f"diffusers {diffusers.__version__}'s AutoencoderKLCogVideoX no longer has "
        "post_quant_conv, num_latent_frames_batch_size, use_tiling, "
    )
    assert "decoder.forward(sample, temb, conv_cache)" in str(error.value)
    assert str(error.value).endswith(
        "config.temporal_compression_ratio, which vaecast's cogvideox decoder relies on; "
        "install diffusers>=0.35,<0.43"
    )


def test_another_batch_size_is_refused() -> None:
    vae = tiny_vae()
    vae.num_latent_frames_batch_size = 3
    with pytest.raises(WeightsError, match="num_latent_frames_batch_size 3"):
        CogVideoXDecoder(vae)


@pytest.mark.parametrize("layout", ["vae folder", "pipeline folder"])
def test_loads_from_a_local_diffusers_folder(
    vae: AutoencoderKLCogVideoX, tmp_path: Path, layout: str
) -> None:
    if layout == "pipeline folder":
        pipeline = COGVIDEOX_1_0.build()
        pipeline.save_pretrained(tmp_path)
        vae = pipeline.vae
    else:
        vae.save_pretrained(tmp_path)
    z = latents(3)
    for loaded in (
        CogVideoXDecoder.from_weights(tmp_path),
        get_decoder("cogvideox", device="cpu", weights=tmp_path),
        get_decoder("diffusers", device="cpu", weights=tmp_path),
    ):
        assert isinstance(loaded, CogVideoXDecoder)
        assert torch.equal(loaded.decode(z), pipeline_decode(vae, btchw(z)))


def test_weights_must_be_a_local_folder(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="the cogvideox decoder needs --weights"):
        CogVideoXDecoder.from_weights(None)
    with pytest.raises(WeightsError, match="is not a folder"):
        CogVideoXDecoder.from_weights(tmp_path / "vae.safetensors")
    with pytest.raises(WeightsError, match=r"has neither config\.json nor vae/config\.json"):
        CogVideoXDecoder.from_weights(tmp_path)


def test_decodes_may_overlap_on_one_vae(
    vae: AutoencoderKLCogVideoX, decoder: CogVideoXDecoder
) -> None:
    """No state on the module: a decode runs whole while another waits in its callback."""
    first_holding, release = threading.Event(), threading.Event()
    results: dict[str, torch.Tensor] = {}

    def first() -> None:
        frames: list[torch.Tensor] = []

        def hold(chunk: DecodedChunk) -> None:
            frames.append(chunk.frames.clone())
            if chunk.index == 0:
                first_holding.set()
                assert release.wait(WAIT_S)

        decoder.decode_chunks(latents(5, seed=1), hold)
        results["first"] = torch.cat(frames, dim=2)

    one = threading.Thread(target=first)
    one.start()
    assert first_holding.wait(WAIT_S)
    results["second"] = CogVideoXDecoder(vae).decode(latents(5, seed=2))
    release.set()
    one.join(WAIT_S)
    assert torch.equal(results["first"], pipeline_decode(vae, btchw(latents(5, seed=1))))
    assert torch.equal(results["second"], pipeline_decode(vae, btchw(latents(5, seed=2))))


def test_a_callback_error_leaves_the_vae_usable(
    vae: AutoencoderKLCogVideoX, decoder: CogVideoXDecoder
) -> None:
    def fail(chunk: DecodedChunk) -> None:
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        decoder.decode_chunks(latents(5), fail)
    z = latents(5)
    assert torch.equal(decoder.decode(z), pipeline_decode(vae, btchw(z)))


def test_vaecast_imports_without_diffusers(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers is needed to load the model, never to import its module."""
    for module in (
        vaecast.models.cogvideox,
        vaecast.models.frame_batches,
    ):
        tree = ast.parse(Path(module.__file__).read_text())
        modules = [
            alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names
        ]
        modules += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert "torch" in modules  # the scan sees the imports
        assert not [m for m in modules if str(m).split(".")[0] == "diffusers"], module.__name__
    monkeypatch.setitem(sys.modules, "diffusers", None)  # what an absent package looks like
    with pytest.raises(WeightsError, match=r"the cogvideox decoder needs diffusers>=0\.35,<0\.43"):
        CogVideoXDecoder.from_weights("x")
