"""How late the event loop runs: the first thing an operator should watch.

Every request, viewer and job shares one event loop; anything that holds it (a
parse, a conversion, a blocking call) delays all of them. A task asks to wake every
`TICK_S` and records how late it actually woke, as a histogram and a running
maximum in /metrics (`vaecast_event_loop_lag_seconds`,
`vaecast_event_loop_lag_max_seconds`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# Ten times a second: each tick is loop work too (a timer, a wake-up, a histogram
# update), and any hold of the loop longer than a tick still shows in the next one.
TICK_S = 0.1


async def watch_loop_lag(record: Callable[[float], None], tick_s: float = TICK_S) -> None:
    """Record each tick's lateness in seconds, forever (cancel the task to stop)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + tick_s
        await asyncio.sleep(tick_s)
        record(max(0.0, loop.time() - due))
