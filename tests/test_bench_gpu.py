"""benchmarks/gpu.py and benchmarks/device.sh: the probe, random-weight models, the skip.

The GPU itself is absent here; what runs is what device.sh does first on any machine
(the probe, and its clean skip without CUDA) and the random-weight models it decodes
with, loaded through the real loaders and decoding real latents on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import nvenc_works, probe, random_weights
from vaecast.models.registry import get_decoder

REPO = Path(__file__).resolve().parent.parent


def test_nvenc_is_probed_by_opening_it_never_assumed() -> None:
    works, why = nvenc_works(64, 48)
    assert why
    if not works:
        # This machine has no NVIDIA driver: the open itself must be what said no.
        assert "h264_nvenc" in why or "Error" in why or "no packets" in why


def test_probe_reports_cuda_and_nvenc() -> None:
    info = probe(64, 48)
    assert info["cuda"] is torch.cuda.is_available()
    assert set(info["h264_nvenc"]) == {"works", "why"}


@pytest.mark.slow
def test_random_taehv_loads_and_decodes_at_its_real_shape(tmp_path: Path) -> None:
    path = random_weights("taehv", tmp_path)
    assert random_weights("taehv", tmp_path) == path  # reused, not rewritten
    decoder = get_decoder("taehv", device="cpu", weights=str(path))
    chunks: list[torch.Tensor] = []
    latents = torch.randn(1, 16, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        decoder.decode_chunks(latents, lambda chunk: chunks.append(chunk.frames.clone()))
    assert [c.shape for c in chunks] == [(1, 3, 1, 32, 48), (1, 3, 4, 32, 48)]
    assert all(torch.isfinite(c).all() for c in chunks)


def test_random_weights_refuse_other_models(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no random weights for model 'tiny'"):
        random_weights("tiny", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without CUDA")
def test_device_sh_skips_cleanly_without_cuda(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "device.sh"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "SKIPPING: no CUDA device here" in done.stderr
    assert json.loads((tmp_path / "probe.json").read_text())["cuda"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe.json"]  # nothing measured
