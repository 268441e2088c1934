"""The aiohttp application: routes, error edge, and the job manager's lifetime."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from vaecast.models.base import ChunkedDecoder
from vaecast.server.config import ServerConfig
from vaecast.server.http_errors import json_errors
from vaecast.server.jobs import JobManager
from vaecast.server.routes import MANAGER, add_routes

# Bodies are read by vaecast.server.uploads with the configured limit; aiohttp's own
# cap (client_max_size) only guards request.read()/post(), which the app never calls
# on uploads, so it is left at the configured limit as a second fence.

# One line per request, key=value, for log processors (aiohttp access log atoms).
ACCESS_LOG_FORMAT = (
    'remote=%a request="%r" status=%s bytes=%b duration_s=%Tf agent="%{User-Agent}i"'
)


def create_app(config: ServerConfig, decoders: Mapping[str, ChunkedDecoder]) -> web.Application:
    """An app serving `decoders` (already loaded: model loading is the caller's job,
    done off the event loop)."""
    if config.default_model not in decoders:
        raise ValueError(f"default model {config.default_model!r} is not among {sorted(decoders)}")
    app = web.Application(middlewares=[json_errors], client_max_size=config.limits.max_upload_bytes)
    add_routes(app)

    async def job_manager(app: web.Application) -> AsyncIterator[None]:
        app[MANAGER] = JobManager(config, decoders)
        app[MANAGER].start()
        yield
        await app[MANAGER].close()

    app.cleanup_ctx.append(job_manager)
    return app


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
    runner = web.AppRunner(app, handler_cancellation=True, **runner_options)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
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
