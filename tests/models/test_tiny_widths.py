"""`tiny`'s widths come from its weights file, and its causal memory is short.

A wider fit must load into nets of its own widths (read from the tensor shapes, so
code and weights cannot disagree), and decode through the public `TinyDecoder` /
`TinyEncoder`. The memory blocks remember their *input* one step earlier, not an
output: the decoder's frames for latent t depend on latents t-3..t only and the
encoder's latent t on frame groups t-1..t, so an 81-frame decode cannot drift from
errors carried over a long rollout (MODEL_CARD.md: the fast-motion loss is content).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vaecast.models.tiny import (
    LATENT_CHANNELS,
    TinyDecoder,
    TinyDecoderNet,
    TinyEncoder,
    TinyEncoderNet,
    decoder_widths,
    default_weights,
    encoder_widths,
    load_nets,
    nets_from_state,
    video_to_groups,
)


def _state(encoder: TinyEncoderNet, decoder: TinyDecoderNet) -> dict[str, torch.Tensor]:
    state = {f"enc.{k}": v for k, v in encoder.state_dict().items()}
    return state | {f"dec.{k}": v for k, v in decoder.state_dict().items()}


def test_shipped_widths_are_read_from_the_file() -> None:
    encoder, decoder = load_nets()
    state = load_file(str(default_weights()))
    dec = {k[4:]: v for k, v in state.items() if k.startswith("dec.")}
    enc = {k[4:]: v for k, v in state.items() if k.startswith("enc.")}
    assert decoder.widths == decoder_widths(dec)
    assert encoder.widths == encoder_widths(enc)


def test_other_widths_round_trip_through_a_file(tmp_path: Path) -> None:
    torch.manual_seed(3)
    encoder = TinyEncoderNet(quarter=16, sub=24, step=40)
    decoder = TinyDecoderNet(step=48, sub=20, quarter=28)
    encoder2, decoder2 = nets_from_state(_state(encoder, decoder))
    assert encoder2.widths == {"quarter": 16, "sub": 24, "step": 40}
    assert decoder2.widths == {"step": 48, "sub": 20, "quarter": 28}

    path = tmp_path / "wide.safetensors"
    save_file({k: v.half().contiguous() for k, v in _state(encoder, decoder).items()}, str(path))
    video = torch.rand(1, 3, 9, 32, 48, generator=torch.Generator().manual_seed(0))
    latents = TinyEncoder(weights=path).encode(video)
    assert latents.shape == (1, LATENT_CHANNELS, 3, 4, 6)
    frames = TinyDecoder(weights=path).decode(latents)
    assert frames.shape == (1, 3, 9, 32, 48)
    # The file's own nets: the same numbers as these (fp16-rounded) nets give.
    with torch.inference_mode():
        z, _ = load_nets(path)[0](video_to_groups(video))
    assert torch.allclose(z.transpose(1, 2), latents, atol=1e-5)


def test_decoder_memory_reaches_three_latents_back() -> None:
    decoder = load_nets()[1]
    z = torch.randn(1, 9, LATENT_CHANNELS, 3, 4, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        whole, _ = decoder(z)
        start = 4  # a decode started fresh at latent 4, its memory zeros
        fresh, _ = decoder(z[:, start:])
    per_step = 4
    whole = whole[:, :, start * per_step :]
    # Latents start..start+2 still see the zeros; from start+3 on, every frame matches.
    for step in range(3):
        window = slice(step * per_step, (step + 1) * per_step)
        assert not torch.allclose(whole[:, :, window], fresh[:, :, window], atol=1e-4)
    assert torch.allclose(whole[:, :, 3 * per_step :], fresh[:, :, 3 * per_step :], atol=1e-5)


def test_encoder_memory_reaches_one_group_back() -> None:
    encoder = load_nets()[0]
    groups = torch.rand(1, 7, 4, 3, 24, 32, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        whole, _ = encoder(groups)
        fresh, _ = encoder(groups[:, 3:])
    assert not torch.allclose(whole[:, 3], fresh[:, 0], atol=1e-4)
    assert torch.allclose(whole[:, 4:], fresh[:, 1:], atol=1e-5)
