"""The server under test: vaecast's app with the test decoders, small limits, a tiny
spill threshold, and files capped in size so that a spill can fail like a full disk.

    python -m chaos.server --spill-dir DIR [--port 0] [--retention-s 5]

Prints `reliability server on http://HOST:PORT encoder_faults=MODE` once it listens
(MODE: how the faulty encoder went in, `stages` or `factory`, or `absent`: no
encoder fault can be injected, and the suite reports each one it tried). Serves on
127.0.0.1 only, under uvloop, through `serve_until_signalled` like `vaecast serve`;
SIGTERM drains and stops it.

Besides vaecast's routes it answers `GET /reliability/lag` (and `?reset=1`): the
worst lateness of a 50 ms tick on this loop, the suite's own probe for when
/metrics has no `vaecast_event_loop_lag_max_seconds`, and with `reset=1` the
longest garbage collection since the last reset (a pause the loop shares too);
and `POST /reliability/gc`: a full garbage collection, so that the suite can tell
memory held only by reference cycles from memory held for good.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import inspect
import logging
import os
import resource
import signal
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from aiohttp import web

import vaecast.embed as vaecast_app
from chaos import faults
from vaecast.embed import MIB, Limits, ServerConfig

ANNOUNCE = "reliability server on "
HOST = "127.0.0.1"
LAG_TICK_S = 0.05
LIMITS = Limits(max_upload_bytes=4 * MIB, max_frames=129, max_pixels_per_frame=128 * 128)
LAG_PROBE = web.AppKey("lag_probe", dict)


def build_config(spill_dir: str, retention_s: float) -> ServerConfig:
    """Small limits and short timeouts, so hostile requests meet every fence quickly."""
    wanted: dict[str, Any] = {
        "default_model": "linear",
        "limits": LIMITS,
        "decode_slots": 2,
        "max_queued_jobs": 16,
        "events_keepalive_s": 1.0,
        "reader_write_timeout_s": 5.0,
        "header_timeout_s": 5.0,
        "body_timeout_s": 5.0,
        "retention_s": retention_s,
        "retention_memory_bytes": 64 * MIB,
        "spill_threshold_bytes": faults.SPILL_THRESHOLD_BYTES,
        "spill_dir": spill_dir,
        "shutdown_grace_s": 2.0,
    }
    # The config grows while the server is being hardened: set what this version has.
    known = {f.name for f in dataclasses.fields(ServerConfig)}
    return ServerConfig(**{name: value for name, value in wanted.items() if name in known})


def build_app(config: ServerConfig) -> tuple[web.Application, str]:
    """The app with the test decoders and the faulty encoder; and how it was injected."""
    app, mode = _create_app(config, faults.test_decoders())
    app.router.add_get("/reliability/lag", _lag)
    app.router.add_post("/reliability/gc", _collect)
    app.cleanup_ctx.append(_lag_probe)
    return app, mode


def _create_app(config: ServerConfig, decoders: dict[str, Any]) -> tuple[web.Application, str]:
    """`create_app` with the faulty encoder factory, by whichever parameter this
    version of vaecast takes it: `stages=Stages(encoder_factory=...)` or
    `encoder_factory=`; without either, encoder faults cannot be injected."""
    parameters = inspect.signature(vaecast_app.create_app).parameters
    if "stages" in parameters:
        from vaecast.pipeline.run import Stages

        stages = Stages(encoder_factory=faults.encoder_factory)
        return vaecast_app.create_app(config, decoders, stages=stages), "stages"
    if "encoder_factory" in parameters:
        factory = faults.encoder_factory
        return vaecast_app.create_app(config, decoders, encoder_factory=factory), "factory"
    return vaecast_app.create_app(config, decoders), "absent"


class GcPauses:
    """The longest garbage collection since the last reset (a pause of every thread,
    the event loop's included), from `gc.callbacks`."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self.worst_generation = -1
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        if took > self.worst_s:
            self.worst_s, self.worst_generation = took, info["generation"]

    def take(self) -> dict[str, float]:
        worst = {"gc_worst_s": round(self.worst_s, 4), "gc_worst_generation": self.worst_generation}
        self.worst_s, self.worst_generation = 0.0, -1
        return worst


GC_PAUSES = GcPauses()


def _waited_for_cpu_s() -> float | None:
    """How long this thread has waited, runnable, for a CPU (Linux's schedstat: its
    second field, in ns); None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


async def _lag_probe(app: web.Application) -> AsyncIterator[None]:
    # max_s: the worst lateness of a tick; own_max_s: the same less the time the loop's
    # thread waited for a CPU meanwhile (other processes on a busy machine), which is
    # the lateness the server itself caused (None: the kernel does not tell the wait).
    state = app[LAG_PROBE] = {"max_s": 0.0, "own_max_s": 0.0, "ticks": 0}
    gc.callbacks.append(GC_PAUSES)

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_TICK_S
            waited_before = _waited_for_cpu_s()
            await asyncio.sleep(LAG_TICK_S)
            late = loop.time() - due
            waited_after = _waited_for_cpu_s()
            state["max_s"] = max(state["max_s"], late)
            if waited_before is None or waited_after is None:
                state["own_max_s"] = None
            elif state["own_max_s"] is not None:
                own = late - (waited_after - waited_before)
                state["own_max_s"] = max(state["own_max_s"], own)
            state["ticks"] += 1

    task = asyncio.create_task(tick(), name="reliability-lag-probe")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gc.callbacks.remove(GC_PAUSES)


async def _lag(request: web.Request) -> web.Response:
    state = request.app[LAG_PROBE]
    reset = request.query.get("reset") == "1"
    answer = dict(state) | (GC_PAUSES.take() if reset else {})
    if reset:
        state["max_s"] = 0.0
        if state["own_max_s"] is not None:
            state["own_max_s"] = 0.0
    return web.json_response(answer)


async def start_default_executor() -> None:
    """Start every thread of the loop's default executor now (its usual size), so
    that the suite's thread count cannot grow by threads this pool makes lazily."""
    workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    executor = ThreadPoolExecutor(workers, thread_name_prefix="asyncio")
    loop = asyncio.get_running_loop()
    loop.set_default_executor(executor)
    barrier = threading.Barrier(workers)  # each task holds its thread until all run
    await asyncio.gather(*(loop.run_in_executor(None, barrier.wait, 10.0) for _ in range(workers)))


async def _collect(request: web.Request) -> web.Response:
    """A full garbage collection now, and what it found held only by reference cycles
    (object types, and the bytes of the buffers among them)."""
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what it finds in gc.garbage, to look at
    try:
        unreachable = gc.collect()
        found = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    types = Counter(type(thing).__name__ for thing in found).most_common(12)
    buffer_bytes = sum(_buffer_bytes(thing) for thing in found)
    del found
    gc.collect()  # now free them
    return web.json_response(
        {"unreachable": unreachable, "types": dict(types), "buffer_bytes": buffer_bytes}
    )


def _buffer_bytes(thing: object) -> int:
    if isinstance(thing, bytes | bytearray | memoryview):
        return len(thing)
    if isinstance(thing, np.ndarray):
        return int(thing.nbytes)
    if isinstance(thing, torch.Tensor):
        return int(thing.untyped_storage().nbytes())
    return 0


def cap_file_size(limit_bytes: int) -> None:
    """Writes past `limit_bytes` fail with EFBIG (SIGXFSZ ignored), as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))


async def serve(args: argparse.Namespace) -> None:
    await start_default_executor()
    config = build_config(args.spill_dir, args.retention_s)
    app, mode = build_app(config)
    if args.fsize_bytes:
        cap_file_size(args.fsize_bytes)
    options: dict[str, Any] = {}
    if hasattr(vaecast_app, "runner_settings"):  # header timeouts, handler cancellation
        options.update(vaecast_app.runner_settings(config))
    if hasattr(vaecast_app, "ACCESS_LOG_FORMAT"):
        options["access_log_format"] = vaecast_app.ACCESS_LOG_FORMAT

    def announce(host: str, port: int) -> None:
        print(f"{ANNOUNCE}http://{host}:{port} encoder_faults={mode}", flush=True)

    async def on_signal() -> None:
        await vaecast_app.drain(app, config.shutdown_grace_s)

    await vaecast_app.serve_until_signalled(app, HOST, args.port, announce, on_signal, **options)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--spill-dir", required=True)
    parser.add_argument("--retention-s", type=float, default=5.0)
    parser.add_argument(
        "--fsize-bytes",
        type=int,
        default=faults.DISK_FULL_FILE_BYTES,
        help="RLIMIT_FSIZE for the process (0: none)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args))


if __name__ == "__main__":
    main()
