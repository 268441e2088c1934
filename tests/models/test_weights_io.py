"""Weight files: both formats round-trip, bad files fail naming what is wrong, pickles are
refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vaecast.models.taehv import TAEHVConfig, TAEHVNet
from vaecast.models.weights_io import WeightsError, load_strict, read_state_dict

CONFIG = TAEHVConfig(latent_channels=4, widths=(4, 4, 4, 4))
# Set by `_mark` if unpickling ever ran code from a file.
MARKS: list[str] = []


def _mark(value: str) -> str:
    MARKS.append(value)
    return value


class Payload:
    """An object whose unpickling calls `_mark`: what a malicious checkpoint does."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_mark, ("unpickled",))


def net_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in TAEHVNet(CONFIG).state_dict().items()}


def assert_loaded(state: dict[str, torch.Tensor]) -> None:
    net = TAEHVNet(CONFIG)
    load_strict(net, state, "file")
    saved = net_state()
    for key, value in net.state_dict().items():
        assert torch.equal(value, saved[key]), key


@pytest.mark.parametrize("name", ["w.safetensors", "w.pth", "w.bin"])
def test_a_saved_state_dict_round_trips(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name.endswith(".safetensors"):
        save_file(net_state(), path)
    else:
        torch.save(net_state(), path)
    state = read_state_dict(path)
    assert state.keys() == net_state().keys()
    assert_loaded(state)


def test_the_format_is_told_by_content_not_name(tmp_path: Path) -> None:
    path = tmp_path / "actually_safetensors.pth"
    save_file(net_state(), path)
    assert_loaded(read_state_dict(path))


def test_half_precision_files_load_as_float32(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({k: v.half() for k, v in net_state().items()}, path)
    net = TAEHVNet(CONFIG)
    load_strict(net, read_state_dict(path), "file")
    assert {p.dtype for p in net.parameters()} == {torch.float32}


def test_a_wrapped_checkpoint_is_unwrapped(tmp_path: Path) -> None:
    path = tmp_path / "w.pth"
    torch.save({"state_dict": net_state(), "step": 10}, path)
    assert_loaded(read_state_dict(path))


def test_a_missing_key_is_named() -> None:
    state = net_state()
    del state["decoder.3.conv.2.weight"]
    with pytest.raises(
        WeightsError,
        match=r"^w.pth does not fit this model: missing keys: "
        r"decoder\.3\.conv\.2\.weight$",
    ):
        load_strict(TAEHVNet(CONFIG), state, "w.pth")


def test_an_extra_key_is_named() -> None:
    state = net_state()
    state["decoder.99.weight"] = torch.zeros(1)
    with pytest.raises(WeightsError, match=r"unexpected keys: decoder\.99\.weight$"):
        load_strict(TAEHVNet(CONFIG), state, "w.pth")


def test_ignored_prefixes_are_not_extra() -> None:
    state = net_state()
    state["encoder.0.weight"] = torch.zeros(1)
    load_strict(TAEHVNet(CONFIG), state, "w.pth", ignore_prefixes=("encoder.",))


def test_a_wrong_shape_is_named_with_both_shapes() -> None:
    state = net_state()
    state["decoder.8.weight"] = torch.zeros(4, 4, 1, 1)
    with pytest.raises(
        WeightsError,
        match=r"shape mismatches: decoder\.8\.weight: file \(4, 4, 1, 1\), model \(4, 4, 3, 3\)$",
    ):
        load_strict(TAEHVNet(CONFIG), state, "w.pth")


def test_many_problems_are_summarised() -> None:
    state = net_state()
    for key in list(state)[:10]:
        del state[key]
    with pytest.raises(WeightsError, match=r"\(and 2 more\)"):
        load_strict(TAEHVNet(CONFIG), state, "w.pth")


def test_a_pickle_that_is_not_weights_only_is_refused_unexecuted(tmp_path: Path) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"decoder.1.weight": torch.zeros(1), "extra": Payload()}, path)
    with pytest.raises(WeightsError) as refused:
        read_state_dict(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: refused: this checkpoint is not weights-only loadable")
    assert "tests.models.test_weights_io._mark" in message
    assert MARKS == []


def test_non_tensor_entries_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.pth"
    torch.save({"decoder.1.weight": torch.zeros(1), "decoder.1.bias": 3}, path)
    with pytest.raises(WeightsError, match=r"entry 'decoder\.1\.bias' is a int, not a tensor"):
        read_state_dict(path)


def test_a_missing_or_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="does not exist"):
        read_state_dict(tmp_path / "nope.safetensors")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(WeightsError, match=r"garbage\.pth: not a safetensors file or a readable"):
        read_state_dict(garbage)
