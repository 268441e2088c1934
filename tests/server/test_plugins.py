"""A user's own VAE: plugins in both framework contracts, served by a real `vaecast serve`
(by `module:factory` and by entry point), a plugin that fails midway, and one whose
borrowed chunks are overwritten after each callback."""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch

from tests.helpers import safetensors_bytes, split_stream
from tests.helpers.media import decode_yuv420
from tests.helpers.plugins import LATENT_CHANNELS, reference_decode
from tests.helpers.serve_process import vaecast_serve
from tests.helpers.server import StartServer
from vaecast.codecs.quantize import yuv420_on_device
from vaecast.errors import VaecastError
from vaecast.models.registry import get_decoder

REPO_ROOT = Path(__file__).resolve().parents[2]


def plugin_latents(frames: int = 4, seed: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, LATENT_CHANNELS, frames, 8, 12, generator=generator)


def expected_planes(latents: torch.Tensor) -> np.ndarray:
    return yuv420_on_device(reference_decode(latents), (-1.0, 1.0)).numpy()


def entry_point_dir(root: Path) -> Path:
    """A path entry holding an installed distribution's metadata that registers the
    `driven` plugin under the name `my-vae` in the `vaecast.decoders` group."""
    info = root / "my_vae_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-vae-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[vaecast.decoders]\nmy-vae = tests.helpers.plugins:driven\n"
    )
    return root


@pytest.mark.slow
def test_a_served_plugin_streams_its_chunks_exactly_in_both_contracts(tmp_path: Path) -> None:
    latents = plugin_latents()
    body = safetensors_bytes(latents=latents)
    paths = os.pathsep.join([str(entry_point_dir(tmp_path / "site")), str(REPO_ROOT)])
    arguments = ["--model", "tests.helpers.plugins:temporal", "--model", "my-vae", "--crf", "0"]
    with vaecast_serve(arguments, tmp_path / "log", env={"PYTHONPATH": paths}) as url:
        for model in ("tests.helpers.plugins:temporal", "my-vae"):
            request = urllib.request.Request(
                f"{url}v1/videos/stream?model={model}", data=body, method="POST"
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                data = response.read()
            _, fragments = split_stream(data)
            assert len(fragments) == latents.shape[2], model  # a fragment per chunk
            planes = np.stack(decode_yuv420(data))
            # Lossless: the planes vaecast made of each chunk while it was borrowed,
            # not of the garbage the plugin wrote into its buffer afterwards.
            assert np.array_equal(planes, expected_planes(latents)), model


async def test_a_plugin_that_fails_midway_fails_its_job_and_the_server_goes_on(
    start_server: StartServer,
) -> None:
    server = await start_server(
        decoders={
            "broken": get_decoder("tests.helpers.plugins:failing"),
            "mine": get_decoder("tests.helpers.plugins:driven"),
        },
        default_model="broken",
    )
    body = safetensors_bytes(latents=plugin_latents(frames=5))
    async with server.client.post("/v1/videos", data=body) as response:
        assert response.status == 201
        job_id = (await response.json())["id"]
    async with server.client.get(f"/v1/videos/{job_id}/content") as response:
        with pytest.raises(aiohttp.ClientPayloadError):  # the stream ends truncated
            await response.read()
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        job = await response.json()
    assert job["status"] == "failed"
    assert job["chunks"] == {"done": 2, "total": 5}
    assert job["error"] == {
        "type": "decode_failed",
        "message": "the decoder failed: the plugin's decoder broke at latent frame 2",
    }
    async with server.client.post("/v1/videos/stream?model=mine", data=body) as response:
        assert response.status == 200
        assert len(split_stream(await response.read())[1]) == 5


async def test_a_plugin_that_breaks_its_plan_fails_its_job_with_the_reason(
    start_server: StartServer,
) -> None:
    decoder = get_decoder("tests.helpers.plugins:driven")
    decoder.inner_plan = lambda shape: (16, 24, [1, 4, 4])  # one chunk short of 4 frames
    server = await start_server(decoders={"mine": decoder}, default_model="mine")
    body = safetensors_bytes(latents=plugin_latents())
    async with server.client.post("/v1/videos/stream", data=body) as response:
        job_id = response.headers["X-Video-Id"]
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        error = (await response.json())["error"]
    assert error["message"] == (
        "the decoder failed: tests.helpers.plugins:driven broke its plan at chunk 3: "
        "(frames, height, width) (4, 16, 24), planned None"
    )


async def test_a_plugin_refuses_latents_its_plan_refuses_and_pushes(
    start_server: StartServer,
) -> None:
    server = await start_server(
        decoders={"mine": get_decoder("tests.helpers.plugins:driven")}, default_model="mine"
    )
    wrong = safetensors_bytes(latents=torch.zeros(1, 16, 2, 4, 4))
    async with server.client.post("/v1/videos", data=wrong) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == (
            "this model takes 12 latent channels, got 16"
        )
    async with server.client.post("/v1/videos", json={"input": "push"}) as response:
        push = await response.json()
    url = push["push"]["url"]
    headers = {"X-Push-Token": push["push"]["token"]}
    block = safetensors_bytes(latents=plugin_latents(frames=1)[0])
    async with server.client.post(url, data=block, headers=headers) as response:
        assert response.status == 422
        assert "decodes whole latents only" in (await response.json())["error"]["message"]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_plan", "needs plan(latent_shape) -> (height, width, chunk_frames)"),
        ("nothing_here", "'tests.helpers.plugins' has no 'nothing_here'"),
    ],
)
def test_a_plugin_that_misses_the_contract_is_refused_with_the_reason(
    factory: str, message: str
) -> None:
    with pytest.raises(VaecastError, match=re.escape(message)):
        get_decoder(f"tests.helpers.plugins:{factory}")


def test_a_plugin_whose_module_does_not_import_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vaecast.cli import main

    latents_file = tmp_path / "z.safetensors"
    latents_file.write_bytes(safetensors_bytes(latents=plugin_latents()))
    code = main(
        ["decode", str(latents_file), "-o", str(tmp_path / "x.mp4"), "--model", "nope.mod:make"]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "vaecast: error: model 'nope.mod:make': cannot import 'nope.mod': "
        "ModuleNotFoundError(\"No module named 'nope'\")\n"
    )


def test_vaecast_decode_runs_a_plugin(tmp_path: Path) -> None:
    from vaecast.cli import main

    latents = plugin_latents()
    latents_file = tmp_path / "z.safetensors"
    latents_file.write_bytes(safetensors_bytes(latents=latents))
    output = tmp_path / "x.mp4"
    arguments = ["decode", str(latents_file), "-o", str(output), "--crf", "0"]
    assert main([*arguments, "--model", "tests.helpers.plugins:driven"]) == 0
    assert np.array_equal(np.stack(decode_yuv420(output.read_bytes())), expected_planes(latents))


def test_a_plugin_server_refuses_a_missing_module_at_start(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="cannot import 'nope'"):  # noqa: SIM117
        with vaecast_serve(["--model", "nope:make"], tmp_path / "log"):
            pass
    log = (tmp_path / "log").read_text()
    assert "vaecast: error: model 'nope:make': cannot import 'nope'" in log
    assert "Traceback" not in log
