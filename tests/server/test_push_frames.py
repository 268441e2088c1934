"""Frames push sessions: producers that decode on their own push RGB frames, encoded,
fanned out and refused exactly as latent pushes are; and crops to a requested size."""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import decode_mp4, safetensors_bytes
from tests.helpers.media import decode_yuv420, gradient_frames
from tests.helpers.server import TEST_CONFIG, Server, StartServer
from vaecast.client import AsyncPushSession, PushError, PushSession
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.quantize import yuv420_on_device
from vaecast.job.views import job_object

LOSSLESS = replace(EncoderSettings(), crf=0)
# Float noise may move a value across a rounding boundary; nothing else differs.
MAX_LEVEL_DIFFERENCE = 1


def planes_of(frames: np.ndarray) -> np.ndarray:
    """uint8 (T, H, W, 3) as the I420 planes vaecast encodes."""
    video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0).float() / 255
    return yuv420_on_device(video, (0.0, 1.0)).numpy()


def assert_same_pixels(data: bytes, frames: np.ndarray) -> None:
    planes = np.stack(decode_yuv420(data))
    expected = planes_of(frames)
    assert planes.shape == expected.shape
    difference = np.abs(planes.astype(np.int16) - expected.astype(np.int16))
    assert difference.max() <= MAX_LEVEL_DIFFERENCE


async def test_a_producer_pushes_frames_and_a_viewer_plays_before_the_last_block(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = await start_server(encoder=LOSSLESS)
    frames = gradient_frames(12, width=64, height=48)
    session = await asyncio.to_thread(PushSession(server.url, kind="frames", fps=16).open)
    await asyncio.to_thread(session.push, frames[:4])
    async with server.client.get(session.content_url.removeprefix(server.url)) as viewer:
        first = await asyncio.wait_for(viewer.content.read(1), 30)
        job = server.manager.get(session.id)
        assert first and not job.feed.ended  # playing while blocks are still to come
        await asyncio.to_thread(session.push, torch.from_numpy(frames[4:8]))
        await asyncio.to_thread(session.push, frames[8:], final=True)
        streamed = first + await viewer.read()
    await asyncio.to_thread(session.close)
    assert job_object(job.record)["status"] == "completed"
    assert job_object(job.record)["chunks"] == {"done": 3, "total": 3}
    assert_same_pixels(streamed, frames)
    path = tmp_path / "frames.mp4"
    path.write_bytes(streamed)
    probe = await asyncio.to_thread(
        subprocess.run,
        [
            "ffprobe",
            "-v",
            "error",
            "-count_frames",
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=nb_read_frames,width,height",
            "-of",
            "json",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    stream = json.loads(probe.stdout)["streams"][0]
    assert (int(stream["nb_read_frames"]), stream["width"], stream["height"]) == (12, 64, 48)


async def test_float_frames_in_a_declared_range_and_blocks_of_other_sizes(
    start_server: StartServer,
) -> None:
    server = await start_server(encoder=LOSSLESS)
    frames = gradient_frames(10, width=32, height=32)
    video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0).float() / 255 * 2 - 1
    async with AsyncPushSession(
        server.url, kind="frames", fps=8, value_range=(-1.0, 1.0)
    ) as session:
        # 4, then 2 and 4: chunks of the first block's 4 frames, the rest at the end.
        for start, stop in ((0, 4), (4, 6), (6, 10)):
            await session.push(video[:, :, start:stop])
        job_id = session.id
    async with server.client.get(f"/v1/videos/{job_id}/content") as response:
        data = await response.read()
    assert job_object(server.manager.get(job_id).record)["chunks"] == {"done": 3, "total": 3}
    assert_same_pixels(data, frames)


async def open_frames(server: Server, **fields: Any) -> tuple[str, dict[str, str]]:
    body = {"input": "push", "kind": "frames", **fields}
    async with server.client.post("/v1/videos", json=body) as response:
        assert response.status == 201, await response.text()
        job = await response.json()
    return job["push"]["url"], {"X-Push-Token": job["push"]["token"]}


async def push(server: Server, url: str, headers: dict[str, str], **tensors: Any) -> Any:
    async with server.client.post(url, data=safetensors_bytes(**tensors), headers=headers) as r:
        return r.status, (await r.json())


def rgb(frames: int, height: int = 16, width: int = 16, dtype: torch.dtype = torch.uint8):
    return torch.zeros(frames, height, width, 3, dtype=dtype)


@pytest.mark.parametrize(
    ("blocks", "status", "message"),
    [
        (
            [rgb(2), rgb(2, dtype=torch.int16)],
            422,
            "frames must be uint8 RGB (T, H, W, 3) or floats (1, 3, T, H, W), got int16",
        ),
        (
            [rgb(2), rgb(2, width=32)],
            422,
            "this block's frames are 3x16x32 (C x H x W); the session's first block fixed 3x16x16",
        ),
        (
            [rgb(2), torch.zeros(1, 3, 2, 16, 16)],
            422,
            "this block's frames are float32; the session's first block was uint8",
        ),
        (
            [rgb(2), torch.zeros(2, 16, 16, 4, dtype=torch.uint8)],
            422,
            "frames must be (T, H, W, 3) or (1, 3, T, H, W), got (2, 16, 16, 4)",
        ),
        ([torch.zeros(1, 4, 2, 16, 16)], 422, "frames must be RGB (3 channels), got 4"),
        (
            [rgb(1, height=65, width=63)],
            422,
            "frames must have an even width and height (H.264 4:2:0), got 63x65",
        ),
        (
            [rgb(1, height=1, width=1)],
            422,
            "frames must have an even width and height (H.264 4:2:0), got 1x1",
        ),
        ([torch.full((1, 3, 1, 16, 16), float("nan"))], 422, "frames contain NaN"),
        ([rgb(2), rgb(30)], 413, "the session's frames are 32 frames; this server allows 24"),
        (
            [rgb(1, height=64, width=64)],
            413,
            "the session's frames are 64x64 frames; this server allows 1024 pixels per frame",
        ),
    ],
)
async def test_a_frames_session_refuses_what_a_latent_session_would(
    start_server: StartServer, blocks: list[torch.Tensor], status: int, message: str
) -> None:
    limits = replace(TEST_CONFIG.limits, max_frames=24, max_pixels_per_frame=1024)
    server = await start_server(limits=limits)
    url, headers = await open_frames(server)
    *accepted, refused = blocks
    for block in accepted:
        assert (await push(server, url, headers, frames=block))[0] == 202
    got_status, answer = await push(server, url, headers, frames=refused)
    assert got_status == status, answer
    assert message in answer["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "pixels"}, "kind must be one of latents, frames, got 'pixels'"),
        ({"model": "linear"}, "a frames session decodes nothing: it takes no model"),
        ({"value_range": [1, 0]}, "value_range must be [low, high]"),
        ({"value_range": [0, "1"]}, "value_range must be [low, high]"),
        ({"value_range": [0, 1e300]}, "value_range must be [low, high]"),
        ({"width": 33, "height": 16}, "width must be an even number of pixels"),
        ({"width": 32}, "a crop needs both width and height"),
        ({"width": "9" * 5000, "height": 16}, "width"),
    ],
)
async def test_bad_frames_sessions_are_refused_with_the_reason(
    start_server: StartServer, fields: dict[str, Any], message: str
) -> None:
    server = await start_server()
    body = {"input": "push", "kind": "frames", **fields}
    async with server.client.post("/v1/videos", json=body) as response:
        assert response.status == 422
        assert message in (await response.json())["error"]["message"]
    async with server.client.post(
        "/v1/videos", json={"input": "push", "value_range": [0, 1]}
    ) as response:
        assert (await response.json())["error"]["message"] == (
            'value_range is for frames sessions ("kind": "frames")'
        )


async def test_a_crop_keeps_the_top_left_of_frames_and_of_decoded_latents(
    start_server: StartServer,
) -> None:
    server = await start_server(encoder=LOSSLESS)
    frames = gradient_frames(4, width=64, height=48)
    with_client = await asyncio.to_thread(
        lambda: PushSession(server.url, kind="frames", fps=8, width=40, height=28).open()
    )
    await asyncio.to_thread(with_client.push, frames, final=True)
    async with server.client.get(f"/v1/videos/{with_client.id}/content") as response:
        data = await response.read()
    assert_same_pixels(data, np.ascontiguousarray(frames[:, :28, :40]))
    # Larger than the frames: refused at the first block, with the reason.
    url, headers = await open_frames(server, width=80, height=48)
    status, answer = await push(server, url, headers, frames=torch.from_numpy(frames))
    assert status == 422
    assert answer["error"]["message"] == (
        "the requested 80x48 is larger than the decoded 64x48 frames; a crop keeps the "
        "top-left part of them"
    )
    # An upload of latents, cut the same way (linear: 2x the latent size).
    latents = torch.rand(1, 16, 2, 8, 12) * 2 - 1
    async with server.client.post(
        "/v1/videos/stream?width=20&height=14", data=safetensors_bytes(latents=latents)
    ) as response:
        assert response.status == 200
        planes = decode_yuv420(await response.read())
    assert planes[0].shape == (14 * 3 // 2, 20)
    with pytest.raises(PushError, match="422"):
        await asyncio.to_thread(
            lambda: PushSession(server.url, kind="frames", width=3, height=4).open()
        )


async def test_the_smallest_even_frames_play(start_server: StartServer) -> None:
    """What the push takes, the encoder takes: 2x2 is the smallest 4:2:0 frame."""
    server = await start_server()
    url, headers = await open_frames(server)
    status, answer = await push(server, url, headers, frames=rgb(3, height=2, width=2))
    assert status == 202, answer
    async with server.client.post(url, headers=headers, params={"final": "1"}) as response:
        assert response.status == 202, await response.text()
    job = server.manager.get(url.split("/")[3])
    await asyncio.wait_for(job.wait(), 30)
    assert job_object(job.record)["status"] == "completed"
    async with server.client.get(f"/v1/videos/{job.id}/content") as response:
        assert len(decode_mp4(await response.read())) == 3
