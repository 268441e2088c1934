"""`vaecast serve --model tiny --store DIR` as a subprocess, for the categories that
need the real command line: kill and restart on a durable store, a damaged store at
startup, and slow clients against fair admission (`restarts`, `lockout`).

The main run's server (`chaos.server`) is an in-process app with
test decoders; these categories judge what `vaecast serve` itself promises across
process deaths and under its own flags, so they start the command a user runs. It
always gets `--store` (a folder under the suite's work dir) and a private
XDG_DATA_HOME, so the user's real data dir is never touched, and binds 127.0.0.1
only. Every wait is bounded: a server that does not announce itself in
START_TIMEOUT_S is an error (`DidNotStart`), not a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from chaos.process import REPO

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# `vaecast serving tiny on http://127.0.0.1:PORT/`
_ANNOUNCEMENT = re.compile(r" on (http://127\.0\.0\.1:\d+)/?\s*$")
# Log lines that mean a defect whatever the server was asked (as `process` watches
# the main server for).
TROUBLE = re.compile(
    r"Traceback|Error handling request|Task exception was never retrieved|"
    r"Exception in callback|was never awaited|Task was destroyed|Unclosed|CRITICAL"
)


class DidNotStart(RuntimeError):
    """The server exited, or said nothing, before announcing its URL."""


@dataclass
class Serve:
    """One start of `vaecast serve`: its URL, its process and its part of the log."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int  # where this start's lines begin in the (shared) log file
    start_s: float  # from exec to the announcement

    def log_lines(self) -> list[str]:
        """The lines this start has written so far."""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace").splitlines()

    def trouble(self) -> list[str]:
        return [line[:300] for line in self.log_lines() if TROUBLE.search(line)]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a power cut or the OOM killer."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> int:
        """SIGTERM, as a deploy stops it; the exit code (SIGKILL past STOP_TIMEOUT_S)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
            return -signal.SIGKILL


def store_options(store: Path, *extra: str) -> list[str]:
    """The options every start gets: the tiny model, any free port, this store, and a
    retention longer than any run (so no job is forgotten because it aged)."""
    fixed = ["--model", "tiny", "--port", "0", "--host", HOST, "--store", str(store)]
    return [*fixed, "--retention", "3600", *extra]


@contextlib.contextmanager
def vaecast_serve(options: Sequence[str], work_dir: Path, log_name: str) -> Iterator[Serve]:
    """`python -m vaecast serve OPTIONS` with stderr appended to `work_dir/log_name`;
    SIGKILLed on exit if it still runs (call `stop` first for a clean exit)."""
    if "--store" not in options or "--host" not in options:
        raise ValueError("always pass --store and --host: never the user's data dir")
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / log_name
    log_path.touch()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        # Belt and braces: --store is always given, but nothing may reach the
        # user's data dir even if an option were lost.
        "XDG_DATA_HOME": str(work_dir / "xdg-data"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "vaecast", "serve", *options]
    offset = log_path.stat().st_size
    started = time.monotonic()
    with log_path.open("ab") as err:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO, env=env
        )
    try:
        url = _announcement(process, log_path, offset)
        yield Serve(url, process, log_path, offset, round(time.monotonic() - started, 3))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)
        assert process.stdout is not None
        process.stdout.close()


def _announcement(process: subprocess.Popen[bytes], log_path: Path, offset: int) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            line = process.stdout.readline().decode(errors="replace")
            match = _ANNOUNCEMENT.search(line)
            if match:
                return match.group(1)
            if not line and process.poll() is not None:
                break
        elif process.poll() is not None:
            break
    with log_path.open("rb") as log:
        log.seek(offset)
        tail = log.read().decode(errors="replace")[-2000:]
    code = process.poll()
    said = f"exited with {code}" if code is not None else f"said nothing in {START_TIMEOUT_S:g} s"
    raise DidNotStart(f"vaecast serve {said}; its log ends: {tail}")


def session(url: str, source: str | None = None) -> aiohttp.ClientSession:
    """A client for one start: no kept connections (a killed server leaves none
    behind to fail the next request), and no request that can wait forever.
    `source`: the address its connections come from (another client, for the server)."""
    local = None if source is None else (source, 0)
    return aiohttp.ClientSession(
        url,
        connector=aiohttp.TCPConnector(limit=32, force_close=True, local_addr=local),
        timeout=aiohttp.ClientTimeout(total=30),
    )


FINAL = frozenset({"completed", "failed", "cancelled"})
POLL_S = 0.05


async def json_of(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The answer's JSON object, or its first 200 characters as {"body": ...}."""
    text = await response.text()
    try:
        answer = json.loads(text)
    except ValueError:
        return {"body": text[:200]}
    return answer if isinstance(answer, dict) else {"body": text[:200]}


async def job_of(client: aiohttp.ClientSession, job_id: str) -> tuple[int, dict[str, Any]]:
    async with client.get(f"/v1/videos/{job_id}") as response:
        return response.status, await json_of(response)


async def final_job(
    client: aiohttp.ClientSession, job_id: str, timeout_s: float
) -> tuple[int, dict[str, Any]]:
    """The job once it is final (or as it was when `timeout_s` ran out)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status, job = await job_of(client, job_id)
        if status != 200 or job.get("status") in FINAL:
            return status, job
        if asyncio.get_running_loop().time() > deadline:
            return status, job
        await asyncio.sleep(POLL_S)


async def metrics(client: aiohttp.ClientSession) -> dict[str, float]:
    """/metrics samples by name with labels, e.g. `vaecast_places{kind="receiving"}`."""
    async with client.get("/metrics") as response:
        text = await response.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


def figures_of(values: Sequence[float], digits: int = 3) -> dict[str, float | int | None]:
    """count, min, median and max of `values` (None when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return {"count": 0, "min": None, "median": None, "max": None}
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {
        "count": len(ordered),
        "min": round(ordered[0], digits),
        "median": round(median, digits),
        "max": round(ordered[-1], digits),
    }
