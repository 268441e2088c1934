"""The `wan2.1` decoder: chunks within float rounding of diffusers' `vae.decode`, loading
without the hub, one decode per VAE at a time, and the diffusers internals it drives."""

from __future__ import annotations

import ast
import inspect
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file

import vaecast.models.minimax
import vaecast.models.wan
from tests.helpers import one_torch_thread
from tests.helpers.models import WAN_TINY_CONFIG as TINY_CONFIG
from tests.helpers.wan import wan_decoder
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.registry import get_decoder
from vaecast.models.wan import WanDecoder
from vaecast.models.weights_io import WeightsError

# diffusers' own tiny Wan test configuration.
WAIT_S = 30.0


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLWan:
    torch.manual_seed(0)
    return AutoencoderKLWan(**TINY_CONFIG).eval()


@pytest.fixture(scope="module")
def decoder(vae: AutoencoderKLWan) -> WanDecoder:
    return WanDecoder(vae)


def latents(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 16, frames, 2, 3, generator=torch.Generator().manual_seed(seed))


def pipeline_decode(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """What a Wan pipeline does with its final latents (pipeline_wan.py, verbatim)."""
    latents = latents.to(vae.dtype)
    latents_mean = (
        torch.tensor(vae.config.latents_mean)
        .view(1, vae.config.z_dim, 1, 1, 1)
        .to(latents.device, latents.dtype)
    )
    latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(
        latents.device, latents.dtype
    )
    latents = latents / latents_std + latents_mean
    with torch.no_grad():
        return vae.decode(latents, return_dict=False)[0]


def same_as_diffusers(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Within float rounding of `vae.decode`. On a CPU, Wan 2.1's convs run channels-last
    (8e-6 apart on its published architecture). In the VAE's own layout, bit for bit
    where the CPU's kernel for the 1x1x1 `post_quant_conv` over one latent frame is the
    one it picks over all of them (the Intel CPUs this was first measured on); on others
    (AMD EPYC: 2.4e-7 apart even on one thread, 1.5e-6 for Wan 2.2) within rounding. A
    stream's split never changes the output (tests/models/test_streaming.py holds that
    bit for bit)."""
    return torch.allclose(ours, theirs, rtol=0, atol=1e-5)


def collect(decoder: WanDecoder, z: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))
    )
    return chunks


@pytest.mark.parametrize("frames", [1, 2, 4])
def test_chunks_are_diffusers_decode(
    vae: AutoencoderKLWan, decoder: WanDecoder, frames: int
) -> None:
    z = latents(frames, seed=frames)
    chunks = collect(decoder, z)
    expected = pipeline_decode(vae, z)
    assert same_as_diffusers(torch.cat([c.frames for c in chunks], dim=2), expected)
    assert [c.frame_count for c in chunks] == [1] + [4] * (frames - 1)
    assert [c.index for c in chunks] == list(range(frames))
    assert {c.total for c in chunks} == {frames}
    assert [c.frame_start for c in chunks] == [0, 1, 5, 9][:frames]
    assert [c.is_final for c in chunks] == [False] * (frames - 1) + [True]
    plan = decoder.plan(z.shape)
    assert plan.chunk_frames == tuple(c.frame_count for c in chunks)
    assert (plan.height, plan.width) == expected.shape[3:] == (16, 24)
    assert expected.abs().max() <= 1 and expected.std() > 0


def test_is_a_chunked_decoder(decoder: WanDecoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == ("wan2.1", 16, (-1, 1))


def test_the_diffusers_internals_we_drive_still_exist(vae: AutoencoderKLWan) -> None:
    """Fails loudly on a diffusers upgrade that moves the causal loop's pieces."""
    WanDecoder.check_internals(vae)
    assert vae._cached_conv_counts["decoder"] > 0
    parameters = inspect.signature(vae.decoder.forward).parameters
    assert list(parameters) == ["x", "feat_cache", "feat_idx", "first_chunk"]
    assert parameters["first_chunk"].default is False
    assert callable(vae.clear_cache) and callable(vae.post_quant_conv)
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    assert callable(convert_wan_vae_to_diffusers) and callable(unpatchify)


def test_missing_internals_fail_at_load() -> None:
    import diffusers

    stale = SimpleNamespace(config={"latents_mean": [], "latents_std": []}, decoder=None)
    with pytest.raises(WeightsError) as error:
        WanDecoder.check_internals(stale)
    assert str(error.value) == (
        f"diffusers {diffusers.__version__}'s AutoencoderKLWan no longer has "
        "_cached_conv_counts, post_quant_conv, clear_cache, config.z_dim, config.patch_size, "
        "config.dim_mult, config.temperal_downsample, which vaecast's wan2.1 decoder relies on; "
        "install diffusers>=0.35,<0.43"
    )


@pytest.mark.parametrize("layout", ["model folder", "vae folder"])
def test_loads_from_a_local_diffusers_folder(
    vae: AutoencoderKLWan, tmp_path: Path, layout: str
) -> None:
    vae.save_pretrained(tmp_path / "vae" if layout == "model folder" else tmp_path)
    loaded = get_decoder("wan2.1", device="cpu", weights=tmp_path)
    z = latents(2)
    assert same_as_diffusers(loaded.decode(z), pipeline_decode(vae, z))


def test_loads_a_single_file_with_its_config(vae: AutoencoderKLWan, tmp_path: Path) -> None:
    path = tmp_path / "wan_vae.safetensors"
    save_file(vae.state_dict(), path)
    z = latents(2)
    assert same_as_diffusers(
        WanDecoder.from_weights(path, config=TINY_CONFIG).decode(z), pipeline_decode(vae, z)
    )
    # Built as Wan 2.1's full VAE (the default), the tiny file does not fit: say where.
    with pytest.raises(
        WeightsError,
        match=r"does not fit this model: missing keys: .*shape "
        r"mismatches: .*decoder\.conv_in\.weight: file \(3, 16, 3, 3, 3\), model \(384, ",
    ):
        WanDecoder.from_weights(path)


def test_weights_are_required(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"the wan2\.1 decoder needs --weights"):
        WanDecoder.from_weights(None)
    with pytest.raises(WeightsError, match=r"has neither config\.json nor vae/config\.json"):
        WanDecoder.from_weights(tmp_path)


def test_one_decode_per_vae_at_a_time(vae: AutoencoderKLWan, decoder: WanDecoder) -> None:
    """A second decode on the same VAE (even through another wrapper) waits for the first."""
    other = WanDecoder(vae)
    first_holding, release = threading.Event(), threading.Event()
    events: list[str] = []

    def first() -> None:
        def hold(chunk: DecodedChunk) -> None:
            events.append(f"first {chunk.index}")
            if chunk.index == 0:
                first_holding.set()
                assert release.wait(WAIT_S)

        decoder.decode_chunks(latents(2), hold)

    def second() -> None:
        other.decode_chunks(latents(1), lambda chunk: events.append("second"))

    one = threading.Thread(target=first)
    one.start()
    assert first_holding.wait(WAIT_S)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.3)
    assert two.is_alive() and events == ["first 0"]
    release.set()
    one.join(WAIT_S)
    two.join(WAIT_S)
    assert events == ["first 0", "first 1", "second"]


def test_a_stream_holds_the_vae_until_it_ends(vae: AutoencoderKLWan, decoder: WanDecoder) -> None:
    """Waits for the next block included: a stream is one decode, as a whole tensor is."""
    other = WanDecoder(vae)
    between_blocks, resume = threading.Event(), threading.Event()
    events: list[str] = []

    def blocks() -> Iterator[torch.Tensor]:
        yield latents(1)
        between_blocks.set()
        assert resume.wait(WAIT_S)
        yield latents(1, seed=1)

    def stream() -> None:
        decoder.decode_stream(blocks(), lambda chunk: events.append(f"stream {chunk.index}"))

    def whole() -> None:
        other.decode_chunks(latents(1), lambda chunk: events.append("whole"))

    one = threading.Thread(target=stream)
    one.start()
    assert between_blocks.wait(WAIT_S)
    two = threading.Thread(target=whole)
    two.start()
    two.join(0.3)
    assert two.is_alive() and events == ["stream 0"]
    resume.set()
    one.join(WAIT_S)
    two.join(WAIT_S)
    assert events == ["stream 0", "stream 1", "whole"]


@pytest.mark.parametrize(
    ("options", "calls"),
    [({}, [1] * 6), ({"block_latents": 4}, [1, 4, 1]), ({"channels_last": False}, [1] * 6)],
    ids=["default", "blocks-of-4", "own-modules"],
)
def test_post_quant_conv_sees_the_streams_blocks(
    vae: AutoencoderKLWan, options: dict[str, object], calls: list[int]
) -> None:
    """Latent 0 alone, then `block_latents` frames a call (the last block shorter): by
    default for Wan 2.1's architecture, one."""
    built = wan_decoder(vae, **options)
    frames: list[int] = []
    handle = built.post_quant_conv.register_forward_pre_hook(
        lambda module, args: frames.append(int(args[0].shape[2]))
    )
    try:
        built.decoder.decode(latents(6))
    finally:
        handle.remove()
    assert frames == calls


def test_one_latent_frame_a_call_is_the_pipelines_own_loop(vae: AutoencoderKLWan) -> None:
    """With both CPU defaults off, the decoder makes diffusers' own calls: on one frame
    at a time, in the VAE's own modules (bit for bit where the CPU's kernels allow)."""
    built = wan_decoder(vae, channels_last=False, block_latents=1)
    assert not built.copied
    assert built.decoder.plan((1, 16, 3, 2, 3)).chunk_frames == (1, 4, 4)
    z = latents(3, seed=11)
    assert same_as_diffusers(built.decoder.decode(z), pipeline_decode(vae, z))
    with pytest.raises(ValueError, match="block_latents must be at least 1, got 0"):
        WanDecoder(vae, block_latents=0)


def test_on_a_cpu_wan21_decodes_through_a_channels_last_copy(vae: AutoencoderKLWan) -> None:
    """Faster on CPUs (oneDNN), within float rounding; the caller's VAE is left as it was."""
    before = {name: tensor.clone() for name, tensor in vae.state_dict().items()}
    built = wan_decoder(vae)
    assert built.copied and built.vae_decoder is not vae.decoder
    channels_last = torch.channels_last_3d
    copied = dict(built.vae_decoder.named_parameters())
    convs = [name for name, parameter in vae.decoder.named_parameters() if parameter.dim() == 5]
    assert convs
    for name in convs:
        theirs = vae.decoder.get_parameter(name)
        assert copied[name].is_contiguous(memory_format=channels_last)
        assert theirs.is_contiguous()
        assert torch.equal(copied[name], theirs)
        assert copied[name].data_ptr() != theirs.data_ptr()
    assert any(not copied[name].is_contiguous() for name in convs)
    after = vae.state_dict()
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())

    z = latents(4, seed=7)
    expected = pipeline_decode(vae, z)
    own = wan_decoder(vae, channels_last=False)
    assert not own.copied and own.vae_decoder is vae.decoder
    streamed, exact = built.decoder.decode(z), own.decoder.decode(z)
    assert streamed.is_contiguous() and same_as_diffusers(streamed, expected)
    assert same_as_diffusers(exact, expected)


def test_a_callback_error_leaves_the_vae_usable(vae: AutoencoderKLWan, decoder: WanDecoder) -> None:
    def fail(chunk: DecodedChunk) -> None:
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        decoder.decode_chunks(latents(2), fail)
    z = latents(2)
    assert same_as_diffusers(decoder.decode(z), pipeline_decode(vae, z))


def test_wan2_2_geometry_decodes_the_same_too() -> None:
    """Wan 2.2's VAE (residual blocks, 2x2 output patch, 16x in space) runs the same loop."""
    torch.manual_seed(2)
    config = dict(TINY_CONFIG, base_dim=4, z_dim=8, is_residual=True, patch_size=2)
    config.update(in_channels=12, out_channels=12, latents_mean=[0.1] * 8, latents_std=[2.0] * 8)
    vae = AutoencoderKLWan(**config).eval()
    # On a CPU, measured for this architecture: blocks of 4 latent frames a call are
    # faster, channels-last convs slower, so its own modules in blocks by default.
    built = wan_decoder(vae)
    assert not built.copied and built.vae_decoder is vae.decoder
    z = torch.randn(1, 8, 3, 2, 2, generator=torch.Generator().manual_seed(4))
    expected = pipeline_decode(vae, z)
    assert expected.shape == (1, 3, 9, 32, 32)
    assert built.decoder.plan(z.shape).chunk_frames == (1, 8)
    assert same_as_diffusers(built.decoder.decode(z), expected)
    forced = wan_decoder(vae, channels_last=True, block_latents=1)
    assert forced.copied and forced.decoder.plan(z.shape).chunk_frames == (1, 4, 4)
    assert same_as_diffusers(forced.decoder.decode(z), expected)


@pytest.mark.parametrize("patch_size", [None, 2], ids=["wan2.1", "wan2.2"])
def test_off_a_cpu_the_decoder_makes_the_pipelines_own_calls(
    patch_size: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither CPU default applies on another device: one latent frame a call, in the
    VAE's own modules, as the pipeline decodes (and at its peak memory)."""
    config = dict(TINY_CONFIG, z_dim=8, latents_mean=[0.0] * 8, latents_std=[1.0] * 8)
    if patch_size is not None:
        config.update(is_residual=True, patch_size=2, in_channels=12, out_channels=12)
    vae = AutoencoderKLWan(**config).eval()
    copies: list[object] = []
    monkeypatch.setattr(vaecast.models.wan, "channels_last_modules", copies.append)
    # Built without moving the VAE: a chunking only closes over the device.
    chunking = vaecast.models.wan.chunking(vae, torch.device("cuda"), lambda z: z)
    assert chunking.block_latents == 1 and copies == []
    assert chunking.plan((1, 8, 3, 2, 2)).chunk_frames == (1, 4, 4)


def test_vaecast_imports_without_diffusers(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers is needed to load these models, never to import vaecast or list them."""
    for module in (vaecast.models.wan, vaecast.models.minimax):
        tree = ast.parse(Path(module.__file__).read_text())
        modules = [
            alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names
        ]
        modules += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert "vaecast.models.weights_io" in modules  # the scan sees the imports
        assert not [m for m in modules if str(m).split(".")[0] == "diffusers"], module.__name__
    monkeypatch.setitem(sys.modules, "diffusers", None)  # what an absent package looks like
    with pytest.raises(WeightsError) as error:
        WanDecoder.from_weights("x")
    assert str(error.value) == (
        "the wan2.1 decoder needs diffusers>=0.35,<0.43: pip install 'vaecast[real]'"
    )
