"""Serving an app: the runner's settings, the open-file limit, and the loop that serves
until SIGINT or SIGTERM (what `vaecast serve` runs, and `vaecast.embed` offers)."""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from vaecast.pipeline.heap import retain_decode_heap
from vaecast.server.config import ServerConfig
from vaecast.server.edge.parser_errors import answer_in_json

log = logging.getLogger("vaecast.server")


def runner_settings(config: ServerConfig) -> dict[str, Any]:
    """What every AppRunner of this app needs, the CLI's and the tests' alike.

    aiohttp closes a connection whose request head is still incomplete when its
    keep-alive timer fires (the timer starts when the connection opens and after
    each response, and is not pushed back by bytes that trickle in), so its
    keep-alive timeout is exactly a header timeout: a slow-header client is cut
    after `header_timeout_s`, and so is an idle keep-alive connection.
    """
    return {
        "handler_cancellation": True,
        "keepalive_timeout": config.header_timeout_s,
        # aiohttp would inflate a compressed body on the event loop, without a bound on
        # what it inflates to; uploads are refused with a Content-Encoding instead.
        "auto_decompress": False,
    }


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the new soft limit.

    Every viewer is a socket, and a broadcast member one more descriptor for the fan-out
    thread (server/faces/progressive/fanout_sender.py): the usual soft limit of 1,024 would refuse
    connections long before the server's CPU runs out (the hard limit, which only root
    can raise, is commonly 512 Ki or more). Go's runtime does the same at start.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and soft != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):  # a sandbox that refuses it: keep what we have
            return soft
        log.info("open files: soft limit raised from %d to %s", soft, hard)
        return hard
    return soft


async def serve_until_signalled(
    app: web.Application,
    host: str,
    port: int,
    announce: Callable[[str, int], None],
    on_signal: Callable[[], Awaitable[None]] | None = None,
    **runner_options: Any,
) -> None:
    """Serve `app` on host:port (0 picks a free port, passed to `announce`) until
    SIGINT or SIGTERM; then `on_signal()` (e.g. draining jobs) and a clean shutdown.

    Handlers are cancelled when their client disconnects, so a stream whose viewer
    left stops its decode at once rather than at its next write.
    """
    runner = web.AppRunner(app, **{"handler_cancellation": True, **runner_options})
    await runner.setup()
    answer_in_json(runner)  # aiohttp's own parser errors, too
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        # What exists now (modules, weights, the app) lives as long as the process: keep
        # it out of the garbage collector's full passes, which otherwise scan all of it
        # and pause the event loop for a hundred milliseconds and more.
        gc.freeze()
        # Decodes run again and again: keep their memory mapped (vaecast/pipeline/heap.py).
        # For an embedding app this is the first chance; `vaecast serve` applied them
        # before its models loaded, where they work best.
        retain_decode_heap()
        raise_open_file_limit()
        announce(bound_host, bound_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        if on_signal is not None:
            await on_signal()
    finally:
        await runner.cleanup()
