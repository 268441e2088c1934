"""Bad requests get a JSON error with a reason and a 4xx status, and the server carries on."""

from __future__ import annotations

import asyncio
import io
import json
import pickle
import shutil
import subprocess

import numpy as np
import pytest
import torch

from tests.helpers import decode_mp4, psnr, safetensors_bytes, smooth_latents
from tests.helpers.files import npy_with_header, padded_safetensors, torch_save_bytes
from tests.helpers.server import StartServer
from vaecast.server.config import Limits

SAFE_HINT = "save it with safetensors: safetensors.torch.save_file({'latents': z}, 'z.safetensors')"


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def truncated_safetensors() -> bytes:
    whole = safetensors_bytes(latents=smooth_latents(frames=2))
    return whole[:-10]


GOOD = smooth_latents(frames=2)
GOOD_NPY_HEADER = "{'descr': '<f4', 'fortran_order': False, 'shape': (16, 2, 6, 8), }\n"
RATE_MESSAGE = "audio_sample_rate must be an integer from 16000 to 48000 Hz, got "

CASES = [
    # (id, body, query, status, type, message)
    (
        "not-a-tensor-file",
        b"hello, world",
        "",
        415,
        "unsupported_media_type",
        f"the upload is not a safetensors or .npy file; {SAFE_HINT}",
    ),
    (
        "pickle",
        pickle.dumps({"latents": GOOD}),
        "",
        415,
        "unsupported_media_type",
        f"pickle and torch.save files are refused (loading them can run code); {SAFE_HINT}",
    ),
    (
        "torch-save",
        torch_save_bytes({"latents": GOOD}),
        "",
        415,
        "unsupported_media_type",
        f"pickle and torch.save files are refused (loading them can run code); {SAFE_HINT}",
    ),
    ("empty", b"", "", 422, "invalid_request", f"the upload is empty; {SAFE_HINT}"),
    (
        "missing-latents",
        safetensors_bytes(z=GOOD),
        "",
        422,
        "invalid_request",
        "the safetensors file has no tensor named 'latents' (found: z)",
    ),
    (
        "wrong-rank",
        safetensors_bytes(latents=torch.zeros(16, 2, 4)),
        "",
        422,
        "invalid_request",
        "latents must be CTHW or BCTHW, got 3 dimensions (16, 2, 4)",
    ),
    (
        "batch-past-the-servers-places",  # a batch of B makes B jobs: 9 places here
        safetensors_bytes(latents=torch.zeros(10, 16, 1, 1, 1)),
        "",
        413,
        "payload_too_large",
        "a batch of 10 videos is more than this server takes at once (9)",
    ),
    (
        "integer-dtype",
        safetensors_bytes(latents=torch.zeros(16, 2, 4, 4, dtype=torch.int64)),
        "",
        422,
        "invalid_request",
        "latents must be floating point, got int64",
    ),
    (
        "nan",
        safetensors_bytes(latents=torch.full((16, 2, 4, 4), float("nan"))),
        "",
        422,
        "invalid_request",
        "latents contain NaN or infinite values",
    ),
    (
        "inf",
        safetensors_bytes(latents=torch.full((16, 2, 4, 4), float("inf"))),
        "",
        422,
        "invalid_request",
        "latents contain NaN or infinite values",
    ),
    (
        "zero-frames",
        safetensors_bytes(latents=torch.zeros(16, 0, 4, 4)),
        "",
        422,
        "invalid_request",
        "latents have zero frames",
    ),
    (
        "wrong-channels",
        safetensors_bytes(latents=torch.zeros(4, 2, 4, 4)),
        "",
        422,
        "invalid_request",
        "this model takes 16 latent channels, got 4",
    ),
    (
        "corrupt-safetensors",
        truncated_safetensors(),
        "",
        415,
        "unsupported_media_type",
        None,
    ),  # the message carries safetensors' own wording; checked for its prefix below
    (
        "npy-object-array",
        npy_bytes(np.array([{"a": 1}], dtype=object)),
        "",
        415,
        "unsupported_media_type",
        None,
    ),
    (
        "unknown-model",
        safetensors_bytes(latents=GOOD),
        "model=wan9",
        404,
        "model_not_found",
        "model 'wan9' is not served here; this server serves: linear",
    ),
    (
        "bad-fps",
        safetensors_bytes(latents=GOOD),
        "fps=fast",
        422,
        "invalid_request",
        "fps must be a number or a ratio like 30000/1001, got 'fast'",
    ),
    (
        "fps-out-of-range",
        safetensors_bytes(latents=GOOD),
        "fps=0",
        422,
        "invalid_request",
        "fps must be between 1 and 240, got 0",
    ),
    (
        "too-many-frames",
        safetensors_bytes(latents=torch.zeros(16, 4, 2, 2)),
        "",
        413,
        "payload_too_large",
        "the latents decode to 13 frames; this server allows 12",
    ),
    (
        "too-many-pixels",
        safetensors_bytes(latents=torch.zeros(16, 1, 8, 9)),
        "",
        413,
        "payload_too_large",
        "the latents decode to 72x64 frames; this server allows 4096 pixels per frame",
    ),
    (
        "npy-header-truncated",
        npy_bytes(GOOD[0].numpy())[:40],
        "",
        415,
        "unsupported_media_type",
        "the .npy file is corrupt: its header is truncated",
    ),
    (
        "npy-huge-shape",
        npy_with_header(
            GOOD_NPY_HEADER.replace("(16, 2, 6, 8)", "(16, 1000000000000000, 1, 1)"),
            GOOD[0].numpy().tobytes(),
        ),
        "",
        415,
        "unsupported_media_type",
        "the .npy file is corrupt: its header declares shape (16, 1000000000000000, 1, 1) "
        "of <f4, more than 6144 bytes of data, but the file holds 6144",
    ),
    (
        "audio-rate-superscript-two",
        safetensors_bytes({"audio_sample_rate": "\u00b2"}, latents=GOOD, audio=torch.zeros(99)),
        "",
        422,
        "invalid_request",
        f"{RATE_MESSAGE}'\u00b2'",
    ),
    (
        "audio-rate-5000-digits",
        safetensors_bytes({"audio_sample_rate": "4" * 5000}, latents=GOOD, audio=torch.zeros(99)),
        "",
        422,
        "invalid_request",
        f"{RATE_MESSAGE}'{'4' * 40}...'",
    ),
]

LIMITS = Limits(max_upload_bytes=200_000, max_frames=12, max_pixels_per_frame=64 * 64)


@pytest.mark.parametrize("endpoint", ["/v1/videos", "/v1/videos/stream"])
async def test_each_bad_upload_gets_its_status_and_reason(start_server: StartServer, endpoint):
    server = await start_server(limits=LIMITS)
    for case_id, body, query, status, error_type, message in CASES:
        url = f"{endpoint}?{query}" if query else endpoint
        async with server.client.post(url, data=body) as response:
            assert response.status == status, case_id
            assert response.content_type == "application/json", case_id
            error = (await response.json())["error"]
        assert error["type"] == error_type, case_id
        if message is not None:
            assert error["message"] == message, case_id
        else:
            assert error["message"].startswith(
                ("the safetensors file is corrupt: ", "the .npy file cannot be read safely: ")
            ), case_id
    # The server keeps serving after all of that.
    latents = smooth_latents(frames=2, height=4, width=4)
    async with server.client.post(
        "/v1/videos/stream", data=safetensors_bytes(latents=latents)
    ) as response:
        assert response.status == 200
        assert len(decode_mp4(await response.read())) == 5
    # No bad request left a job behind.
    assert [job.record.status for job in server.manager.jobs.values()] == ["completed"]


async def curl_post(url: str, flag: str, path, out) -> int:
    """POST the file at `path` with the real curl and `flag`; the HTTP status."""
    command = ["curl", "-sS", "--max-time", "60", "-o", str(out), "-w", "%{http_code}"]
    answer = await asyncio.to_thread(
        subprocess.run,
        [*command, flag, f"@{path}", url],
        capture_output=True,
        text=True,
        check=True,
        timeout=90,
    )
    return int(answer.stdout)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl binary")
async def test_a_file_sent_with_curl_d_is_refused_with_a_pointer_at_data_binary(
    start_server: StartServer, tmp_path
):
    """`curl -d @file` drops the file's line breaks; the refusal says what to send."""
    server = await start_server()
    path, out = tmp_path / "z.safetensors", tmp_path / "answer"
    body = safetensors_bytes(latents=smooth_latents(frames=2, height=4, width=4))
    assert b"\n" in body  # a file that curl -d changes
    path.write_bytes(body)
    url = f"{server.url}/v1/videos/stream"
    assert await curl_post(url, "-d", path, out) == 415
    assert json.loads(out.read_bytes())["error"]["message"].endswith(
        "; sent as a form (curl -d strips line breaks from a file): send the file's bytes "
        "as they are, with curl --data-binary @file"
    )
    assert await curl_post(url, "--data-binary", path, out) == 200
    assert len(decode_mp4(out.read_bytes())) == 5


async def test_upload_over_the_size_limit_is_413_without_reading_it_all(start_server):
    server = await start_server(limits=LIMITS)
    async with server.client.post("/v1/videos", data=b"\0" * 300_000) as response:
        assert response.status == 413
        assert (await response.json())["error"] == {
            "type": "payload_too_large",
            "message": "the upload is over this server's limit of 200000 bytes",
        }

    async def unsized_body():
        for _ in range(30):
            yield b"\0" * 10_000

    async with server.client.post("/v1/videos/stream", data=unsized_body()) as response:
        assert response.status == 413


async def test_multipart_without_a_file_part_is_422(start_server: StartServer):
    server = await start_server()
    async with server.client.post(
        "/v1/videos", data={"fps": "16", "file_": io.BytesIO(b"x")}
    ) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == (
            "the form has no latent file; send it in a part named 'file' or 'latents'"
        )


async def test_unknown_job_and_unknown_route_are_json_404s(start_server: StartServer):
    server = await start_server()
    async with server.client.get("/v1/videos/video_nope") as response:
        assert response.status == 404
        assert (await response.json())["error"] == {
            "type": "not_found",
            "message": "no video job with id 'video_nope'",
        }
    async with server.client.get("/v1/videos/video_nope/content") as response:
        assert response.status == 404
    async with server.client.get("/nowhere") as response:
        assert response.status == 404
        assert (await response.json())["error"]["type"] == "not_found"
    async with server.client.put("/v1/videos") as response:
        assert response.status == 405
        assert "POST" in response.headers["Allow"]


async def test_npy_latents_are_accepted(start_server: StartServer):
    server = await start_server()
    latents = smooth_latents(frames=2, height=4, width=4)
    buffer = io.BytesIO()
    np.save(buffer, latents[0].numpy(), allow_pickle=False)  # CTHW
    async with server.client.post("/v1/videos/stream", data=buffer.getvalue()) as response:
        assert response.status == 200
        assert len(decode_mp4(await response.read())) == 5


async def test_big_endian_npy_and_safetensors_that_start_like_a_pickle_are_accepted(
    start_server: StartServer,
):
    server = await start_server()
    latents = smooth_latents(frames=2, height=4, width=4)
    looks_like_pickle = padded_safetensors(0x280, {"latents": latents})
    assert looks_like_pickle[:2] == b"\x80\x02"  # a protocol-2 pickle's first bytes
    bodies = {
        "little-endian f4": npy_bytes(latents[0].numpy()),
        ">f4": npy_bytes(latents[0].numpy().astype(">f4")),
        ">f8": npy_bytes(latents[0].numpy().astype(">f8")),
        ">f2": npy_bytes(latents[0].numpy().astype(">f2")),
        "0x80 safetensors": looks_like_pickle,
    }
    decoded = {}
    for name, body in bodies.items():
        async with server.client.post("/v1/videos/stream", data=body) as response:
            assert response.status == 200, name
            decoded[name] = decode_mp4(await response.read())
    reference = decoded.pop("little-endian f4")
    assert len(reference) == 5
    for name, frames in decoded.items():
        assert len(frames) == 5, name
        assert min(psnr(a, b) for a, b in zip(frames, reference, strict=True)) > 40, name


async def test_a_json_null_is_refused_not_taken_for_a_missing_field(start_server: StartServer):
    """The document has no null field: Schemathesis's negative phase sent
    `{"audio_channels": null, "input": "push"}` and got a session (201)."""
    server = await start_server()
    for body in ({"input": "push", "audio_channels": None}, {"scene": "fade", "fps": None}):
        async with server.client.post("/v1/videos", json=body) as response:
            assert response.status == 422, body
            message = (await response.json())["error"]["message"]
            assert message.endswith("null is no value here; leave a field out for its default")
    assert not server.manager.jobs
