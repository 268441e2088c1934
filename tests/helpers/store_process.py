"""`vaecast serve --store DIR` as a real process to kill: start it, ask it over plain HTTP,
SIGKILL it, start it again on the same store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tests.helpers import safetensors_bytes

START_TIMEOUT_S = 120.0


@contextlib.contextmanager
def killable_server(
    store: Path,
    log: Path,
    model: str = "tiny",
    options: tuple[str, ...] = (),
    environment: dict[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`vaecast serve --model MODEL [OPTIONS]` on `store`, with `environment` added;
    yields its URL and process; SIGKILLs it on exit. (`tiny` also warms its demo up in
    the background at each start.)"""
    command = [
        sys.executable, "-m", "vaecast", "serve", "--port", "0", "--model", model,
        "--store", str(store), *options,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(environment or {})}
    with (
        log.open("a") as err,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=err, text=True, env=env
        ) as process,
    ):
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # the announcement, or "" if it died
            assert " on http://" in line, f"did not start: {log.read_text()[-3000:]}"
            yield line.split(" on ")[1].strip().rstrip("/"), process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)


def request(
    url: str, method: str = "GET", data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def latents(frames: int, size: int, seed: int) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    return safetensors_bytes(latents=torch.randn(1, 16, frames, size, size, generator=generator))


def create(base: str, frames: int, size: int, seed: int) -> dict[str, Any]:
    status, _, body = request(f"{base}/v1/videos", "POST", latents(frames, size, seed))
    assert status == 201, body
    return json.loads(body)


def job_of(base: str, job_id: str) -> tuple[int, dict[str, Any]]:
    status, _, body = request(f"{base}/v1/videos/{job_id}")
    return status, json.loads(body)


def wait_for(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
