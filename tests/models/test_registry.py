"""Model names: the built-in table, `--model diffusers` by a folder's config, plugins."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from diffusers import AutoencoderKLWan

from tests.helpers.models import WAN_TINY_CONFIG
from vaecast.errors import UnknownModelError
from vaecast.models.registry import (
    BUILTIN_DECODERS,
    DIFFUSERS_CLASSES,
    available_decoders,
    decoder_class,
    diffusers_model,
    get_decoder,
)
from vaecast.models.wan import Wan22Decoder, WanDecoder
from vaecast.models.weights_io import WeightsError


def test_every_built_in_name_imports_its_class_and_each_says_its_name() -> None:
    for name, target in BUILTIN_DECODERS.items():
        found = decoder_class(name)
        assert f"{found.__module__}:{found.__name__}" == target
        assert found.name == name, name  # type: ignore[attr-defined]
    assert set(DIFFUSERS_CLASSES.values()) <= set(BUILTIN_DECODERS)


def write_config(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("class_name", "model"), sorted(DIFFUSERS_CLASSES.items()))
def test_a_diffusers_folder_names_its_model_by_class(
    tmp_path: Path, class_name: str, model: str
) -> None:
    assert diffusers_model(write_config(tmp_path / "vae", {"_class_name": class_name})) == model
    # A pipeline's folder: the VAE is in vae/.
    assert diffusers_model(tmp_path) == model


def test_a_wan_folder_of_48_latent_channels_is_wan_2_2(tmp_path: Path) -> None:
    folder = write_config(tmp_path, {"_class_name": "AutoencoderKLWan", "z_dim": 48})
    assert diffusers_model(folder) == "wan2.2"


def test_a_folder_that_is_not_a_video_vae_is_one_line_naming_the_supported(
    tmp_path: Path,
) -> None:
    folder = write_config(tmp_path, {"_class_name": "AutoencoderKL"})
    with pytest.raises(WeightsError) as raised:
        diffusers_model(folder)
    assert raised.value.message == (
        f"{folder}: its config.json names 'AutoencoderKL', not a video VAE vaecast decodes; "
        f"supported classes: {', '.join(sorted(DIFFUSERS_CLASSES))}"
    )
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(WeightsError, match="not a readable JSON config"):
        diffusers_model(folder)
    with pytest.raises(
        WeightsError, match=re.escape("has neither config.json nor vae/config.json")
    ):
        diffusers_model(tmp_path / "empty")


def test_model_diffusers_loads_the_folders_decoder(tmp_path: Path) -> None:
    AutoencoderKLWan(**WAN_TINY_CONFIG).save_pretrained(tmp_path / "vae")
    decoder = get_decoder("diffusers", weights=tmp_path)
    assert type(decoder) is WanDecoder
    with pytest.raises(WeightsError, match="--model diffusers needs --weights"):
        get_decoder("diffusers")
    assert Wan22Decoder.name == "wan2.2"


def test_unknown_names_and_broken_plugins_say_what_is_known() -> None:
    with pytest.raises(UnknownModelError) as raised:
        decoder_class("moon")
    assert raised.value.message.startswith("unknown model 'moon'; this server knows: cogvideox")
    assert raised.value.message.endswith("or a plugin as package.module:factory")
    with pytest.raises(
        UnknownModelError, match=re.escape("a plugin is named package.module:factory")
    ):
        decoder_class(":make")
    with pytest.raises(
        UnknownModelError, match=re.escape("'tests.helpers.plugins:LATENT_CHANNELS' is not")
    ):
        decoder_class("tests.helpers.plugins:LATENT_CHANNELS")
    assert "diffusers" in available_decoders()


def test_each_diffusers_family_is_picked_by_its_own_class_name() -> None:
    """`--model diffusers` picks a decoder by the folder's `_class_name`: the table says
    the same as each family's spec (models/diffusers_family.py), for every family."""
    import importlib

    from vaecast.models.registry import BUILTIN_DECODERS, DIFFUSERS_CLASSES

    specs = {}
    for name, target in BUILTIN_DECODERS.items():
        module = importlib.import_module(target.split(":")[0])
        decoder = getattr(module, target.split(":")[1])
        spec = getattr(decoder, "family", None)
        if spec is not None and spec.model == name:
            specs.setdefault(spec.class_name, name)  # wan2.2 shares wan2.1's class
    assert specs == DIFFUSERS_CLASSES
    assert len(specs) == 8
