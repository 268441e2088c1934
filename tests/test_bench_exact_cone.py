"""`benchmarks.exact_cone`: the dependency cone of an LTX decoder's first frames, on the
tests' tiny LTX-Video VAE (non-causal as released, and a causal variant to compare)."""

from __future__ import annotations

from benchmarks import exact_cone
from tests.helpers.tiny_pipelines.ltx import ltx_vae

# 4 latents: 25 frames.
LATENTS = 4


def test_the_whole_clip_needs_all_of_the_work_and_fewer_frames_less() -> None:
    vae = ltx_vae()
    whole = exact_cone.cone_share(vae, LATENTS, 25)
    first = exact_cone.cone_share(vae, LATENTS, 1)
    chunk = exact_cone.cone_share(vae, LATENTS, 17)
    assert whole == 1.0
    assert 0 < first < chunk < 1


def test_a_causal_decoders_first_frame_needs_less_than_a_non_causal_ones() -> None:
    # A causal decoder's first frame depends on latent 0 alone.
    causal = exact_cone.cone_share(ltx_vae(decoder_causal=True), LATENTS, 1)
    non_causal = exact_cone.cone_share(ltx_vae(), LATENTS, 1)
    assert causal < non_causal
    assert causal <= 0.5


def test_the_table_has_a_row_per_model_and_clip() -> None:
    result = {
        "meta": {"finished_utc": "now", "commit": "abc", "torch": "2"},
        "models": {
            "ltx-video": {
                "vae_class": "AutoencoderKLLTXVideo",
                "rows": [
                    {"frames": 33, "first_frames": 1, "share": 0.443},
                    {"frames": 33, "first_frames": 17, "share": 0.803},
                ],
            }
        },
    }
    assert "| ltx-video | 33 | 44% | 80% |" in exact_cone.markdown(result)
