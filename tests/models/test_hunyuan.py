"""The `hunyuan-video` decoder: chunks bit-identical to `HunyuanVideoPipeline`'s decode (the
VAE's temporal tiling, spatial tiling included), the real pipeline's frames from its latents,
streams of any split, loading without the hub, and the diffusers internals it drives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo

from tests.helpers import one_torch_thread
from tests.helpers.tiny_pipelines import run_case
from tests.helpers.tiny_pipelines.hunyuan import CASES
from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.hunyuan import HunyuanVideoDecoder
from vaecast.models.layouts import BCTHW, layout_of
from vaecast.models.registry import diffusers_model, get_decoder
from vaecast.models.weights_io import WeightsError

CHANNELS = 4
# diffusers' own tiny HunyuanVideo VAE test configuration.
TINY_CONFIG: dict[str, Any] = {
    "latent_channels": CHANNELS,
    "block_out_channels": (8, 8, 8, 8),
    "layers_per_block": 1,
    "norm_num_groups": 4,
}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def random_vae(seed: int = 0) -> AutoencoderKLHunyuanVideo:
    torch.manual_seed(seed)
    return AutoencoderKLHunyuanVideo(**TINY_CONFIG).eval()


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLHunyuanVideo:
    return random_vae()


@pytest.fixture(scope="module")
def decoder(vae: AutoencoderKLHunyuanVideo) -> HunyuanVideoDecoder:
    return HunyuanVideoDecoder(vae)


def latents(frames: int, height: int = 2, width: int = 3, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, CHANNELS, frames, height, width, generator=generator)


def pipeline_decode(vae: AutoencoderKLHunyuanVideo, latents: torch.Tensor) -> torch.Tensor:
    """What `HunyuanVideoPipeline` does with its final latents (pipeline_hunyuan_video.py)."""
    latents = latents.to(vae.dtype) / vae.config.scaling_factor
    with torch.no_grad():
        return vae.decode(latents, return_dict=False)[0]


def collect(decoder: HunyuanVideoDecoder, z: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))
    )
    return chunks


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [
        (1, (1,)),
        (4, (13,)),  # the longest one plain decode takes
        (5, (13, 4)),  # two tiles
        (8, (13, 12, 4)),
        (13, (13, 12, 12, 12)),  # the last tile (one latent) keeps nothing and is skipped
    ],
)
def test_chunks_are_the_pipelines_decode_bit_for_bit(
    vae: AutoencoderKLHunyuanVideo,
    decoder: HunyuanVideoDecoder,
    frames: int,
    chunk_frames: tuple[int, ...],
) -> None:
    z = latents(frames, seed=frames)
    chunks = collect(decoder, z)
    expected = pipeline_decode(vae, z)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), expected)
    plan = decoder.plan(z.shape)
    assert (plan.chunk_frames, plan.height, plan.width) == (chunk_frames, 16, 24)
    assert tuple(c.frame_count for c in chunks) == chunk_frames
    assert [c.index for c in chunks] == list(range(len(chunk_frames)))
    assert {c.total for c in chunks} == {len(chunk_frames)}
    assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    assert expected.shape[2] == (frames - 1) * 4 + 1 and expected.std() > 0.01


@pytest.mark.parametrize(
    "sizes", [[1] * 8, [5, 3], [2, 2, 2, 2], [7, 1], [8]], ids=["1s", "5+3", "2s", "7+1", "8"]
)
def test_streams_of_any_split_are_the_whole_decode(
    vae: AutoencoderKLHunyuanVideo, decoder: HunyuanVideoDecoder, sizes: list[int]
) -> None:
    z = latents(8, seed=3)
    chunks: list[DecodedChunk] = []
    plan = decoder.decode_stream(list(z.split(sizes, dim=2)), chunks.append)
    assert plan == decoder.plan(z.shape)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), pipeline_decode(vae, z))
    assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
    stream_plan = decoder.plan_stream(z[:, :, :1].shape)
    assert (stream_plan.first_chunk_frames, stream_plan.chunk_frames) == (13, 12)
    assert stream_plan.frames_for(8) == plan.frames == 29


def test_a_tile_is_published_as_soon_as_its_latents_arrive(decoder: HunyuanVideoDecoder) -> None:
    """Tile 0 needs latents 0..4: its chunk is out before latent 5 is asked for."""
    published: list[int] = []
    asked: list[int] = []

    def blocks() -> Iterator[torch.Tensor]:
        for frame in latents(8).split(1, dim=2):
            asked.append(len(published))
            yield frame

    decoder.decode_stream(blocks(), lambda chunk: published.append(chunk.index))
    assert asked == [0, 0, 0, 0, 0, 1, 1, 1]  # tile 1 needs latents 3..7, all there is
    assert published == [0, 1, 2]


def test_spatial_tiling_is_the_models_own() -> None:
    """With spatial tiles smaller than the frame, each temporal tile is decoded tiled."""
    vae = random_vae(1)
    z = latents(6, height=5, width=6, seed=2)
    untiled = pipeline_decode(vae, z)
    vae.enable_tiling(
        tile_sample_min_height=24,
        tile_sample_min_width=24,
        tile_sample_stride_height=16,
        tile_sample_stride_width=16,
    )
    decoded = HunyuanVideoDecoder(vae).decode(z)
    assert decoded.shape == (1, 3, 21, 40, 48)
    assert torch.equal(decoded, pipeline_decode(vae, z))
    assert not torch.equal(decoded, untiled)  # the tiles really were there


def test_the_pipelines_frames_from_its_own_latents() -> None:
    """A real `HunyuanVideoPipeline` of tiny random parts: its np frames, from its latents."""
    case = CASES[0]
    run = run_case(case)
    decoder = HunyuanVideoDecoder(run.pipeline.vae)
    z = layout_of(decoder).bind(case.params).to_bcthw(run.latents)
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), 0, 0, 0)))
    assert [c.frame_count for c in chunks] == [13, 12, 4]
    video = torch.cat([c.frames for c in chunks], dim=2)
    frames = run.pipeline.video_processor.postprocess_video(video, output_type="np")[0]
    assert frames.shape == run.frames.shape == (29, 16, 16, 3)
    np.testing.assert_array_equal(frames, run.frames)  # exact: the same decode, tile by tile


def test_is_a_chunked_decoder(decoder: HunyuanVideoDecoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == (
        "hunyuan-video",
        CHANNELS,
        (-1, 1),
    )
    assert layout_of(decoder) is BCTHW
    assert (decoder.chunking.spatial_scale, decoder.chunking.tiles.temporal_scale) == (8, 4)


def test_bad_latents_are_refused(decoder: HunyuanVideoDecoder) -> None:
    with pytest.raises(InvalidRequestError, match="this model takes 4 latent channels, got 16"):
        decoder.plan((1, 16, 5, 2, 2))
    with pytest.raises(InvalidRequestError, match="at least 1 frame"):
        decoder.plan((1, CHANNELS, 0, 2, 2))
    with pytest.raises(InvalidRequestError, match="does not continue the stream"):
        decoder.decode_stream([latents(2), latents(2, height=3)], lambda chunk: None)


def test_the_diffusers_internals_we_drive_still_exist(vae: AutoencoderKLHunyuanVideo) -> None:
    HunyuanVideoDecoder.check_internals(vae)
    assert vae.use_framewise_decoding  # HunyuanVideo's decode is its temporal tiling
    assert (vae.tile_sample_min_num_frames, vae.tile_sample_stride_num_frames) == (16, 12)


def test_missing_or_changed_internals_fail_at_load(vae: AutoencoderKLHunyuanVideo) -> None:
    import diffusers

    stale = SimpleNamespace(config={"latent_channels": 4}, decoder=None)
    with pytest.raises(WeightsError) as error:
        HunyuanVideoDecoder.check_internals(stale)
    assert str(error.value).startswith(
        f"diffusers {diffusers.__version__}'s AutoencoderKLHunyuanVideo no longer has "
        "_temporal_tiled_decode, tiled_decode, blend_t, use_tiling, "
    )
    assert "temporal_compression_ratio, post_quant_conv, config.scaling_factor" in str(error.value)
    assert str(error.value).endswith(
        "config.scaling_factor, which vaecast's hunyuan-video decoder relies on; "
        "install diffusers>=0.42,<0.43"
    )

    class DropsLast(AutoencoderKLHunyuanVideo):
        def _temporal_tiled_decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
            decoded = z
            decoded = decoded[:, :, :-1, :, :]
            return decoded

    torch.manual_seed(0)
    with pytest.raises(WeightsError, match=r"`decoded = decoded\[:, :, 1:, :, :\]` in _temporal"):
        HunyuanVideoDecoder(DropsLast(**TINY_CONFIG))


def test_a_vae_set_to_the_whole_clip_is_decoded_whole_and_left_so() -> None:
    """`vae.decode` is the decode the chunks concatenate to, however the user set it."""
    vae = random_vae(2)
    vae.use_framewise_decoding = False
    decoder = HunyuanVideoDecoder(vae)
    assert not vae.use_framewise_decoding
    z = latents(6, seed=6)
    chunks = collect(decoder, z)
    assert [c.frame_count for c in chunks] == [9, 12]
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), pipeline_decode(vae, z))


@pytest.mark.parametrize("layout", ["vae folder", "pipeline folder"])
def test_loads_from_a_local_diffusers_folder(tmp_path: Path, layout: str) -> None:
    if layout == "pipeline folder":
        pipeline = CASES[0].build()
        pipeline.save_pretrained(tmp_path)
        vae = pipeline.vae
    else:
        vae = random_vae(3)
        vae.save_pretrained(tmp_path)
    assert diffusers_model(tmp_path) == "hunyuan-video"
    loaded = get_decoder("hunyuan-video", device="cpu", weights=tmp_path)
    assert isinstance(loaded, HunyuanVideoDecoder)
    z = latents(5)
    decoded = loaded.decode(z)
    assert torch.equal(decoded, pipeline_decode(loaded.vae, z))
    # The same weights, but read into unaligned (memory-mapped) storage, where a kernel
    # may round differently.
    torch.testing.assert_close(decoded, pipeline_decode(vae, z), rtol=0, atol=1e-5)


def test_weights_must_be_a_local_folder(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="the hunyuan-video decoder needs --weights"):
        HunyuanVideoDecoder.from_weights(None)
    with pytest.raises(WeightsError, match="is not a folder"):
        HunyuanVideoDecoder.from_weights(tmp_path / "vae.safetensors")
    with pytest.raises(WeightsError, match=r"has neither config\.json nor vae/config\.json"):
        HunyuanVideoDecoder.from_weights(tmp_path)


def test_decodes_may_share_a_vae(
    vae: AutoencoderKLHunyuanVideo, decoder: HunyuanVideoDecoder
) -> None:
    """No state on the module: two streams interleaved tile by tile both come out right."""
    first_waiting, second_done = threading.Event(), threading.Event()
    results: dict[str, torch.Tensor] = {}
    z1, z2 = latents(8, seed=10), latents(8, seed=11)

    def first_blocks() -> Iterator[torch.Tensor]:
        yield z1[:, :, :5]
        first_waiting.set()
        assert second_done.wait(30)
        yield z1[:, :, 5:]

    def run(name: str, blocks: Any) -> None:
        chunks: list[torch.Tensor] = []
        HunyuanVideoDecoder(vae).decode_stream(blocks, lambda c: chunks.append(c.frames.clone()))
        results[name] = torch.cat(chunks, dim=2)

    one = threading.Thread(target=run, args=("first", first_blocks()))
    one.start()
    assert first_waiting.wait(30)
    run("second", [z2])  # runs to the end while the first stream is between tiles
    second_done.set()
    one.join(30)
    assert torch.equal(results["first"], pipeline_decode(vae, z1))
    assert torch.equal(results["second"], pipeline_decode(vae, z2))
