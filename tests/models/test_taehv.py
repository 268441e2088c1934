"""The `taehv` decoder: published weight layout, the chunk contract, causality, and agreement
with TAEHV's parallel formulation, on random weights at tiny widths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from tests.helpers import one_torch_thread
from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.registry import get_decoder
from vaecast.models.taehv import MemBlock, TAEHVConfig, TAEHVDecoder, TAEHVNet
from vaecast.models.weights_io import WeightsError

TINY = TAEHVConfig(latent_channels=16, widths=(8, 8, 4, 4))


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def random_state(config: TAEHVConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in TAEHVNet(config).state_dict().items()}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A taew2_1-shaped file at tiny widths, with an encoder part the decoder must ignore."""
    path = tmp_path_factory.mktemp("taehv") / "taew2_1_tiny.safetensors"
    state = {k: v.half() for k, v in random_state(TINY).items()}
    state["encoder.0.weight"] = torch.zeros(4, 3, 3, 3, dtype=torch.half)
    save_file(state, path)
    return path


@pytest.fixture(scope="module")
def decoder(weights: Path) -> TAEHVDecoder:
    return TAEHVDecoder.from_weights(weights)


@pytest.fixture(scope="module")
def latents() -> torch.Tensor:
    return torch.randn(1, 16, 4, 2, 3, generator=torch.Generator().manual_seed(7))


def collect(decoder: TAEHVDecoder, latents: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        latents,
        lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start)),
    )
    return chunks


def parallel_decode(net: TAEHVNet, latents: torch.Tensor) -> torch.Tensor:
    """TAEHV's parallel path: every block over all frames at once, memory = input shifted by one."""
    x = latents[0].transpose(0, 1)
    with torch.no_grad():
        for block in net.decoder:
            if isinstance(block, MemBlock):
                x = block(x, torch.cat([torch.zeros_like(x[:1]), x[:-1]]))
            else:
                x = block(x)  # TGrow turns T frames into stride * T, in time order
        if net.config.patch_size > 1:
            x = F.pixel_shuffle(x, net.config.patch_size)
    return x.clamp(0, 1)[3:].transpose(0, 1).unsqueeze(0)


def test_the_layout_is_taew2_1s() -> None:
    """Key names and sizes as the published file has them (9.8 M decoder parameters)."""
    state = TAEHVNet(TAEHVConfig()).state_dict()
    assert sum(v.numel() for v in state.values()) == 9_844_611
    assert state["decoder.1.weight"].shape == (256, 16, 3, 3)
    assert state["decoder.3.conv.0.weight"].shape == (256, 512, 3, 3)
    assert state["decoder.7.conv.weight"].shape == (256, 256, 1, 1)
    assert state["decoder.13.conv.weight"].shape == (256, 128, 1, 1)
    assert state["decoder.19.conv.weight"].shape == (128, 64, 1, 1)
    assert state["decoder.22.weight"].shape == (3, 64, 3, 3)
    assert "decoder.8.bias" not in state and "decoder.3.skip.weight" not in state


def test_is_a_chunked_decoder(decoder: TAEHVDecoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == ("taehv", 16, (0, 1))
    assert decoder.config == TINY


def test_chunks_follow_the_contract(decoder: TAEHVDecoder, latents: torch.Tensor) -> None:
    chunks = collect(decoder, latents)
    assert [c.frame_count for c in chunks] == [1, 4, 4, 4]
    assert [(c.index, c.total, c.frame_start) for c in chunks] == [
        (0, 4, 0),
        (1, 4, 1),
        (2, 4, 5),
        (3, 4, 9),
    ]
    assert [c.is_final for c in chunks] == [False, False, False, True]
    assert decoder.plan(latents.shape).chunk_frames == (1, 4, 4, 4)
    full = decoder.decode(latents)
    assert full.shape == (1, 3, 13, 16, 24)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), full)
    assert full.min() >= 0 and full.max() <= 1 and full.std() > 0.01


def test_grouped_chunks_decode_the_same_frames(weights: Path, latents: torch.Tensor) -> None:
    grouped = TAEHVDecoder.from_weights(weights, latents_per_chunk=3)
    chunks = collect(grouped, latents)
    assert [c.frame_count for c in chunks] == [9, 4]
    assert grouped.plan(latents.shape).chunk_frames == (9, 4)
    assert torch.equal(grouped.decode(latents), TAEHVDecoder.from_weights(weights).decode(latents))


def test_decoding_is_causal(decoder: TAEHVDecoder, latents: torch.Tensor) -> None:
    """A prefix of the latents decodes to a prefix of the frames, bit for bit."""
    full = decoder.decode(latents)
    assert torch.equal(decoder.decode(latents[:, :, :2]), full[:, :, :5])


def test_agrees_with_the_parallel_formulation(decoder: TAEHVDecoder, latents: torch.Tensor) -> None:
    expected = parallel_decode(decoder._net, latents)
    torch.testing.assert_close(decoder.decode(latents), expected, rtol=0, atol=1e-5)


def test_shape_is_read_from_the_file(tmp_path: Path) -> None:
    """A taew2_2-style file (48 channels, 2x2 output patch) decodes at 16x scale."""
    config = TAEHVConfig(latent_channels=48, widths=(4, 4, 4, 4), patch_size=2)
    path = tmp_path / "taew2_2_tiny.pth"
    torch.save(random_state(config), path)
    decoder = TAEHVDecoder.from_weights(path)
    assert decoder.config == config
    latents = torch.randn(1, 48, 2, 1, 2)
    assert decoder.plan(latents.shape).height == 16
    frames = decoder.decode(latents)
    assert frames.shape == (1, 3, 5, 16, 32)
    torch.testing.assert_close(frames, parallel_decode(decoder._net, latents), rtol=0, atol=1e-5)


def test_weights_are_required_and_checked(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="needs a weights file and none ships with vaecast"):
        TAEHVDecoder.from_weights(None)
    state = random_state(TINY)
    del state["decoder.15.conv.4.bias"]
    path = tmp_path / "broken.safetensors"
    save_file(state, path)
    with pytest.raises(WeightsError, match=r"missing keys: decoder\.15\.conv\.4\.bias$"):
        TAEHVDecoder.from_weights(path)
    save_file({"encoder.0.weight": torch.zeros(1)}, path)
    with pytest.raises(
        WeightsError, match=r"is not a TAEHV decoder: missing keys: decoder\.1\.weight"
    ):
        TAEHVDecoder.from_weights(path)


def test_bad_latents_are_refused(decoder: TAEHVDecoder) -> None:
    with pytest.raises(InvalidRequestError, match="takes 16 latent channels, got 4"):
        decoder.plan((1, 4, 2, 2, 2))


def test_a_callback_error_stops_the_decode(decoder: TAEHVDecoder, latents: torch.Tensor) -> None:
    seen: list[int] = []

    def stop(chunk: DecodedChunk) -> None:
        seen.append(chunk.index)
        if chunk.index == 1:
            raise RuntimeError("viewer gone")

    with pytest.raises(RuntimeError, match="viewer gone"):
        decoder.decode_chunks(latents, stop)
    assert seen == [0, 1]


def test_registered_under_its_name(weights: Path) -> None:
    assert isinstance(get_decoder("taehv", device="cpu", weights=weights), TAEHVDecoder)
