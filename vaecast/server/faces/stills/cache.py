"""Each job's stills, made once per state of its video and kept while they fit.

A still is made again only when its job's log has grown (or finished) since it was
made: a player polling a running job's thumbnail costs one image per fragment, not
one per request. Requests for a still that is being made share the making (one
future per job, kind and log length). The images kept are bounded in bytes, the
least recently used dropped first; the making is bounded too: past `max_pending`
images waiting for the one thread that makes them, a request is refused (429).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from vaecast.codecs.stills import Still
from vaecast.errors import ServerBusyError

# (job id, what: "thumbnail.webp", "spritesheet", ...)
StillKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class MadeStill:
    """A still, the log length it was made at, and its entity tag (of its bytes)."""

    still: Still
    segments: int
    complete: bool
    etag: str


class StillCache:
    def __init__(self, executor: Executor, max_bytes: int, max_pending: int) -> None:
        self._executor = executor
        self._max_bytes = max_bytes
        self._max_pending = max_pending
        self._kept: OrderedDict[StillKey, MadeStill] = OrderedDict()
        self._bytes = 0
        self._making: dict[tuple[StillKey, int, bool], asyncio.Future[MadeStill]] = {}

    @property
    def pending(self) -> int:
        return len(self._making)

    def kept(self, key: StillKey, segments: int, complete: bool) -> MadeStill | None:
        """The still of `key` made at this state of its log, if it is kept."""
        made = self._kept.get(key)
        if made is None or (made.segments, made.complete) != (segments, complete):
            return None
        self._kept.move_to_end(key)
        return made

    async def get(
        self,
        key: StillKey,
        segments: int,
        complete: bool,
        read: Callable[[], Awaitable[list[bytes]]],
        make: Callable[[list[bytes]], Still],
    ) -> MadeStill:
        """The still of `key` at this state of its log: kept, being made, or made now
        (`read` gives the log's segments on the loop, `make` runs on the executor)."""
        made = self.kept(key, segments, complete)
        if made is not None:
            return made
        state = (key, segments, complete)
        making = self._making.get(state)
        if making is None:
            if len(self._making) >= self._max_pending:
                raise ServerBusyError("too many stills are being made; try again soon", 1)
            making = asyncio.ensure_future(self._make(key, segments, complete, read, make))
            self._making[state] = making
            making.add_done_callback(lambda _: self._making.pop(state, None))
        # Shielded: a request that leaves does not stop a making others may share.
        return await asyncio.shield(making)

    async def _make(
        self,
        key: StillKey,
        segments: int,
        complete: bool,
        read: Callable[[], Awaitable[list[bytes]]],
        make: Callable[[list[bytes]], Still],
    ) -> MadeStill:
        data = await read()
        still = await asyncio.get_running_loop().run_in_executor(self._executor, make, data)
        etag = '"' + hashlib.sha256(still.data).hexdigest()[:32] + '"'
        made = MadeStill(still, segments, complete, etag)
        self._keep(key, made)
        return made

    def _keep(self, key: StillKey, made: MadeStill) -> None:
        old = self._kept.pop(key, None)
        if old is not None:
            self._bytes -= len(old.still.data)
        if len(made.still.data) > self._max_bytes:
            return
        self._kept[key] = made
        self._bytes += len(made.still.data)
        while self._bytes > self._max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self._bytes -= len(dropped.still.data)
