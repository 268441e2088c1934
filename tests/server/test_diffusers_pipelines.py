"""Every diffusers video pipeline vaecast serves, end to end: the real pipeline class of
tiny random components, run twice from one seed (latents, then frames); its latents,
exactly as returned, streamed through a real `vaecast serve` of its saved VAE with a
lossless encode; the MP4's planes equal to the pipeline's own frames through the same
4:2:0 conversion."""

from __future__ import annotations

import importlib
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlencode

import numpy as np
import pytest
import torch

from tests.helpers import one_torch_thread, safetensors_bytes, split_stream
from tests.helpers.media import decode_yuv420
from tests.helpers.serve_process import vaecast_serve
from tests.helpers.tiny_pipelines import CaseRun, TinyPipelineCase, run_case
from vaecast.codecs.quantize import yuv420_on_device

FAMILIES = ("wan", "hunyuan", "hunyuan15", "ltx", "cogvideox", "mochi")
# The models whose stream is not exact, and the PSNR (dB, of the planes) they keep
# against the pipeline's frames; the others differ by rounding alone.
APPROXIMATE_MIN_PSNR_DB: dict[str, float] = {}
# Exact models: float noise (~1e-6) may move a value across a rounding boundary.
MAX_LEVEL_DIFFERENCE = 1
MAX_DIFFERENT_FRACTION = 0.002


def all_cases() -> list[TinyPipelineCase]:
    cases: list[TinyPipelineCase] = []
    for family in FAMILIES:
        cases += importlib.import_module(f"tests.helpers.tiny_pipelines.{family}").CASES
    return cases


CASES = all_cases()


@dataclass(frozen=True)
class Served:
    url: str
    runs: dict[str, CaseRun]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("pipelines")
    runs: dict[str, CaseRun] = {}
    arguments = ["--crf", "0", "--max-queued", "16"]
    with one_torch_thread():
        for case in CASES:
            run = run_case(case)
            runs[case.model] = run
            folder = root / case.model
            run.pipeline.vae.save_pretrained(folder)
            # The first through --model diffusers: the folder's config names the model.
            model = "diffusers" if case is CASES[0] else case.model
            arguments += ["--model", model, "--weights", f"{model}={folder}"]
    with vaecast_serve(arguments, root / "server.log") as url:
        yield Served(url, runs)


def expected_planes(frames: np.ndarray) -> np.ndarray:
    """The pipeline's frames, (T, H, W, 3) in [0, 1], as vaecast's I420 planes."""
    video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0)
    return yuv420_on_device(video, (0.0, 1.0)).numpy()


def post(url: str, data: bytes) -> dict[str, object]:
    request = urllib.request.Request(url, data=data, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_pipelines_latents_stream_to_its_own_frames(served: Served, case: TinyPipelineCase):
    run = served.runs[case.model]
    query = urlencode({"model": case.model, "fps": "16", **case.params})
    job = post(
        f"{served.url}v1/videos?{query}", safetensors_bytes(latents=run.latents.contiguous())
    )
    with urllib.request.urlopen(f"{served.url}v1/videos/{job['id']}/content", timeout=60) as r:
        data = r.read()
    with urllib.request.urlopen(f"{served.url}v1/videos/{job['id']}", timeout=10) as r:
        job = json.loads(r.read())
    assert job["status"] == "completed", job
    _, fragments = split_stream(data)
    assert len(fragments) == job["chunks"]["total"] > 1
    timings = job["timings"]
    # The first fragment was in the log while chunks were still being decoded.
    assert timings["time_to_first_fragment_s"] < timings["total_s"]
    planes = np.stack(decode_yuv420(data))
    expected = expected_planes(run.frames)
    assert planes.shape == expected.shape  # the pipeline's frame count and size
    difference = np.abs(planes.astype(np.int16) - expected.astype(np.int16))
    if case.model in APPROXIMATE_MIN_PSNR_DB:
        mse = float(np.mean(difference.astype(np.float64) ** 2))
        psnr = 10 * np.log10(255.0**2 / max(mse, 1e-12))
        assert psnr > APPROXIMATE_MIN_PSNR_DB[case.model], psnr
    else:
        assert difference.max() <= MAX_LEVEL_DIFFERENCE
        assert np.mean(difference > 0) <= MAX_DIFFERENT_FRACTION


def test_every_diffusers_video_vae_has_a_pipeline_case() -> None:
    from vaecast.models.registry import DIFFUSERS_CLASSES

    served_models = {case.model for case in CASES}
    assert set(DIFFUSERS_CLASSES.values()) - {"minimax-h3"} <= served_models
