"""LTX-2's sound: a real `LTX2Pipeline` of tiny random components returns video and audio
latents; both, uploaded to a real `vaecast serve` of the pipeline's saved folder, make one
MP4 whose video is the pipeline's frames and whose AAC track is the pipeline's own audio
output (its audio VAE and vocoder), within AAC's loss, from the first frame on."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import av
import numpy as np
import pytest
import torch

from tests.helpers import one_torch_thread, safetensors_bytes
from tests.helpers.serve_process import vaecast_serve
from tests.helpers.tiny_pipelines import run_case
from tests.helpers.tiny_pipelines.ltx import CASES
from vaecast.models.ltx import LTX2VideoDecoder
from vaecast.models.ltx2_sound import LTX2Sound

CASE = next(case for case in CASES if case.model == "ltx-2")
FPS = int(CASE.call_kwargs["frame_rate"])  # the pipeline's frame rate: 25


@dataclass(frozen=True)
class Made:
    folder: Path  # the pipeline, saved
    latents: torch.Tensor
    audio_latents: torch.Tensor
    frames: int
    audio: np.ndarray  # (channels, samples), what output_type="np" gave
    rate: int


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    folder = tmp_path_factory.mktemp("ltx2")
    with one_torch_thread():
        run = run_case(CASE)
        run.pipeline.save_pretrained(folder)
    assert run.audio_latents is not None and run.audio is not None
    return Made(
        folder,
        run.latents,
        run.audio_latents,
        run.frames.shape[0],
        run.audio,
        int(run.pipeline.vocoder.config.output_sampling_rate),
    )


@pytest.fixture(scope="module")
def url(made: Made, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    arguments = ["--model", "ltx-2", "--weights", f"ltx-2={made.folder}", "--crf", "0"]
    with vaecast_serve(arguments, log) as base:
        yield base


def post(url: str, data: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def mp4_of(url: str, body: bytes, **params: object) -> tuple[dict[str, object], bytes]:
    status, job = post(
        f"{url}v1/videos?{urlencode({'model': 'ltx-2', 'fps': FPS, **params})}", body
    )
    assert status == 201, job
    with urllib.request.urlopen(f"{url}v1/videos/{job['id']}/content", timeout=120) as r:
        return job, r.read()


def decoded_audio(data: bytes) -> tuple[np.ndarray, int, int]:
    """The MP4's audio track decoded, (channels, samples); its rate; its video frames."""
    with av.open(io.BytesIO(data)) as container:
        frames = sum(1 for _ in container.decode(video=0))
    with av.open(io.BytesIO(data)) as container:
        audio = list(container.decode(audio=0))
    samples = np.concatenate([frame.to_ndarray() for frame in audio], axis=1)  # fltp planes
    return samples, audio[0].sample_rate, frames


@pytest.mark.slow
def test_the_mp4_carries_the_pipelines_own_sound(made: Made, url: str) -> None:
    """The audio latents' MP4 sounds as the pipeline's own audio output muxed by vaecast:
    the same AAC track as an upload of that waveform (to float rounding), from the first
    frame on. (Random weights make noise of it, which AAC keeps only as its spectrum; a
    waveform's fidelity through the encoder is the soundtrack tests'.)"""
    latents = made.latents.contiguous()
    audio_latents = made.audio_latents.contiguous()
    job, data = mp4_of(url, safetensors_bytes(latents=latents, audio_latents=audio_latents))
    assert job["audio"] == {"sample_rate": made.rate, "channels": 2}
    got, rate, frames = decoded_audio(data)
    assert (rate, frames, got.shape[0]) == (made.rate, made.frames, 2)
    # As long as the video (1 s here), +-1 AAC frame: the pipeline's user muxes it so.
    assert abs(got.shape[1] / made.rate - made.frames / FPS) <= 1024 / made.rate
    waveform = torch.from_numpy(made.audio)
    _, reference = mp4_of(
        url, safetensors_bytes(latents=latents, audio=waveform), audio_sample_rate=made.rate
    )
    want, _, _ = decoded_audio(reference)
    # Float rounding apart (the server's decode runs on more threads than the test's).
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_a_decoder_from_the_vae_folder_alone_has_no_sound(made: Made) -> None:
    assert LTX2VideoDecoder.from_weights(made.folder / "vae").sound is not None  # beside it
    alone = made.folder.parent / "vae-alone"
    alone.mkdir()
    (alone / "config.json").write_bytes((made.folder / "vae" / "config.json").read_bytes())
    for weights in (made.folder / "vae").iterdir():
        if weights.suffix == ".safetensors":
            (alone / weights.name).write_bytes(weights.read_bytes())
    assert LTX2VideoDecoder.from_weights(alone).sound is None
    assert LTX2Sound.from_folder(alone) is None


@pytest.mark.slow
def test_vaecast_decode_muxes_the_sound_too(made: Made, tmp_path: Path) -> None:
    from vaecast.cli import main

    latents_file = tmp_path / "ltx2.safetensors"
    latents_file.write_bytes(
        safetensors_bytes(
            metadata={"fps": str(FPS)},
            latents=made.latents.contiguous(),
            audio_latents=made.audio_latents.contiguous(),
        )
    )
    output = tmp_path / "ltx2.mp4"
    weights = f"ltx-2={made.folder}"
    command = ["decode", str(latents_file), "-o", str(output), "--model", "ltx-2"]
    assert main([*command, "--weights", weights]) == 0
    audio, rate, frames = decoded_audio(output.read_bytes())
    assert (rate, frames, audio.shape[0]) == (made.rate, made.frames, 2)
    assert abs(audio.shape[1] / made.rate - made.frames / FPS) <= 1024 / made.rate
