"""`vaecast decode`'s file states its length, as players read it (issue 36)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.mp4_duration import ffprobe_seconds, mp4box_info
from vaecast.cli import main

AUDIO_RATE_HZ = 16000


@pytest.mark.parametrize("audio", [False, True], ids=["video", "video+audio"])
def test_a_decoded_file_states_the_videos_length(tmp_path: Path, audio: bool) -> None:
    # 3 latent frames at 8 fps: 9 frames, 1.125 s. A soundtrack of 1.5 s is cut to it.
    tensors = {"latents": smooth_latents(3)}
    metadata = {"fps": "8"}
    if audio:
        tensors["audio"] = torch.sin(torch.linspace(0, 3000, AUDIO_RATE_HZ * 3 // 2)).unsqueeze(0)
        metadata["audio_sample_rate"] = str(AUDIO_RATE_HZ)
    latents = tmp_path / "z.safetensors"
    latents.write_bytes(safetensors_bytes(metadata=metadata, **tensors))
    output = tmp_path / "out.mp4"
    assert main(["decode", str(latents), "-o", str(output), "--model", "linear"]) == 0

    assert ffprobe_seconds(output) == 1.125
    info = mp4box_info(output)
    assert info["duration"] == 1.125  # 0 in a file that does not say
    expected = [["video", 1.125]] + ([["audio", 1.125]] if audio else [])
    assert info["tracks"] == expected
