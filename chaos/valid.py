"""Generated valid latent files: every one decoded (2xx) to a playable MP4 of the
planned frame count, whichever route it came by."""

from __future__ import annotations

import asyncio
import io
import random
from collections import Counter

import aiohttp
import av

from chaos import files
from chaos.client import Client
from chaos.files import LatentFile
from chaos.results import Category, Finding

ROUTES = ("stream, raw body", "create, raw body", "create, multipart")
BUSY_RETRIES = 100


def files_for(header_lengths: list[int], npy_versions: int, seed: int) -> list[LatentFile]:
    """Safetensors of each header length, and .npy of every dtype, byte order and
    memory order (with `npy_versions` format versions each)."""
    rng = random.Random(seed)
    chosen = [files.valid_safetensors(length, rng) for length in header_lengths]
    for char, order, fortran in files.npy_combinations():
        for version in files.NPY_VERSIONS[:npy_versions]:
            chosen.append(files.valid_npy(char, order, fortran, version, rng))
    return chosen


def header_lengths(sample: int | None, seed: int) -> list[int]:
    """Every length from the shortest a latents header can be to 2,048 (None), or a
    sample that keeps the lengths whose first byte is special (128 + 256k: 0x80,
    pickle's first byte)."""
    every = list(range(files.MIN_LATENTS_HEADER_BYTES, 2049))
    if sample is None:
        return every
    special = [files.MIN_LATENTS_HEADER_BYTES, 128, 384, 1920, 2048]
    rest = random.Random(seed).sample([n for n in every if n not in special], sample)
    return sorted(special + rest)


async def _post(client: Client, file: LatentFile, route: str) -> tuple[int, bytes, str]:
    """(status, MP4 bytes, error text) of one upload by `route`."""
    path = "/v1/videos/stream" if route.startswith("stream") else "/v1/videos"
    for _ in range(BUSY_RETRIES):
        async with client.session.post(path, data=_body(file, route)) as response:
            if response.status == 429:
                await asyncio.sleep(0.1)
                continue
            body = await response.read()
            if response.status >= 300 or path.endswith("stream"):
                return response.status, body, body[:200].decode(errors="replace")
            job_id = (await response.json())["id"]
        async with client.session.get(f"/v1/videos/{job_id}/content") as response:
            return response.status, await response.read(), ""
    return 429, b"", "busy every time"


def _body(file: LatentFile, route: str) -> bytes | aiohttp.FormData:
    if route != "create, multipart":
        return file.data
    form = aiohttp.FormData()  # spent by one request: built for each
    form.add_field("file", file.data, filename="z.bin")
    form.add_field("fps", "16")
    return form


def count_frames(mp4: bytes) -> int:
    """Frames PyAV (FFmpeg) decodes from the MP4; -1 if it cannot be opened."""
    try:
        with av.open(io.BytesIO(mp4), format="mp4") as container:
            return sum(1 for _ in container.decode(video=0))
    except (av.error.FFmpegError, IndexError, ValueError):
        return -1


async def _check(client: Client, file: LatentFile, route: str) -> Finding | None:
    request = f"{file.label} by {route}"
    try:
        status, body, error = await _post(client, file, route)
    except aiohttp.ClientError as problem:  # e.g. a stream cut midway
        return Finding(f"{file.label}: broken answer", request, repr(problem), "2xx and an MP4")
    if not 200 <= status < 300:
        key = f"{_kind(file)} refused: {status}"
        return Finding(key, request, f"{status}: {error}", "2xx and an MP4")
    frames = await asyncio.to_thread(count_frames, body)
    if frames != file.frames:
        answer = f"{status}, {len(body)} bytes, {frames} frames decoded"
        return Finding(f"{_kind(file)}: wrong MP4", request, answer, f"{file.frames} frames")
    return None


def _kind(file: LatentFile) -> str:
    """The part of a label that names the defect class (byte order, header length mod 256)."""
    if file.label.startswith("safetensors"):
        length = int(file.label.split()[2])
        return f"safetensors, header length % 256 == {length % 256}"
    return file.label


async def run(client: Client, chosen: list[LatentFile], workers: int) -> Category:
    category = Category("valid files")
    pending = list(reversed(list(enumerate(chosen))))
    routes: Counter[str] = Counter()

    async def worker() -> None:
        while pending:
            index, file = pending.pop()
            route = ROUTES[index % len(ROUTES)]
            routes[route] += 1
            category.record(await _check(client, file, route))

    await asyncio.gather(*(worker() for _ in range(workers)))
    category.figures = {
        "routes": dict(routes),
        "safetensors": sum(f.label.startswith("safetensors") for f in chosen),
        "npy": sum(f.label.startswith(".npy") for f in chosen),
        "frames_checked_with_pyav": category.tried,
    }
    return category
