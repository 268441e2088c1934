"""The `ltx-video` and `ltx-2` decoders: chunks equal to their pipelines' default
(whole-clip) decode with nothing changed on the VAE, streamed layer by layer (each chunk
once the latents it depends on are in, each frame of each layer computed once), exact
windows where asked for or where the layer-by-layer stream is not shown to be the
decoder's forward, the reach derived from the architecture against a perturbed latent's,
the real pipelines' frames from their own latents, streams of any split, the VAE's
temporal tiles where it is set to them (and their PSNR against the whole clip), timestep
conditioning and noise injection, loading without the hub, and the diffusers internals
they drive."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLLTX2Video, AutoencoderKLLTXVideo, LTXPipeline

from tests.helpers import one_torch_thread
from tests.helpers.tiny_pipelines import run_case
from tests.helpers.tiny_pipelines.ltx import CASES, LTX2_CHANNELS, LTX_CHANNELS, ltx2_vae, ltx_vae
from vaecast.errors import InvalidRequestError
from vaecast.models import ltx_wavefront
from vaecast.models.base import ChunkedDecoder, DecodedChunk, DecodePlan
from vaecast.models.layouts import BCTHW, PackedTokens, layout_of
from vaecast.models.ltx import LTX2VideoDecoder, LTXVideoDecoder
from vaecast.models.ltx_reach import Reach, temporal_reach, temporal_scale
from vaecast.models.margin_windows import MarginChunking
from vaecast.models.registry import diffusers_model, get_decoder
from vaecast.models.wavefront import WavefrontChunking
from vaecast.models.weights_io import WeightsError

Decoder = LTXVideoDecoder | LTX2VideoDecoder
MODELS = ["ltx-video", "ltx-2"]
DECODERS: dict[str, type[Decoder]] = {"ltx-video": LTXVideoDecoder, "ltx-2": LTX2VideoDecoder}
VAES: dict[str, Callable[[], Any]] = {"ltx-video": ltx_vae, "ltx-2": ltx2_vae}
CHANNELS = {"ltx-video": LTX_CHANNELS, "ltx-2": LTX2_CHANNELS}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def vae(model: str) -> Any:
    return VAES[model]().eval()


@pytest.fixture(scope="module")
def decoder(model: str, vae: Any) -> Decoder:
    return DECODERS[model](vae)


def latents(
    model: str, frames: int, height: int = 2, width: int = 3, seed: int = 0
) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, CHANNELS[model], frames, height, width, generator=generator)


def pipeline_decode(vae: Any, latents: torch.Tensor, decode_timestep: float = 0.0) -> torch.Tensor:
    """The pipeline's decode step from BCTHW latents as it returns them (pipeline_ltx.py after
    `_unpack_latents`; pipeline_ltx2.py after its denormalization), at `decode_timestep`."""
    if isinstance(vae, AutoencoderKLLTXVideo):
        latents = LTXPipeline._denormalize_latents(
            latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
    timestep = None
    if vae.config.timestep_conditioning:
        noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(5))
        timestep = torch.tensor([decode_timestep], dtype=latents.dtype)
        scale = torch.tensor([decode_timestep], dtype=latents.dtype)[:, None, None, None, None]
        latents = (1 - scale) * latents + scale * noise
    with torch.no_grad():
        return vae.decode(latents.to(vae.dtype), timestep, return_dict=False)[0]


def collect(decoder: Decoder, z: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))
    )
    return chunks


def stream_in_blocks(
    decoder: Decoder, z: torch.Tensor, sizes: list[int]
) -> tuple[DecodePlan, torch.Tensor, list[int]]:
    """`z` streamed in blocks of `sizes`: the plan, the frames, and for each chunk how many
    latent frames had arrived when it was published."""
    frames: list[torch.Tensor] = []
    published_at: list[int] = []
    received = 0

    def blocks() -> Iterator[torch.Tensor]:
        nonlocal received
        for block in z.split(sizes, dim=2):
            received += block.shape[2]
            yield block

    def on_chunk(chunk: DecodedChunk) -> None:
        frames.append(chunk.frames.clone())
        published_at.append(received)

    plan = decoder.decode_stream(blocks(), on_chunk)
    return plan, torch.cat(frames, dim=2), published_at


def same_as_pipeline(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Within float rounding of the pipeline's whole-clip decode: the layer-by-layer
    stream runs every conv through oneDNN (the whole decode's kernel for every conv of a
    real-sized clip, not for the tests' tiny ones) and its elementwise ops over pieces."""
    return ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=0, atol=1e-5)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Over the [-1, 1] range (peak to peak 2)."""
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(4 / mse)


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [
        (1, (1,)),
        (2, (9,)),
        (3, (17,)),  # chunks of 3 latents: 17 frames, then 24
        (4, (17, 8)),
        (7, (17, 24, 8)),
    ],
)
def test_chunks_are_the_pipelines_default_decode(
    model: str, vae: Any, decoder: Decoder, frames: int, chunk_frames: tuple[int, ...]
) -> None:
    """As `from_pretrained` leaves the VAE (`use_framewise_decoding` off, and left so): its
    decode is the whole clip's, streamed layer by layer."""
    z = latents(model, frames, seed=frames)
    chunks = collect(decoder, z)
    assert not vae.use_framewise_decoding
    assert isinstance(decoder.chunking, WavefrontChunking)
    expected = pipeline_decode(vae, z)
    assert same_as_pipeline(torch.cat([c.frames for c in chunks], dim=2), expected)
    plan = decoder.plan(z.shape)
    assert (plan.chunk_frames, plan.height, plan.width) == (chunk_frames, 16, 24)
    assert tuple(c.frame_count for c in chunks) == chunk_frames
    assert [c.index for c in chunks] == list(range(len(chunk_frames)))
    assert {c.total for c in chunks} == {len(chunk_frames)}
    assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    assert expected.shape[2] == (frames - 1) * 8 + 1 and expected.std() > 0.01


@pytest.mark.parametrize(
    "sizes", [[1] * 24, [5, 19], [13, 11], [24]], ids=["1s", "5+19", "13+11", "whole"]
)
def test_windows_are_the_whole_clips_decode(model: str, vae: Any, sizes: list[int]) -> None:
    """Windows committing 3 latents, the reach (10 or 8 latents) each side: the frames are the
    whole clip's within float rounding, every split of a stream gives the same chunks, and
    each window is decoded once the latents its commit needs have arrived."""
    decoder = DECODERS[model](vae, window_latents=3)
    reach = decoder.chunking.windows.reach
    assert reach == {"ltx-video": Reach(10, 10), "ltx-2": Reach(8, 8)}[model]
    z = latents(model, 24, seed=24)
    plan, streamed, published_at = stream_in_blocks(decoder, z, sizes)
    assert plan == decoder.plan(z.shape) and plan.chunk_frames == (17,) + (24,) * 7
    assert torch.equal(streamed, decoder.decode(z))  # a stream's windows are the whole's
    torch.testing.assert_close(streamed, pipeline_decode(vae, z), rtol=0, atol=1e-5)
    # Chunk i (latents 3i..3i+3) needs latents up to 3i + 3 + after; the rest wait for the end.
    needed = [min(3 * i + 3 + reach.after, 24) for i in range(plan.chunks)]
    ends = np.cumsum(sizes)
    assert published_at == [next(int(n) for n in ends if n >= k) for k in needed]


@pytest.mark.parametrize(
    "sizes", [[1] * 24, [5, 19], [13, 11], [24]], ids=["1s", "5+19", "13+11", "whole"]
)
def test_layer_by_layer_chunks_come_once_the_latents_they_read_are_in(
    model: str, vae: Any, decoder: Decoder, sizes: list[int]
) -> None:
    """The default stream: every split gives the whole clip's frames within float rounding,
    and no chunk waits for latents beyond the decoder's reach, nor later than the windows'
    stream would publish it (which needs the reach on both sides of a whole window)."""
    z = latents(model, 24, seed=24)
    plan, streamed, published_at = stream_in_blocks(decoder, z, sizes)
    assert plan == decoder.plan(z.shape) and plan.chunk_frames == (17,) + (24,) * 7
    assert same_as_pipeline(streamed, pipeline_decode(vae, z))
    assert same_as_pipeline(streamed, decoder.decode(z))
    reach = temporal_reach(vae.decoder)
    assert isinstance(reach, Reach)
    ends = [int(n) for n in np.cumsum(sizes)]
    needed = [min(3 * i + 3 + reach.after, 24) for i in range(plan.chunks)]
    latest = [next(n for n in ends if n >= k) for k in needed]
    assert published_at == sorted(published_at)
    assert all(at <= then for at, then in zip(published_at, latest, strict=True))
    _, _, windows_at = stream_in_blocks(DECODERS[model](vae, window_latents=3), z, sizes)
    assert all(at <= then for at, then in zip(published_at, windows_at, strict=True))
    if sizes == [1] * 24:  # the first chunk long before the clip ends
        assert published_at[0] < 24 and published_at[:3] != windows_at[:3]


def test_each_frame_of_each_conv_is_computed_once(
    model: str, vae: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layer by layer, each conv outputs the frames the whole forward's does, once: the
    stream's work is the whole decode's, however the latents arrive."""
    computed: dict[str, int] = {}
    names = {module: name for name, module in vae.decoder.named_modules()}
    real_conv3d = ltx_wavefront.conv3d

    def counting(module: torch.nn.Conv3d) -> Callable[[torch.Tensor], torch.Tensor]:
        forward = real_conv3d(module)

        def count(frames: torch.Tensor) -> torch.Tensor:
            out = forward(frames)
            computed[names[module]] = computed.get(names[module], 0) + out.shape[2]
            return out

        return count

    monkeypatch.setattr(ltx_wavefront, "conv3d", counting)
    decoder = DECODERS[model](vae)
    z = latents(model, 9, seed=9)
    computed.clear()  # the load's own check
    stream_in_blocks(decoder, z, [1, 3, 5])
    whole: dict[str, int] = {}
    hooks = [
        module.register_forward_hook(
            lambda _, __, out, name=name: whole.__setitem__(name, out.shape[2])
        )
        for name, module in vae.decoder.named_modules()
        if isinstance(module, torch.nn.Conv3d)
    ]
    try:
        pipeline_decode(vae, z)
    finally:
        for hook in hooks:
            hook.remove()
    assert computed == whole and len(whole) > 10


def test_a_stream_not_shown_to_be_the_forward_keeps_the_windows(
    model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The load's check: where the layers, streamed, are not the decoder's forward (here a
    resnet whose forward was replaced), the stream is the windows', with one log line."""
    vae = VAES[model]().eval()
    resnet = vae.decoder.mid_block.resnets[0]
    forward = resnet.forward
    resnet.forward = lambda *args, **kwargs: forward(*args, **kwargs) * 1.5
    decoder = DECODERS[model](vae)
    assert isinstance(decoder.chunking, MarginChunking)
    lines = [r.getMessage() for r in caplog.records if "not layer by layer" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{model}: streaming in exact windows, not layer by layer: ")
    assert "from its forward's (bound" in lines[0]
    z = latents(model, 4, seed=4)
    assert torch.equal(decoder.decode(z), pipeline_decode(vae, z))  # one window: bit for bit


def test_layers_that_cannot_be_streamed_keep_the_windows(
    model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A decoder whose modules are not as the stream re-states them (here an upsampler
    without its `residual` attribute) is streamed in windows, with one log line."""
    vae = VAES[model]().eval()
    del next(b for b in vae.decoder.up_blocks if b.upsamplers).upsamplers[0].residual
    decoder = DECODERS[model](vae)
    assert isinstance(decoder.chunking, MarginChunking)
    assert f"{model}: streaming in exact windows, not layer by layer: its layers could not be " in (
        caplog.text
    )
    assert "AttributeError" in caplog.text


def tiled_vae(model: str) -> Any:
    """A VAE set to its temporal tiles, as a user sets it for a pipeline."""
    vae = VAES[model]().eval()
    vae.use_framewise_decoding = True
    return vae


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [
        (1, (1,)),
        (2, (9,)),  # the longest one plain decode takes
        (3, (9, 8)),  # tiles of 3 latents every 1: two tiles
        (4, (9, 8, 8)),
        (7, (9, 8, 8, 8, 8, 8)),  # the last tile (one latent) keeps nothing and is skipped
    ],
)
def test_a_vae_set_to_temporal_tiles_streams_them_bit_for_bit(
    model: str, frames: int, chunk_frames: tuple[int, ...]
) -> None:
    vae = tiled_vae(model)
    decoder = DECODERS[model](vae)
    z = latents(model, frames, seed=frames)
    chunks = collect(decoder, z)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), pipeline_decode(vae, z))
    assert tuple(c.frame_count for c in chunks) == chunk_frames
    assert decoder.plan(z.shape).chunk_frames == chunk_frames
    # Asked for by name, of a VAE left at the whole clip: the same tiles, nothing changed.
    untouched = VAES[model]().eval()
    asked = DECODERS[model](untouched, temporal_tiling=True)
    assert torch.equal(asked.decode(z), decoder.decode(z))
    assert not untouched.use_framewise_decoding


@pytest.mark.parametrize(
    "sizes", [[1] * 5, [3, 2], [4, 1], [1, 4]], ids=["1s", "3+2", "4+1", "1+4"]
)
def test_temporal_tiles_stream_each_tile_once_its_latents_are_in(
    model: str, sizes: list[int]
) -> None:
    vae = tiled_vae(model)
    decoder = DECODERS[model](vae)
    z = latents(model, 5, seed=3)
    plan, streamed, published_at = stream_in_blocks(decoder, z, sizes)
    assert plan == decoder.plan(z.shape)
    assert torch.equal(streamed, pipeline_decode(vae, z))
    # Tile i needs latents [i, i + 3): out as soon as a block brings the last of them.
    needed = [min(index + 3, 5) for index in range(plan.chunks)]
    assert published_at == [next(n for n in np.cumsum(sizes) if n >= k) for k in needed]
    stream_plan = decoder.plan_stream(z[:, :, :1].shape)
    assert (stream_plan.first_chunk_frames, stream_plan.chunk_frames) == (9, 8)
    assert stream_plan.frames_for(5) == plan.frames == 33


def test_temporal_tiling_against_the_whole_clip_decode(model: str, decoder: Decoder) -> None:
    """The PSNR the module docstring states for the tiles, against the pipelines' default."""
    tiles = DECODERS[model](VAES[model]().eval(), temporal_tiling=True)
    measured = []
    for frames in (4, 7, 13):
        z = latents(model, frames, height=4, width=4, seed=frames)
        measured.append(psnr(tiles.decode(z), decoder.decode(z)))
    low, high = {"ltx-video": (17.0, 19.5), "ltx-2": (15.5, 17.5)}[model]
    assert all(low < value < high for value in measured), measured
    z = latents(model, 2, seed=2)  # one plain decode: no tiling at all
    assert torch.equal(tiles.decode(z), pipeline_decode(VAES[model]().eval(), z))
    assert same_as_pipeline(tiles.decode(z), decoder.decode(z))


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"decoder_layers_per_block": (2, 1, 2, 1, 1)},
        {"decoder_spatio_temporal_scaling": (True, False, True, False)},
        {"decoder_causal": True},
    ],
    ids=["tests'", "deeper", "two upsamplers", "causal"],
)
def test_the_reach_bounds_a_perturbed_latents_reach(model: str, config: dict[str, Any]) -> None:
    """The reach derived from the architecture against the frames one latent really
    changes: never less, and at most two latents more (the alignment slack)."""
    if model == "ltx-2" and "decoder_spatio_temporal_scaling" in config:
        config = {"decoder_spatio_temporal_scaling": (True, False, True)}
    vae = (ltx_vae(**config) if model == "ltx-video" else _ltx2_vae(**config)).eval()
    reach = temporal_reach(vae.decoder)
    assert isinstance(reach, Reach), reach
    scale = temporal_scale(vae.decoder)  # the decoder's own, whatever the encoder's
    z = latents(model, 40, height=2, width=2, seed=1)
    temb = torch.tensor([0.0]) if vae.config.timestep_conditioning else None
    arguments = (temb,) if model == "ltx-video" else (temb, None)
    with torch.no_grad():
        base = vae.decoder(z, *arguments)
        nudged = z.clone()
        nudged[:, :, 20] += 1.0
        changed = (vae.decoder(nudged, *arguments) - base).abs().amax(dim=(0, 1, 3, 4)) > 0
    frames = torch.nonzero(changed).flatten()
    first, last = -(-int(frames[0]) // scale), -(-int(frames[-1]) // scale)  # their latents
    # A frame reads `before` latents back: so latent 20 reaches that far forward.
    assert last - 20 <= reach.before <= last - 20 + 2, (last, reach)
    assert 20 - first <= reach.after <= 20 - first + 2, (first, reach)


def _ltx2_vae(**overrides: Any) -> AutoencoderKLLTX2Video:
    vae = ltx2_vae()
    config = dict(vae.config) | overrides
    torch.manual_seed(0)
    return AutoencoderKLLTX2Video.from_config(config)


def test_a_decoder_whose_reach_is_not_shown_is_decoded_whole(
    model: str, caplog: pytest.LogCaptureFixture
) -> None:
    vae = VAES[model]().eval()
    vae.decoder.conv_act = torch.nn.GELU()  # a kind of module the walk does not know
    decoder = DECODERS[model](vae, window_latents=3)
    assert decoder.chunking.windows.reach is None
    assert f"{model}: decoding each clip whole before streaming it" in caplog.text
    assert "decoder.conv_act (GELU, whose reach over time is not known)" in caplog.text
    z = latents(model, 20, seed=20)
    _, streamed, published_at = stream_in_blocks(decoder, z, [1] * 20)
    assert set(published_at) == {20}  # all at the end: one decode of the whole clip
    assert torch.equal(streamed, pipeline_decode(vae, z))


def test_spatial_tiling_is_the_models_own(model: str) -> None:
    """With spatial tiles smaller than the frame, each temporal tile is decoded tiled."""
    vae = VAES[model]().eval()
    decoder = DECODERS[model](vae)
    # Tiles of 3x3 latents every 2, none narrower than 2 (LTX-2 pads them by reflection).
    z = latents(model, 4, height=4, width=6, seed=2)
    untiled = pipeline_decode(vae, z)
    vae.enable_tiling(
        tile_sample_min_height=24,
        tile_sample_min_width=24,
        tile_sample_stride_height=16,
        tile_sample_stride_width=16,
    )
    decoded = decoder.decode(z)
    assert decoded.shape == (1, 3, 25, 32, 48)
    assert torch.equal(decoded, pipeline_decode(vae, z))
    assert not torch.equal(decoded, untiled)  # the tiles really were there


@pytest.mark.parametrize("case", CASES, ids=[case.model for case in CASES])
def test_the_pipelines_frames_from_its_own_latents(case: Any) -> None:
    """Real `LTXPipeline` and `LTX2Pipeline`s of tiny random parts: their np frames, from the
    latents they return (packed tokens for LTX-Video, BCTHW for LTX-2)."""
    run = run_case(case)
    decoder = DECODERS[case.model](run.pipeline.vae)
    assert run.latents.ndim == (3 if case.model == "ltx-video" else 5)
    z = layout_of(decoder).bind(case.params).to_bcthw(run.latents)
    chunks: list[torch.Tensor] = []
    decoder.decode_chunks(z, lambda c: chunks.append(c.frames.clone()))
    assert [c.shape[2] for c in chunks] == [17, 8]
    video = torch.cat(chunks, dim=2)
    frames = run.pipeline.video_processor.postprocess_video(video, output_type="np")[0]
    assert frames.shape == run.frames.shape == (25, 32, 32, 3)
    # The same whole-clip decode, within float rounding.
    np.testing.assert_allclose(frames, run.frames, rtol=0, atol=1e-5)


def test_ltx_video_latents_are_packed_tokens() -> None:
    decoder = LTXVideoDecoder(ltx_vae())
    assert decoder.latent_layout == PackedTokens(spatial_scale=8, temporal_scale=8)
    packed = torch.randn(1, 4 * 2 * 3, LTX_CHANNELS)
    bound = layout_of(decoder).bind({"num_frames": "25", "height": "16", "width": "24"})
    unpacked = LTXPipeline._unpack_latents(packed, 4, 2, 3, 1, 1)
    assert torch.equal(bound.to_bcthw(packed), unpacked)
    assert layout_of(LTX2VideoDecoder(ltx2_vae())) is BCTHW


def test_a_decode_timestep_conditions_the_decoder() -> None:
    """At the pipelines' default 0 it is their decode; at another, the VAE's decode at that
    timestep, without the pipeline's random noise."""
    vae = ltx_vae().eval()
    z = latents("ltx-video", 4, seed=4)
    at_zero = LTXVideoDecoder(vae).decode(z)
    assert same_as_pipeline(at_zero, pipeline_decode(vae, z, decode_timestep=0.0))
    later = LTXVideoDecoder(vae, decode_timestep=0.05).decode(z)
    denormalized = LTXPipeline._denormalize_latents(
        z, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
    )
    with torch.no_grad():
        expected = vae.decode(denormalized, torch.tensor([0.05]), return_dict=False)[0]
    assert same_as_pipeline(later, expected)
    assert not torch.allclose(later, at_zero, atol=1e-3)


def test_injected_noise_is_seeded_per_tile() -> None:
    """Deterministic, the same in a stream, and the caller's generator left as it was."""
    vae = ltx_vae(decoder_inject_noise=(True, True, False, False, False)).eval()
    with torch.no_grad():
        for name, parameter in vae.decoder.named_parameters():
            if "per_channel_scale" in name:
                parameter.fill_(0.5)
    decoder = LTXVideoDecoder(vae)
    assert isinstance(decoder.chunking, MarginChunking)  # noise per call: windows
    z = latents("ltx-video", 5, seed=5)
    state = torch.get_rng_state()
    whole = decoder.decode(z)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(decoder.decode(z), whole)
    streamed: list[torch.Tensor] = []
    decoder.decode_stream(list(z.split(1, dim=2)), lambda c: streamed.append(c.frames.clone()))
    assert torch.equal(torch.cat(streamed, dim=2), whole)
    quiet = LTXVideoDecoder(ltx_vae().eval()).decode(z)
    assert not torch.allclose(whole, quiet, atol=1e-3)  # the noise is really there


def test_is_a_chunked_decoder(model: str, decoder: Decoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == (
        model,
        CHANNELS[model],
        (-1, 1),
    )
    assert isinstance(decoder.chunking, WavefrontChunking)
    margins = decoder.chunking.margins
    assert (margins.spatial_scale, margins.windows.temporal_scale) == (8, 8)
    assert not decoder.vae.use_framewise_decoding  # left as loaded: the whole clip's decode


def test_bad_latents_are_refused(model: str, decoder: Decoder) -> None:
    channels = CHANNELS[model]
    with pytest.raises(
        InvalidRequestError, match=f"this model takes {channels} latent channels, got 128"
    ):
        decoder.plan((1, 128, 5, 2, 2))
    with pytest.raises(InvalidRequestError, match="at least 1 frame"):
        decoder.plan((1, channels, 0, 2, 2))


def test_missing_or_changed_internals_fail_at_load(model: str) -> None:
    import diffusers

    decoder_class = DECODERS[model]
    class_name = decoder_class.family.class_name
    stale = SimpleNamespace(config={"latent_channels": 4}, decoder=None)
    with pytest.raises(WeightsError) as error:
        decoder_class.check_internals(stale)
    assert str(error.value).startswith(
        f"diffusers {diffusers.__version__}'s {class_name} no longer has _temporal_tiled_decode, "
    )
    assert str(error.value).endswith(
        f"config.decoder_inject_noise, which vaecast's {model} decoder relies on; "
        "install diffusers>=0.42,<0.43"
    )
    base = AutoencoderKLLTXVideo if model == "ltx-video" else AutoencoderKLLTX2Video

    class DropsFirst(base):  # type: ignore[misc, valid-type]
        def _temporal_tiled_decode(self, z: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            decoded = z
            decoded = decoded[:, :, 1:, :, :]
            return decoded

    vae = VAES[model]()
    vae.__class__ = DropsFirst
    with pytest.raises(WeightsError, match=r"`decoded = decoded\[:, :, :-1, :, :\]` in _temporal"):
        decoder_class(vae)


@pytest.mark.parametrize("layout", ["vae folder", "pipeline folder"])
def test_loads_from_a_local_diffusers_folder(model: str, tmp_path: Path, layout: str) -> None:
    if layout == "pipeline folder":
        pipeline = next(case for case in CASES if case.model == model).build()
        pipeline.save_pretrained(tmp_path)
        vae = pipeline.vae
    else:
        vae = VAES[model]()
        vae.save_pretrained(tmp_path)
    assert diffusers_model(tmp_path) == model
    loaded = get_decoder(model, device="cpu", weights=tmp_path)
    assert isinstance(loaded, DECODERS[model])
    z = latents(model, 4)
    decoded = loaded.decode(z)
    assert same_as_pipeline(decoded, pipeline_decode(loaded.vae, z))
    # The same weights, but read into unaligned (memory-mapped) storage, where a linear
    # kernel may round differently (the timestep embedder does, by ~1e-7).
    torch.testing.assert_close(decoded, pipeline_decode(vae.eval(), z), rtol=0, atol=1e-5)


def test_weights_must_be_a_local_folder(model: str, tmp_path: Path) -> None:
    decoder_class = DECODERS[model]
    with pytest.raises(WeightsError, match=f"the {model} decoder needs --weights"):
        decoder_class.from_weights(None)
    with pytest.raises(WeightsError, match="is not a folder"):
        decoder_class.from_weights(tmp_path / "vae.safetensors")
    with pytest.raises(WeightsError, match=r"has neither config\.json nor vae/config\.json"):
        decoder_class.from_weights(tmp_path)
