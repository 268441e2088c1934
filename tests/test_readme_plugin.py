"""The README's own-VAE example, run as written: a plugin module vaecast loads and serves."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from vaecast.models.registry import get_decoder

README = Path(__file__).resolve().parents[1] / "README.md"


def example_source() -> str:
    text = README.read_text()
    section = text[text.index("### Your own VAE") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README's own-VAE section has no python block"
    return match.group(1)


def test_the_readme_example_is_a_plugin_vaecast_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = example_source()
    assert len(source.splitlines()) <= 30
    (tmp_path / "readme_vae.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        decoder = get_decoder("readme_vae:make_decoder")
        latents = torch.randn(1, 12, 3, 4, 5)
        chunks: list[torch.Tensor] = []
        decoder.decode_chunks(latents, lambda chunk: chunks.append(chunk.frames.clone()))
    finally:
        sys.modules.pop("readme_vae", None)
    assert [c.shape[2] for c in chunks] == [1, 4, 4]
    assert chunks[0].shape == (1, 3, 1, 8, 10)
    assert decoder.value_range == (-1.0, 1.0)
