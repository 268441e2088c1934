"""`vaecast.integrations.diffusers` end to end: real diffusers pipelines of tiny random
components, called with prompt embeddings, streamed over real HTTP into a real `vaecast
serve` (a lossless encode, every tiny case's VAE served under its model's name), the
MP4's planes compared with the pipeline's own `output_type="np"` frames from the same
seed through the same 4:2:0 conversion."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL

from tests.helpers import one_torch_thread, split_stream
from tests.helpers.media import decode_yuv420
from tests.helpers.serve_process import vaecast_serve
from tests.helpers.tiny_pipelines import SEED, TinyPipelineCase, ltx, wan
from tests.integrations import generators
from vaecast.codecs.quantize import quantize_to_host, yuv420_on_device
from vaecast.integrations.diffusers import (
    PipelineError,
    forcing_schedule,
    model_for,
    stream,
    stream_autoregressive,
    stream_decoded,
    stream_sections,
    upload,
)

FAMILIES = ("wan", "hunyuan", "hunyuan15", "ltx", "cogvideox", "mochi")
CASES: list[TinyPipelineCase] = [
    case
    for family in FAMILIES
    for case in importlib.import_module(f"tests.helpers.tiny_pipelines.{family}").CASES
]
# The decoders' own exactness is their tests' (and tests/server/test_diffusers_pipelines.py's);
# here the upload must be the pipeline's latents with the right parameters: a wrong layout
# or geometry decodes to noise, far under this.
MIN_PSNR_DB = 40.0
# Frames pushed by the producer go as uint8 RGB, then 4:2:0: one rounding more than the
# server's own path from floats, so a level of difference here and there.
MAX_LEVEL_DIFFERENCE = 1
VIEWER_TIMEOUT_S = 30.0
# Refusals come before any request: nothing listens here.
NO_SERVER = "http://127.0.0.1:9"
LTX_CASE = ltx.CASES[0]  # packed tokens: a batch's geometry goes with the upload


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@dataclass(frozen=True)
class Served:
    url: str  # "http://127.0.0.1:N", no trailing slash
    folders: dict[str, Path]

    def fetch(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=60) as response:
            return response.read()

    def job(self, job_id: str) -> dict[str, Any]:
        return json.loads(self.fetch(f"/v1/videos/{job_id}"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    folders: dict[str, Path] = {}
    # One decode slot and a queue of 2 blocks (the defaults are 1 and 4): a batch's
    # second video waits for the slot while the first decodes, whatever its length.
    arguments = ["--crf", "0", "--max-queued", "16", "--push-queue-blocks", "2"]
    for case in CASES:
        if case.model in folders:  # one VAE per model: the cases of a model share theirs
            continue
        folders[case.model] = root / case.model
        case.build().vae.save_pretrained(folders[case.model])
        arguments += ["--model", case.model, "--weights", f"{case.model}={folders[case.model]}"]
    with vaecast_serve(arguments, root / "server.log") as url:
        yield Served(url.rstrip("/"), folders)


def same_vae(a: Any, b: Any) -> bool:
    left, right = a.state_dict(), b.state_dict()
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def np_frames(pipeline: Any, kwargs: dict[str, Any]) -> np.ndarray:
    generator = torch.Generator().manual_seed(SEED)
    frames = pipeline(**kwargs, output_type="np", generator=generator).frames
    return np.asarray(frames[0], dtype=np.float32)


def planes_of(frames: np.ndarray, through_uint8: bool = False) -> np.ndarray:
    """Frames (T, H, W, 3) in [0, 1] as the server's I420 planes: from the floats, as
    its decoders hand them over, or (`through_uint8`) from the uint8 RGB a frames push
    quantizes them to first."""
    video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0)
    if through_uint8:
        pixels = torch.from_numpy(quantize_to_host(video, (0.0, 1.0)))
        video = (pixels.to(torch.float32) * (1.0 / 255.0)).permute(3, 0, 1, 2).unsqueeze(0)
    return yuv420_on_device(video, (0.0, 1.0)).numpy()


def finished_planes(served: Served, job: dict[str, Any]) -> np.ndarray:
    data = served.fetch(job["urls"]["content"])  # waits for the end of a running job
    finished = served.job(job["id"])
    assert finished["status"] == "completed", finished
    _, fragments = split_stream(data)
    assert len(fragments) == finished["chunks"]["total"] > 1
    return np.stack(decode_yuv420(data))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-12))


def assert_lossless(planes: np.ndarray, expected: np.ndarray) -> None:
    assert planes.shape == expected.shape  # the pipeline's frame count and size
    assert np.abs(planes.astype(np.int16) - expected.astype(np.int16)).max() <= (
        MAX_LEVEL_DIFFERENCE
    )


class Viewer(threading.Thread):
    """Reads a job's MP4 as it grows; notes when its first fragment is complete."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.first_fragment = threading.Event()
        self.first_fragment_at: float | None = None
        self.data = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            buffer = bytearray()
            with urllib.request.urlopen(self.url, timeout=60) as response:
                while piece := response.read1(64 * 1024):
                    buffer += piece
                    if not self.first_fragment.is_set() and has_fragment(buffer):
                        self.first_fragment_at = time.perf_counter()
                        self.first_fragment.set()
            self.data = bytes(buffer)
        except BaseException as error:
            self.error = error


def has_fragment(data: bytes | bytearray) -> bool:
    """Whether `data` holds a whole `mdat` box (the first fragment's media)."""
    offset = 0
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        if size < 8 or offset + size > len(data):
            return False
        if data[offset + 4 : offset + 8] == b"mdat":
            return True
        offset += size
    return False


# stream: one upload per pipeline call.


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_pipelines_latents_stream_to_its_own_frames(served: Served, case: TinyPipelineCase):
    pipeline = case.build()
    pipeline.set_progress_bar_config(disable=True)
    expected = planes_of(np_frames(pipeline, case.call_kwargs))
    # Nothing but the pipeline call: the model, fps and geometry are stream's to find.
    job = stream(
        pipeline, served.url, generator=torch.Generator().manual_seed(SEED), **case.call_kwargs
    )
    assert job["model"] == case.model == model_for(pipeline)
    planes = finished_planes(served, job)
    assert planes.shape == expected.shape  # the pipeline's frame count and size
    assert psnr(planes, expected) > MIN_PSNR_DB


def batch_frames(pipeline: Any, kwargs: dict[str, Any]) -> list[np.ndarray]:
    generator = torch.Generator().manual_seed(SEED)
    frames = pipeline(**kwargs, output_type="np", generator=generator).frames
    return [np.asarray(video, dtype=np.float32) for video in frames]


def two_videos(case: TinyPipelineCase) -> dict[str, Any]:
    """The case's call for two videos: two per prompt, or (LTX, whose pipeline repeats
    no attention mask it is given) two prompts' embeddings."""
    kwargs = dict(case.call_kwargs)
    if case.model != "ltx-video":
        return {**kwargs, "num_videos_per_prompt": 2}
    embeds, mask = kwargs["prompt_embeds"], kwargs["prompt_attention_mask"]
    return {
        **kwargs,
        "prompt_embeds": torch.cat([embeds, embeds.flip(-1)]),
        "prompt_attention_mask": torch.cat([mask, mask]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", [wan.CASES[0], LTX_CASE], ids=["wan2.1", "ltx-video"])
def test_a_batch_makes_a_job_per_video_each_its_entry_alone(served: Served, case: TinyPipelineCase):
    pipeline = case.build()
    pipeline.set_progress_bar_config(disable=True)
    kwargs = two_videos(case)
    expected = [planes_of(frames) for frames in batch_frames(pipeline, kwargs)]
    generator = torch.Generator().manual_seed(SEED)
    latents = pipeline(**kwargs, output_type="latent", generator=generator).frames
    jobs = stream(pipeline, served.url, generator=torch.Generator().manual_seed(SEED), **kwargs)
    assert isinstance(jobs, list) and len(jobs) == 2 and jobs[0]["id"] != jobs[1]["id"]
    videos = [finished_planes(served, job) for job in jobs]
    query = {"model": case.model, "fps": "16", **pipeline_geometry(kwargs)}
    for index, video in enumerate(videos):
        alone = upload(served.url, latents[index : index + 1], query)
        assert isinstance(alone, dict)
        assert np.array_equal(video, finished_planes(served, alone))
        assert psnr(video, expected[index]) > MIN_PSNR_DB
    assert not np.array_equal(videos[0], videos[1])  # two videos, not one twice


def pipeline_geometry(kwargs: dict[str, Any]) -> dict[str, str]:
    return {name: str(kwargs[name]) for name in ("num_frames", "height", "width")}


@pytest.mark.slow
def test_a_self_decoding_batch_pushes_each_video(served: Served):
    case = wan.CASES[0]
    pipeline = case.build()
    pipeline.set_progress_bar_config(disable=True)
    expected = [
        planes_of(frames, through_uint8=True) for frames in batch_frames(pipeline, two_videos(case))
    ]
    opened: list[str] = []
    jobs = stream_decoded(
        pipeline,
        served.url,
        on_job=lambda job: opened.append(job["id"]),
        generator=torch.Generator().manual_seed(SEED),
        num_videos_per_prompt=2,
        **case.call_kwargs,
    )
    assert isinstance(jobs, list) and [job["id"] for job in jobs] == opened
    for job, video in zip(jobs, expected, strict=True):
        planes = finished_planes(served, job)
        assert planes.shape == video.shape
        assert psnr(planes, video) > MIN_PSNR_DB


def test_vaecasts_own_arguments_are_refused_before_the_pipeline_runs():
    pipeline = wan.wan21()
    pipeline.transformer = None  # running it would fail otherwise
    for name, value in (("output_type", "np"), ("return_dict", False)):
        with pytest.raises(PipelineError, match=f"{name} is vaecast's to set"):
            stream(pipeline, NO_SERVER, **wan.CASES[0].call_kwargs, **{name: value})
    with pytest.raises(PipelineError, match="got an unexpected keyword argument 'steps'"):
        stream(pipeline, NO_SERVER, steps=3)


def image_vae_pipeline() -> Any:
    """A real WanPipeline over an image VAE (`AutoencoderKL`), which vaecast does not
    decode; no transformer, so that running it would fail deep inside."""
    pipeline = wan.wan21()
    pipeline.vae = AutoencoderKL(
        block_out_channels=(8,),
        norm_num_groups=4,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
    )
    pipeline.transformer = None
    return pipeline


@pytest.mark.parametrize(
    ("function", "pipeline", "message"),
    [
        (stream, image_vae_pipeline, "WanPipeline's VAE is AutoencoderKL, which vaecast does not"),
        (stream_decoded, image_vae_pipeline, "VAE is AutoencoderKL, which vaecast does not decode"),
        (stream, object, "returns latents: object has no __call__ that takes output_type"),
        (
            stream_autoregressive,
            wan.wan21,
            "stream_autoregressive streams a SkyReelsV2DiffusionForcingPipeline, not a WanPipeline",
        ),
        (
            stream_sections,
            wan.wan21,
            "stream_sections streams a HunyuanVideoFramepackPipeline, not a WanPipeline",
        ),
    ],
    ids=["stream-image-vae", "decoded-image-vae", "not-a-pipeline", "skyreels", "framepack"],
)
def test_an_unsupported_pipeline_is_refused_with_what_vaecast_takes(
    function: Any, pipeline: Any, message: str
):
    with pytest.raises(PipelineError, match=re.escape(message)):
        function(pipeline(), NO_SERVER, **wan.CASES[0].call_kwargs)


# SkyReels-V2 diffusion forcing: latent frames pushed the moment they are final.


def skyreels() -> Any:
    pipeline = generators.skyreels_df()
    assert same_vae(pipeline.vae, wan.wan21().vae)  # the served wan2.1 VAE decodes it
    return pipeline


def last_changes(pipeline: Any, kwargs: dict[str, Any]) -> list[list[int]]:
    """Per window, each latent frame's last row (after the first) that changed it, as
    the pipeline runs; -1 where none did."""
    windows: list[list[int]] = []
    previous: list[torch.Tensor] = []

    def watch(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict:
        latents = callback_kwargs["latents"]
        if step == 0:
            windows.append([-1] * latents.shape[2])
        else:
            changed = (latents != previous[0]).any(dim=4).any(dim=3).any(dim=1).any(dim=0)
            for frame in changed.nonzero().flatten().tolist():
                windows[-1][frame] = step
        previous[:] = [latents.clone()]
        return {}

    generator = torch.Generator().manual_seed(SEED)
    pipeline(**kwargs, output_type="latent", generator=generator, callback_on_step_end=watch)
    return windows


@pytest.mark.parametrize(
    "changes",
    [{}, generators.SKYREELS_LONG, generators.SKYREELS_LONG_BLOCKS],
    ids=["short", "two-windows", "blocks-of-2"],
)
def test_the_schedule_is_when_the_pipeline_last_changes_each_frame(changes: dict[str, Any]):
    pipeline = skyreels()
    kwargs = generators.skyreels_call(**changes)
    schedule = forcing_schedule(pipeline, **kwargs)
    observed = last_changes(pipeline, kwargs)
    assert [list(window.final_row) for window in schedule] == observed
    assert len(schedule) == {0: 1, 3: 2, 5: 3}[len(changes)]


@pytest.mark.slow
def test_skyreels_df_is_watched_while_later_blocks_are_still_denoised(served: Served):
    pipeline = skyreels()
    kwargs = generators.skyreels_call()
    expected = planes_of(np_frames(pipeline, kwargs))
    schedule = forcing_schedule(pipeline, **kwargs)[0]
    first_final = schedule.final_row[0]
    assert schedule.final_row[-1] > first_final + 1  # blocks finish at different rows
    viewers: list[Viewer] = []
    rows: list[tuple[int, float]] = []

    def on_job(job: dict[str, Any]) -> None:
        viewers.append(Viewer(served.url + job["urls"]["content"]))
        viewers[0].start()

    def callback(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict:
        if step == first_final + 1:  # the first block went out at the row before
            assert viewers[0].first_fragment.wait(VIEWER_TIMEOUT_S), viewers[0].error
        rows.append((step, time.perf_counter()))
        return {}

    job = stream_autoregressive(
        pipeline,
        served.url,
        on_job=on_job,
        generator=torch.Generator().manual_seed(SEED),
        callback_on_step_end=callback,
        **kwargs,
    )
    viewer = viewers[0]
    viewer.join(60)
    assert viewer.error is None and viewer.first_fragment_at is not None
    # The viewer had its first fragment while the pipeline was still denoising the
    # later blocks: before the row that finished the last one.
    last_row_at = dict(rows)[schedule.final_row[-1]]
    assert viewer.first_fragment_at < last_row_at
    assert job["model"] == "wan2.1"
    assert_lossless(np.stack(decode_yuv420(viewer.data)), expected)
    assert finished_planes(served, job).shape == expected.shape


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [generators.SKYREELS_LONG, generators.SKYREELS_LONG_BLOCKS],
    ids=["two-windows", "blocks-of-2"],
)
def test_a_long_skyreels_video_pushes_each_latent_frame_once(
    served: Served, changes: dict[str, Any]
):
    pipeline = skyreels()
    kwargs = generators.skyreels_call(**changes)
    expected = planes_of(np_frames(pipeline, kwargs))
    job = stream_autoregressive(
        pipeline, served.url, generator=torch.Generator().manual_seed(SEED), **kwargs
    )
    planes = finished_planes(served, job)
    # The overlap went once: as many frames as the pipeline's video, and the same ones.
    assert planes.shape[0] == changes["num_frames"]
    assert_lossless(planes, expected)


@pytest.mark.slow
def test_a_skyreels_batch_is_one_push_session_of_two_videos(served: Served):
    pipeline = skyreels()
    kwargs = generators.skyreels_call(**generators.SKYREELS_LONG, num_videos_per_prompt=2)
    expected = [planes_of(frames) for frames in batch_frames(pipeline, kwargs)]
    opened: list[str] = []
    jobs = stream_autoregressive(
        pipeline,
        served.url,
        on_job=lambda job: opened.append(job["id"]),
        generator=torch.Generator().manual_seed(SEED),
        **kwargs,
    )
    assert isinstance(jobs, list) and [job["id"] for job in jobs] == opened
    assert len(set(opened)) == 2
    for job, video in zip(jobs, expected, strict=True):
        assert_lossless(finished_planes(served, job), video)
    assert not np.array_equal(expected[0], expected[1])


# FramePack: sections of frames, as they are made.


@pytest.mark.slow
def test_framepack_sections_are_watched_as_they_are_made(served: Served):
    pipeline = generators.framepack()
    kwargs = generators.framepack_call()
    expected = planes_of(np_frames(pipeline, kwargs), through_uint8=True)
    viewers: list[Viewer] = []
    calls: list[float] = []

    def on_job(job: dict[str, Any]) -> None:
        viewers.append(Viewer(served.url + job["urls"]["content"]))
        viewers[0].start()

    def callback(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict:
        if len(calls) == 2 * kwargs["num_inference_steps"]:  # the third section's first step
            assert viewers[0].first_fragment.wait(VIEWER_TIMEOUT_S), viewers[0].error
        calls.append(time.perf_counter())
        return {}

    job = stream_sections(
        pipeline,
        served.url,
        on_job=on_job,
        generator=torch.Generator().manual_seed(SEED),
        callback_on_step_end=callback,
        **kwargs,
    )
    viewers[0].join(60)
    assert viewers[0].first_fragment_at is not None
    assert viewers[0].first_fragment_at < calls[-1]  # before the last section was denoised
    planes = finished_planes(served, job)
    assert planes.shape[0] == 37  # 3 sections of 3 latent frames: 4 * 9 + 1
    assert_lossless(planes, expected)


def test_framepack_is_refused_where_its_sections_are_not_in_order():
    pipeline = generators.framepack()
    kwargs = generators.framepack_call()
    with pytest.raises(PipelineError, match="only sampling_type='vanilla'"):
        stream_sections(
            pipeline, NO_SERVER, **{**kwargs, "sampling_type": "inverted_anti_drifting"}
        )
    with pytest.raises(PipelineError, match="use stream_sections"):
        stream(pipeline, NO_SERVER, **kwargs)


# The producer decodes and pushes frames.


@pytest.mark.slow
@pytest.mark.parametrize("family", ["wan", "hunyuan"])
def test_a_self_decoding_producer_pushes_the_pipelines_frames(served: Served, family: str):
    case = importlib.import_module(f"tests.helpers.tiny_pipelines.{family}").CASES[0]
    pipeline = case.build()
    pipeline.set_progress_bar_config(disable=True)
    expected = planes_of(np_frames(pipeline, case.call_kwargs), through_uint8=True)
    job = stream_decoded(
        pipeline, served.url, generator=torch.Generator().manual_seed(SEED), **case.call_kwargs
    )
    planes = finished_planes(served, job)
    assert planes.shape == expected.shape
    assert psnr(planes, expected) > MIN_PSNR_DB


# The examples, as a user runs them.


SIZED = ["--num-frames", "9", "--height", "32", "--width", "48", "--steps", "1"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arguments", "videos", "frames", "size"),
    [
        (["diffusers_stream.py", "--videos", "2"], 2, 13, (16, 16)),
        (["diffusers_stream.py", "--decode-here"], 1, 13, (16, 16)),
        (["diffusers_stream.py", *SIZED], 1, 9, (48, 32)),
        (["skyreels_autoregressive.py"], 1, 25, (16, 16)),
        (["skyreels_autoregressive.py", "--num-frames", "21", "--width", "32"], 1, 21, (32, 16)),
        (["framepack_sections.py"], 1, 37, (32, 32)),
    ],
    ids=[
        "diffusers_stream",
        "decode_here",
        "diffusers_stream_sized",
        "skyreels_autoregressive",
        "skyreels_sized",
        "framepack_sections",
    ],
)
def test_each_example_runs_against_a_real_server(
    served: Served, arguments: list[str], videos: int, frames: int, size: tuple[int, int]
):
    """With --tiny-random, as a user runs them; a size flag given is the size made."""
    # The server decodes with the served tiny Wan VAE: the examples' must be it.
    assert same_vae(generators.tiny_random.wan_vae(), wan.wan21().vae)
    script, *options = arguments
    result = subprocess.run(
        [
            sys.executable,
            str(generators.EXAMPLES / script),
            "--tiny-random",
            "--url",
            served.url,
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=100,
        # As a user runs it with vaecast installed: the repository importable.
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(generators.EXAMPLES.parent)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    watched = [line.split("watch: ")[1] for line in lines if "watch: " in line]
    ids = [line.split()[1] for line in lines if line.startswith("job ")]
    assert len(ids) == len(watched) == videos, result.stdout
    for job_id, url in zip(ids, watched, strict=True):
        assert url == f"{served.url}/v1/videos/{job_id}/content"
        served.fetch(f"/v1/videos/{job_id}/content")  # waits for the end
        job = served.job(job_id)
        assert job["status"] == "completed" and job["frames"] == frames, job
        assert (job["width"], job["height"]) == size, job
