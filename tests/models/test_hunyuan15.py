"""The `hunyuan-video-1.5` decoder: a causal streaming pass whose chunks concatenate to
diffusers' `vae.decode` (within 1e-5 in fp32; spatial tiling included), the real pipelines'
frames reproduced, streams of any split identical to the whole decode, loading without the
hub, and the diffusers internals it drives."""

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
from diffusers import AutoencoderKLHunyuanVideo15

import vaecast.models.hunyuan15
import vaecast.models.hunyuan15_stream
from tests.helpers import one_torch_thread
from tests.helpers.tiny_pipelines import TinyPipelineCase, run_case
from tests.helpers.tiny_pipelines.hunyuan15 import (
    CASES,
    IMAGE_TO_VIDEO_CASES,
    LATENT_CHANNELS,
    VAE_CONFIG,
)
from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.hunyuan15 import HunyuanVideo15Decoder, SpatialTiling
from vaecast.models.layouts import layout_of
from vaecast.models.registry import get_decoder
from vaecast.models.weights_io import WeightsError

# fp32: the pass runs a latent frame at a time, where the kernels may round otherwise
# than over the whole clip (measured up to ~2e-6; often bit-identical).
ATOL = 1e-5
WAIT_S = 30.0


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def random_vae(seed: int = 0, **config: object) -> AutoencoderKLHunyuanVideo15:
    torch.manual_seed(seed)
    vae = AutoencoderKLHunyuanVideo15(**(VAE_CONFIG | config)).eval()
    # Larger random weights than the init's, gains and attention projections included,
    # so that every layer (and the attention across frames) moves the output.
    with torch.no_grad():
        for parameter in vae.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
    return vae


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLHunyuanVideo15:
    return random_vae()


@pytest.fixture(scope="module")
def decoder(vae: AutoencoderKLHunyuanVideo15) -> HunyuanVideo15Decoder:
    """The causal pass a latent frame at a time (the default steps 4 after the first)."""
    return HunyuanVideo15Decoder(vae, block_latents=1)


def latents(frames: int, height: int = 3, width: int = 5, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, LATENT_CHANNELS, frames, height, width, generator=generator)


def pipeline_decode(vae: AutoencoderKLHunyuanVideo15, latents: torch.Tensor) -> torch.Tensor:
    """What both HunyuanVideo 1.5 pipelines do with their final latents, verbatim."""
    latents = latents.to(vae.dtype) / vae.config.scaling_factor
    with torch.no_grad():
        return vae.decode(latents, return_dict=False)[0]


def collect(decoder: HunyuanVideo15Decoder, z: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))
    )
    return chunks


def stream(decoder: HunyuanVideo15Decoder, z: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    blocks = list(z.split(sizes, dim=2))
    frames: list[torch.Tensor] = []
    plan = decoder.decode_stream(iter(blocks), lambda c: frames.append(c.frames.clone()))
    assert plan == decoder.plan(z.shape)
    return torch.cat(frames, dim=2)


@pytest.mark.parametrize(
    ("frames", "height", "width"), [(1, 3, 5), (2, 1, 1), (5, 3, 5), (6, 4, 4)]
)
def test_chunks_concatenate_to_the_pipelines_decode(
    vae: AutoencoderKLHunyuanVideo15,
    decoder: HunyuanVideo15Decoder,
    frames: int,
    height: int,
    width: int,
) -> None:
    z = latents(frames, height, width, seed=frames)
    chunks = collect(decoder, z)
    expected = pipeline_decode(vae, z)
    decoded = torch.cat([c.frames for c in chunks], dim=2)
    assert decoded.shape == expected.shape == (1, 3, 1 + 4 * (frames - 1), 4 * height, 4 * width)
    assert torch.allclose(decoded, expected, rtol=0, atol=ATOL), (decoded - expected).abs().max()
    assert [c.frame_count for c in chunks] == [1] + [4] * (frames - 1)
    assert [c.index for c in chunks] == list(range(frames))
    assert {c.total for c in chunks} == {frames}
    assert [c.frame_start for c in chunks] == [0, *range(1, 4 * frames - 3, 4)][:frames]
    assert [c.is_final for c in chunks] == [False] * (frames - 1) + [True]
    plan = decoder.plan(z.shape)
    assert plan.chunk_frames == tuple(c.frame_count for c in chunks)
    assert (plan.height, plan.width) == expected.shape[3:]
    assert expected.std() > 0.1  # random weights that reach the output


def test_each_frame_depends_on_the_frames_before(decoder: HunyuanVideo15Decoder) -> None:
    """The carried state counts: a latent frame decodes otherwise after other frames (the
    convs' carried inputs and the attention's keys), and earlier chunks never change."""
    z = latents(4)
    changed = z.clone()
    changed[:, :, 1] += 1.0
    ours, theirs = decoder.decode(z), decoder.decode(changed)
    assert torch.equal(ours[:, :, :1], theirs[:, :, :1])
    for chunk in range(1, 4):
        frames = slice(1 + 4 * (chunk - 1), 1 + 4 * chunk)
        assert not torch.allclose(ours[:, :, frames], theirs[:, :, frames], atol=1e-3)


@pytest.mark.parametrize("sizes", [[1] * 6, [2, 4], [3, 1, 2], [6]])
def test_a_stream_of_any_split_is_the_whole_decode(
    decoder: HunyuanVideo15Decoder, sizes: list[int]
) -> None:
    z = latents(6, seed=3)
    assert torch.equal(stream(decoder, z, sizes), decoder.decode(z))


def test_a_stream_publishes_each_chunk_before_the_next_block(
    decoder: HunyuanVideo15Decoder,
) -> None:
    z = latents(3)
    events: list[str] = []
    totals: list[int | None] = []

    def blocks() -> Iterator[torch.Tensor]:
        for t in range(3):
            events.append(f"block {t}")
            yield z[:, :, t : t + 1]

    def on_chunk(chunk: DecodedChunk) -> None:
        events.append(f"chunk {chunk.index}")
        totals.append(chunk.total)

    plan = decoder.decode_stream(blocks(), on_chunk)
    assert plan.chunk_frames == (1, 4, 4)
    assert events == ["block 0", "chunk 0", "block 1", "chunk 1", "block 2", "chunk 2"]
    assert totals == [None, None, None]  # each committed before the stream's end is known
    stream_plan = decoder.plan_stream(z[:, :, :1].shape)
    assert (stream_plan.first_chunk_frames, stream_plan.chunk_frames) == (1, 4)
    assert (stream_plan.height, stream_plan.width) == (12, 20)
    assert [stream_plan.frames_for(n) for n in (1, 2, 3)] == [1, 5, 9]


@pytest.mark.parametrize(
    ("tiles", "height", "width"),
    [
        # tile_latent_min, tile_sample_min, overlap: the real ratios, shrunk (16x: 16 / 256).
        ((4, 16, 0.25), 6, 7),
        # Inconsistent tiles (diffusers' arithmetic then gives a larger frame): followed too.
        ((2, 8, 0.25), 3, 5),
    ],
)
def test_spatial_tiling_streams_as_tiled_decode(
    tiles: tuple[int, int, float], height: int, width: int
) -> None:
    latent, sample, overlap = tiles
    vae = random_vae(1)
    vae.enable_tiling(
        tile_sample_min_height=sample,
        tile_sample_min_width=sample,
        tile_latent_min_height=latent,
        tile_latent_min_width=latent,
        tile_overlap_factor=overlap,
    )
    decoder = HunyuanVideo15Decoder(vae)
    z = latents(3, height, width, seed=5)
    expected = pipeline_decode(vae, z)  # through `tiled_decode`
    decoded = decoder.decode(z)
    assert decoded.shape == expected.shape
    assert torch.allclose(decoded, expected, rtol=0, atol=ATOL), (decoded - expected).abs().max()
    plan = decoder.plan(z.shape)
    assert (plan.height, plan.width) == expected.shape[3:]
    stream_plan = decoder.plan_stream(z[:, :, :1].shape)
    assert (stream_plan.height, stream_plan.width) == expected.shape[3:]
    assert torch.equal(stream(decoder, z, [1, 2]), decoded)
    # Untiled, the same latents give other frames (the blend is not the untiled decode).
    vae.disable_tiling()
    untiled = HunyuanVideo15Decoder(vae).decode(z)
    if untiled.shape == decoded.shape:
        assert not torch.allclose(untiled, decoded, atol=1e-3)


@pytest.mark.parametrize("case", CASES + IMAGE_TO_VIDEO_CASES, ids=["t2v", "i2v"])
def test_reproduces_the_pipelines_frames(case: TinyPipelineCase) -> None:
    """HunyuanVideo15Pipeline and HunyuanVideo15ImageToVideoPipeline: their latents, through
    the decoder and the pipelines' post-processing, are their `output_type="np"` frames."""
    run = run_case(case)
    decoder = HunyuanVideo15Decoder(run.pipeline.vae)
    z = layout_of(decoder).bind(case.params).to_bcthw(run.latents)
    chunks = collect(decoder, z)
    assert len(chunks) >= 2
    video = torch.cat([c.frames for c in chunks], dim=2)
    # The video processor's postprocess: (x / 2 + 0.5).clamp(0, 1), then THWC.
    frames = (video / 2 + 0.5).clamp(0, 1)[0].permute(1, 2, 3, 0).numpy()
    assert frames.shape == run.frames.shape
    np.testing.assert_allclose(frames, run.frames, rtol=0, atol=ATOL)
    assert run.frames.std() > 0.05


@pytest.mark.parametrize("layout", ["model folder", "vae folder"])
def test_loads_from_a_local_diffusers_folder(
    vae: AutoencoderKLHunyuanVideo15, tmp_path: Path, layout: str
) -> None:
    vae.save_pretrained(tmp_path / "vae" if layout == "model folder" else tmp_path)
    z = latents(2)
    expected = pipeline_decode(vae, z)
    for name in ("hunyuan-video-1.5", "diffusers"):
        loaded = get_decoder(name, device="cpu", weights=tmp_path)
        assert isinstance(loaded, HunyuanVideo15Decoder)
        assert torch.allclose(loaded.decode(z), expected, rtol=0, atol=ATOL)
        # A loaded VAE starts untiled, as the pipelines use it.
        assert SpatialTiling.of(loaded.vae) is None
    tiled = HunyuanVideo15Decoder.from_weights(tmp_path, spatial_tiling=True)
    vae.enable_tiling()  # what a pipeline's user does: diffusers' default tiles
    try:
        assert SpatialTiling.of(tiled.vae) == SpatialTiling.of(vae)
    finally:
        vae.disable_tiling()


def test_weights_are_required(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"the hunyuan-video-1\.5 decoder needs --weights"):
        HunyuanVideo15Decoder.from_weights(None)
    with pytest.raises(WeightsError, match=r"has neither config\.json nor vae/config\.json"):
        HunyuanVideo15Decoder.from_weights(tmp_path)
    with pytest.raises(WeightsError, match=r"must be a local diffusers folder"):
        HunyuanVideo15Decoder.from_weights(tmp_path / "vae.safetensors")


def test_bad_latents_are_refused_with_a_clear_message(decoder: HunyuanVideo15Decoder) -> None:
    with pytest.raises(InvalidRequestError, match=r"this model takes 4 latent channels, got 3"):
        decoder.decode(torch.zeros(1, 3, 2, 3, 5))
    with pytest.raises(InvalidRequestError, match=r"at least 1 frame\(s\) in time, got 0"):
        decoder.plan((1, 4, 0, 3, 5))
    with pytest.raises(InvalidRequestError, match=r"latents must be BCTHW \(5 dimensions\), got 4"):
        decoder.decode(torch.zeros(4, 2, 3, 5))
    with pytest.raises(InvalidRequestError, match=r"does not continue the stream"):
        decoder.decode_stream(iter([latents(1), latents(1, width=4)]), lambda chunk: None)


def test_is_a_chunked_decoder(decoder: HunyuanVideo15Decoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == (
        "hunyuan-video-1.5",
        4,
        (-1.0, 1.0),
    )
    assert (decoder.chunking.spatial_scale, decoder.chunking.temporal_scale) == (4, 4)


def test_the_diffusers_internals_we_drive_still_exist(vae: AutoencoderKLHunyuanVideo15) -> None:
    """Fails loudly on a diffusers upgrade that moves the pieces the pass repeats."""
    HunyuanVideo15Decoder.check_internals(vae)
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (
        HunyuanVideo15AttnBlock,
        HunyuanVideo15CausalConv3d,
    )

    assert callable(HunyuanVideo15AttnBlock.prepare_causal_attention_mask)
    convs = [m for m in vae.decoder.modules() if isinstance(m, HunyuanVideo15CausalConv3d)]
    assert convs and {m.pad_mode for m in convs} == {"replicate"}
    assert {tuple(m.time_causal_padding) for m in convs} == {(1, 1, 1, 1, 2, 0)}


def test_our_mask_is_diffusers_causal_mask_row_for_row() -> None:
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (
        HunyuanVideo15AttnBlock,
    )

    from vaecast.models.hunyuan15_stream import _causal_mask

    full = HunyuanVideo15AttnBlock.prepare_causal_attention_mask(5, 6, torch.float32, "cpu", 1)
    for past, frames in ((0, 5), (2, 1), (3, 2)):
        rows = full[:, past * 6 : (past + frames) * 6, : (past + frames) * 6]
        ours = _causal_mask(past, frames, 6, torch.float32, torch.device("cpu"), 1)
        assert torch.equal(ours, rows)


def test_missing_internals_fail_at_load(vae: AutoencoderKLHunyuanVideo15) -> None:
    import diffusers

    stale = SimpleNamespace(config={"latent_channels": 4}, decoder=vae.decoder)
    with pytest.raises(WeightsError) as error:
        HunyuanVideo15Decoder.check_internals(stale)
    assert str(error.value) == (
        f"diffusers {diffusers.__version__}'s AutoencoderKLHunyuanVideo15 no longer has "
        "use_tiling, tile_latent_min_height, tile_latent_min_width, tile_sample_min_height, "
        "tile_sample_min_width, tile_overlap_factor, blend_v, blend_h, tiled_decode, "
        "enable_tiling, spatial_compression_ratio, temporal_compression_ratio, "
        "config.scaling_factor, which vaecast's hunyuan-video-1.5 decoder relies on; "
        "install diffusers>=0.36,<0.43"
    )


def test_a_decoder_with_a_layer_the_pass_does_not_know_is_refused() -> None:
    """A norm over time added to a block would break causality: refused, not skipped."""
    vae = random_vae(2)
    vae.decoder.mid_block.resnets[0].norm3 = torch.nn.GroupNorm(2, 16)
    with pytest.raises(WeightsError, match=r"decoder\.mid_block\.resnets\.0 "):
        HunyuanVideo15Decoder(vae)
    vae = random_vae(2)
    vae.decoder.up_blocks[0].upsamplers[0].conv.time_causal_padding = (1, 1, 1, 1, 1, 1)
    with pytest.raises(WeightsError, match=r"padded \(1, 1, 1, 1, 1, 1\) in front"):
        HunyuanVideo15Decoder(vae)
    vae = random_vae(2)
    vae.decoder.mid_block.attentions[0].to_q = torch.nn.Conv3d(16, 16, (3, 1, 1))
    with pytest.raises(WeightsError, match=r"attentions\.0\.to_q \(a Conv3d over 3 frames\)"):
        HunyuanVideo15Decoder(vae)
    vae = random_vae(2)
    attention = vae.decoder.mid_block.attentions[0]
    attention.prepare_causal_attention_mask = lambda frames, tokens, dtype, device, **_: (
        torch.zeros(frames * tokens, frames * tokens, dtype=dtype, device=device)
    )
    with pytest.raises(WeightsError, match=r"attentions\.0\.prepare_causal_attention_mask"):
        HunyuanVideo15Decoder(vae)


def test_one_decode_per_vae_at_a_time(
    vae: AutoencoderKLHunyuanVideo15, decoder: HunyuanVideo15Decoder
) -> None:
    """A second decode on the same VAE (even through another wrapper) waits for the first."""
    other = HunyuanVideo15Decoder(vae)
    first_holding, release = threading.Event(), threading.Event()
    events: list[str] = []

    def first() -> None:
        def hold(chunk: DecodedChunk) -> None:
            events.append(f"first {chunk.index}")
            if chunk.index == 0:
                first_holding.set()
                assert release.wait(WAIT_S)

        decoder.decode_chunks(latents(2), hold)

    one = threading.Thread(target=first)
    one.start()
    assert first_holding.wait(WAIT_S)
    two = threading.Thread(
        target=lambda: other.decode_chunks(latents(1), lambda chunk: events.append("second"))
    )
    two.start()
    two.join(0.3)
    assert two.is_alive() and events == ["first 0"]
    release.set()
    one.join(WAIT_S)
    two.join(WAIT_S)
    assert events == ["first 0", "first 1", "second"]


def test_a_callback_error_leaves_the_vae_usable(
    vae: AutoencoderKLHunyuanVideo15, decoder: HunyuanVideo15Decoder
) -> None:
    def fail(chunk: DecodedChunk) -> None:
        raise RuntimeError("cancelled")

    z = latents(3)
    before = decoder.decode(z)
    with pytest.raises(RuntimeError, match="cancelled"):
        decoder.decode_chunks(z, fail)
    assert torch.equal(decoder.decode(z), before)


def test_vaecast_imports_without_diffusers(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (vaecast.models.hunyuan15, vaecast.models.hunyuan15_stream):
        tree = ast.parse(Path(module.__file__).read_text())
        modules = [
            alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names
        ]
        modules += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert "torch" in modules  # the scan sees the imports
        assert not [m for m in modules if str(m).split(".")[0] == "diffusers"], module.__name__
    monkeypatch.setitem(sys.modules, "diffusers", None)  # what an absent package looks like
    with pytest.raises(WeightsError) as error:
        HunyuanVideo15Decoder.from_weights("x")
    assert str(error.value) == (
        "the hunyuan-video-1.5 decoder needs diffusers>=0.36,<0.43: pip install 'vaecast[real]'"
    )


def test_blocks_of_latents_are_the_pipelines_decode_too(vae: AutoencoderKLHunyuanVideo15) -> None:
    """By default latent 0 is a chunk of its own, then blocks of 4 latent frames, each one
    step of the causal pass (its attention masked within the block): the same frames, in
    any split of a stream."""
    decoder = HunyuanVideo15Decoder(vae)
    z = latents(10, 2, 3, seed=10)
    chunks = collect(decoder, z)
    assert [c.frame_count for c in chunks] == [1, 16, 16, 4]
    assert decoder.plan(z.shape).chunk_frames == (1, 16, 16, 4)
    whole = torch.cat([c.frames for c in chunks], dim=2)
    assert torch.allclose(whole, pipeline_decode(vae, z), rtol=0, atol=ATOL)
    assert torch.equal(stream(decoder, z, [3, 1, 6]), whole)
    plan = decoder.plan_stream(z[:, :, :1].shape)
    assert (plan.first_chunk_frames, plan.chunk_frames) == (1, 16)
