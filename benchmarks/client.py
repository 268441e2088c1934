"""The measuring side: the server as a subprocess, the timed HTTP client, the checks.

Every time is `time.monotonic()` (CLOCK_MONOTONIC, one clock for all processes on
the machine), so the server's trace and the client's receive times share an axis.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
import torch
from safetensors.torch import save as save_safetensors

from vaecast.codecs.fmp4_reader import TopLevelBoxSplitter
from vaecast.demo.sources import SceneSpec, scene_latents

REPO = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT_S = 180.0
SERVER_STOP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 1800.0


# ---------------------------------------------------------------------------
# Latents


def make_latents(
    frames: int, width: int, height: int, cache_dir: Path, scene: str = "showcase"
) -> torch.Tensor:
    """Demo-scene latents (BCTHW) of `frames` = 1 + 4k frames, cached on disk.

    Scenes longer than 81 frames are the 81-frame latents repeated in time (the
    memory runs need length, not novelty, and rendering 1281 frames would take far
    longer than decoding them).
    """
    if frames < 1 or (frames - 1) % 4:
        raise ValueError(f"frames must be 1 + 4k, got {frames}")
    base_frames = min(frames, 81)
    # Named after the encoder's weights too: latents a refit's encoder would not make
    # are another video (another x264 load, another MP4 size), not the same one cached.
    digest = tiny_weights_digest()
    path = cache_dir / f"latents_{scene}_{base_frames}_{width}x{height}_{digest}.safetensors"
    if path.exists():
        from safetensors.torch import load_file

        base = load_file(str(path))["latents"]
    else:
        base = scene_latents(SceneSpec(scene, base_frames, width, height, seed=0))
        cache_dir.mkdir(parents=True, exist_ok=True)
        path.write_bytes(save_safetensors({"latents": base.contiguous()}))
    steps = (frames - 1) // 4 + 1
    repeats = -(-steps // base.shape[2])
    return base.repeat(1, 1, repeats, 1, 1)[:, :, :steps].contiguous()


def tiny_weights_digest() -> str:
    """The shipped `tiny` weights' digest (first 16 hex): the demo scenes' encoder."""
    from vaecast.models.tiny import default_weights

    return hashlib.sha256(default_weights().read_bytes()).hexdigest()[:16]


def latents_body(latents: torch.Tensor, fps: int) -> bytes:
    return save_safetensors({"latents": latents.contiguous()}, metadata={"fps": str(fps)})


# ---------------------------------------------------------------------------
# The server process


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.contextmanager
def announced_process(
    command: list[str],
    log_path: Path,
    announced: Callable[[str], str | None],
    *,
    what: str,
    repo: Path = REPO,
    env: dict[str, str] | None = None,
    start_timeout_s: float = SERVER_START_TIMEOUT_S,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A server subprocess run from `repo` (on its PYTHONPATH), stderr to `log_path`,
    that announces its URL on stdout: yields (URL, process), then stops it with SIGTERM
    (killed if it does not stop). `announced(line)` is the URL in a line, else None."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, cwd=repo, env=env)
    try:
        yield _read_url(process, announced, what, start_timeout_s, log_path), process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(SERVER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def vaecast_serve_url(line: str) -> str | None:
    """The URL in `vaecast serve`'s "vaecast serving MODELS on URL" line, else None."""
    if not line.startswith("vaecast serving ") or " on " not in line:
        return None
    return line.rsplit(" on ", 1)[1].strip().rstrip("/")


def _bench_server_url(line: str) -> str | None:
    return line.split(" on ", 1)[1].strip() if line.startswith("bench server on ") else None


@contextlib.contextmanager
def server_process(
    model: str,
    device: str,
    log_path: Path,
    host_frames: str | None = None,
    tree: Path | None = None,
    weights: Path | None = None,
) -> Iterator[ServerProcess]:
    """`python -m benchmarks.server` on a free loopback port; stopped with SIGTERM.

    `host_frames`: what its decode thread hands the encoders (default: the server's own,
    what vaecast's pipeline does). `tree`: another checkout to run the server from
    (default: this one). `weights`: the model's weights file or folder (default: the
    model's own, where it has one).
    """
    command = [
        sys.executable,
        "-m",
        "benchmarks.server",
        "--model",
        model,
        "--device",
        device,
        *(["--host-frames", host_frames] if host_frames is not None else []),
        *(["--weights", str(weights)] if weights is not None else []),
    ]
    with announced_process(
        command, log_path, _bench_server_url, what="the bench server", repo=tree or REPO
    ) as (url, process):
        yield ServerProcess(url, process)


def _read_url(
    process: subprocess.Popen[bytes],
    announced: Callable[[str], str | None],
    what: str,
    timeout_s: float,
    log_path: Path,
) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode(errors="replace")
        if not line and process.poll() is not None:
            code = process.returncode
            raise RuntimeError(f"{what} exited with {code} at start (log: {log_path})")
        url = announced(line)
        if url is not None:
            return url
    raise RuntimeError(f"{what} did not start in {timeout_s:.0f} s (log: {log_path})")


def peak_rss_bytes(pid: int) -> int:
    """The process's high-water resident set size (VmHWM), from /proc."""
    return _proc_status_kib(pid, "VmHWM") * 1024


def rss_bytes(pid: int) -> int:
    return _proc_status_kib(pid, "VmRSS") * 1024


def _proc_status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU time of the process (all threads), or of its thread `tid`."""
    path = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    fields = path.read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


# ---------------------------------------------------------------------------
# A timed response


@dataclass
class Received:
    """One response as the client saw it; times are monotonic seconds."""

    started: float
    headers_at: float = 0.0
    first_byte_at: float | None = None
    first_fragment_at: float | None = None  # ftyp + moov + the first moof/mdat complete
    last_byte_at: float = 0.0
    fragment_at: list[float] = field(default_factory=list)  # each mdat's completion
    fragment_media_s: list[float] = field(default_factory=list)  # each fragment's tfdt
    status: int = 0
    size: int = 0
    body: bytes = b""  # empty unless kept

    def relative(self) -> dict[str, Any]:
        def since(moment: float | None) -> float | None:
            return None if moment is None else moment - self.started

        return {
            "status": self.status,
            "headers_s": since(self.headers_at),
            "ttfb_s": since(self.first_byte_at),
            "ttff_s": since(self.first_fragment_at),
            "last_byte_s": since(self.last_byte_at),
            "fragment_s": [at - self.started for at in self.fragment_at],
            "smooth_start_s": self.smooth_start_s(),
            "bytes": self.size,
        }

    def smooth_start_s(self) -> float | None:
        """The earliest start (s after the request) from which a player shows every
        frame on time: each fragment must have arrived by start + its media time."""
        if not self.fragment_at or len(self.fragment_media_s) != len(self.fragment_at):
            return None
        return max(
            at - self.started - media
            for at, media in zip(self.fragment_at, self.fragment_media_s, strict=True)
        )


def _mdhd_timescale(moov: bytes) -> int:
    at = moov.index(b"mdhd") + 4
    version = moov[at]
    offset = at + 4 + (16 if version == 1 else 8)
    return struct.unpack_from(">I", moov, offset)[0]


def _tfdt_ticks(moof: bytes) -> int:
    at = moof.index(b"tfdt") + 4
    fmt = ">Q" if moof[at] == 1 else ">I"
    return struct.unpack_from(fmt, moof, at + 4)[0]


async def receive(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    data: bytes | None = None,
    started: float | None = None,
    keep_body: bool = True,
) -> Received:
    """Send a request and time its response body box by box."""
    result = Received(started=time.monotonic() if started is None else started)
    splitter = TopLevelBoxSplitter()
    body = bytearray()
    init_seen = False
    timescale = 0
    async with session.request(method, url, data=data) as response:
        result.headers_at = time.monotonic()
        result.status = response.status
        is_mp4 = response.content_type == "video/mp4"
        async for data_chunk in response.content.iter_any():
            now = time.monotonic()
            if result.first_byte_at is None:
                result.first_byte_at = now
            result.size += len(data_chunk)
            if keep_body:
                body += data_chunk
            for box in splitter.feed(data_chunk) if is_mp4 else ():
                kind = box[4:8]
                if kind == b"moov":
                    init_seen = True
                    timescale = _mdhd_timescale(box)
                elif kind == b"moof" and timescale:
                    result.fragment_media_s.append(_tfdt_ticks(box) / timescale)
                elif kind == b"mdat":
                    result.fragment_at.append(now)
                    if init_seen and result.first_fragment_at is None:
                        result.first_fragment_at = now
        result.last_byte_at = time.monotonic()
    if is_mp4 and result.status == 200:
        splitter.close()
    result.body = bytes(body)
    return result


def client_session(connections: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S),
    )


def count_frames(mp4: bytes) -> int:
    """Frames PyAV decodes from an MP4 held in memory (0 if it cannot be opened)."""
    try:
        with av.open(io.BytesIO(mp4), format="mp4") as container:
            return sum(1 for _ in container.decode(video=0))
    except (av.error.FFmpegError, IndexError):
        return 0
