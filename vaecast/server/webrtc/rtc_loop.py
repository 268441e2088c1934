"""The WebRTC peers' own event loop, on a thread of its own.

aiortc is asyncio-only, and what a peer costs runs on the loop that holds it: a
certificate made per peer, the SDP parsed and written, ICE candidates gathered and
checked, the DTLS handshake, then SRTP and pacing for every packet sent. On the
server's loop, a burst of offers held every other request behind them
(`benchmarks.whep_offers` measures it). So every aiortc object lives on this loop,
made by the first WHEP offer, and the server's loop only hands work over and awaits
it (`call`); a peer's tracks read the job's media, which lives on the server's loop,
through `hop` the other way. Either way a cancel reaches the other side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

Hop = Callable[[Coroutine[Any, Any, T]], Awaitable[T]]
THREAD_NAME = "vaecast-webrtc"
CLOSE_TIMEOUT_S = 10.0
GIL_TURN_S = 0.001


def hop_to(loop: asyncio.AbstractEventLoop) -> Hop[Any]:
    """A function that runs a coroutine on `loop` and awaits its result from the
    caller's loop (cancelling the wait cancels it there)."""

    async def run(coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        return await asyncio.wrap_future(future)

    return run


class RtcLoop:
    """A loop running on its own thread until `close`."""

    def __init__(self) -> None:
        # The peers' Python work (DTLS, SRTP, pacing) and the server's loop take turns
        # at the GIL: a turn lasts the switch interval, 5 ms by default, which a request
        # that came in meanwhile waits out. 1 ms keeps it near an idle server's.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_TURN_S))
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name=THREAD_NAME, daemon=True
        )
        self._thread.start()
        started.wait()
        self.call: Hop[Any] = hop_to(self.loop)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run `coroutine` on the loop as a task of its own; its future can cancel it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def tasks(self) -> set[asyncio.Task[Any]]:
        """The loop's tasks not yet done (a snapshot; for tests and metrics)."""
        if self.loop.is_closed():
            return set()
        return {task for task in asyncio.all_tasks(self.loop) if not task.done()}

    async def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread (the caller's
        loop waits in a thread, never blocked)."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            current = asyncio.current_task()
            pending = [task for task in asyncio.all_tasks() if task is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        try:
            await asyncio.wait_for(self.call(cancel_all()), CLOSE_TIMEOUT_S)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self._thread.join, CLOSE_TIMEOUT_S)
            if not self._thread.is_alive():
                self.loop.close()
