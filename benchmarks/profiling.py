"""Where the server's time goes: py-spy sampling every thread during vaecast requests.

`py-spy record --format raw` writes collapsed stacks (`thread;frame;frame N`). This
module runs it against the server process for a few `POST /v1/videos/stream`
requests, then totals samples per function: inclusive (on the stack) and self (the
innermost Python frame). Idle samples (threads waiting) are left out by py-spy.
"""

from __future__ import annotations

import asyncio
import collections
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.arms import arm_url
from benchmarks.client import ServerProcess, client_session, receive

SAMPLE_RATE_HZ = 250
_FRAME = re.compile(r"^(?P<function>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

# What the report names, as substrings of "function (file)" frames: a sample counts
# for a label when any frame of its stack matches (inclusive time), or, for labels
# marked self, when its innermost Python frame does (x264 runs inside PyAV's
# compiled `encode`, so it shows as the self time of H264Encoder.encode).
HOT_PATH: dict[str, tuple[bool, tuple[str, ...]]] = {
    "decoder forward (torch)": (False, ("forward (vaecast/models/",)),
    "quantize_to_host (float -> uint8 RGB)": (False, ("quantize_to_host (",)),
    "quantize_yuv420_to_host (float -> I420)": (False, ("quantize_yuv420_to_host (",)),
    "swscale RGB -> YUV (colour.from_rgb)": (False, ("from_rgb (vaecast/codecs/colour.py",)),
    "x264 (self time of H264Encoder.encode)": (True, ("encode (vaecast/codecs/h264.py",)),
    "I420 planes -> AVFrame (_from_i420)": (False, ("_from_i420 (vaecast/codecs/h264.py",)),
    "Annex B -> AVC sample": (False, ("annexb_to_sample (",)),
    "fMP4 boxes (fmp4.fragment)": (False, ("fragment (vaecast/codecs/fmp4.py",)),
    "stream encode_chunk (all of the encode thread)": (
        False,
        ("encode_chunk (vaecast/codecs/stream.py",),
    ),
    "upload parsing (latent_files)": (
        False,
        ("(vaecast/latent_files/", "(vaecast/safetensors_header.py"),
    ),
    "aiohttp (HTTP parsing and writing)": (False, ("(aiohttp/",)),
}


def available() -> bool:
    return shutil.which("py-spy") is not None


def profile_server(
    server: ServerProcess, body: bytes, fps: int, requests: int, out_path: Path
) -> dict[str, Any]:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        [
            "py-spy", "record", "--pid", str(server.pid), "--rate", str(SAMPLE_RATE_HZ),
            "--format", "raw", "--output", str(out_path), "--threads", "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attaches
    started = time.monotonic()
    asyncio.run(_requests(server, body, fps, requests))
    elapsed = time.monotonic() - started
    spy.send_signal(signal.SIGINT)
    spy.wait(60)
    return summarize(out_path.read_text(), elapsed)


async def _requests(server: ServerProcess, body: bytes, fps: int, requests: int) -> None:
    async with client_session() as session:
        for _ in range(requests):
            await receive(session, "POST", arm_url(server, "vaecast", fps), body, keep_body=False)


def summarize(collapsed: str, elapsed_s: float) -> dict[str, Any]:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    by_thread: collections.Counter[str] = collections.Counter()
    hot: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        thread, *frames = stack.split(";")
        total += count
        by_thread[_thread_name(thread)] += count
        names = [_short(frame) for frame in frames]
        for name in set(names):
            inclusive[name] += count
        if names:
            own[names[-1]] += count
        for label, (self_only, patterns) in HOT_PATH.items():
            candidates = names[-1:] if self_only else names
            if any(pattern in name for name in candidates for pattern in patterns):
                hot[label] += count
    return {
        "samples": total,
        "sample_rate_hz": SAMPLE_RATE_HZ,
        "elapsed_s": elapsed_s,
        "cpu_s_sampled": total / SAMPLE_RATE_HZ,
        "by_thread": dict(by_thread.most_common()),
        "hot_path_samples": {label: hot[label] for label in HOT_PATH},
        "top_inclusive": inclusive.most_common(25),
        "top_self": own.most_common(25),
    }


def _thread_name(thread: str) -> str:
    # py-spy labels a thread `thread (TID): NAME`; pool threads end in `_N`.
    name = thread.split("): ", 1)[-1].strip().strip('"')
    return re.sub(r"_\d+$", "", name)


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match.group("file")
    for marker in ("site-packages/", "vaecast/", "benchmarks/"):
        if marker in path:
            path = (marker if marker != "site-packages/" else "") + path.split(marker, 1)[1]
            break
    return f"{match.group('function')} ({path})"
