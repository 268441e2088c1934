"""The server's end of its WebRTC peers' process (`peer_host`).

`PeerProcess.start` runs `python -m vaecast.server.faces.whep.peer_host` with a pipe each
way (`peer_wire`); its log lines come back over the pipe and are logged here, so they
read like the server's own. `open` hands an offer over and awaits the answer;
`forward` sends a unit log's units as they are appended, once per stream whatever the
number of sessions that send it; `bind` tells a session's track which stream it sends.
The process tells back when a session should end (`on_ended`), and each session's
stalls so far, how long they lasted and whether it plays yet (`on_playout`).

If the process dies, every offer waiting on it is refused (503, retry), `on_lost` is
told so the server can end its sessions, and the next offer starts a new one. If the
server dies, the process reads the end of its pipe, closes its peers and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from vaecast.errors import MalformedRequestError, ServerBusyError, VaecastError
from vaecast.server.faces.whep.media import UnitLog
from vaecast.server.faces.whep.peer_wire import Message, PeerPlan, frame, read_message
from vaecast.server.faces.whep.settings import WebRtcSettings

log = logging.getLogger("vaecast.webrtc")

RETRY_AFTER_S = 5
EXIT_TIMEOUT_S = 10.0
# The package's folder on the child's path, whatever the server's working folder is.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])

StreamKey = tuple[str, str, str]  # job id, variant, codec


class PeerProcess:
    def __init__(
        self,
        process: asyncio.subprocess.Process,
        on_ended: Callable[[str, str], None],
        on_playout: Callable[[str, int, float, int, bool], None],
        on_lost: Callable[[], None],
    ) -> None:
        self._process = process
        assert process.stdin is not None and process.stdout is not None
        self._writer = process.stdin
        self._on_ended = on_ended
        self._on_playout = on_playout
        self._on_lost = on_lost
        self._answers: dict[str, asyncio.Future[str]] = {}
        self._censuses: dict[int, asyncio.Future[dict[str, int]]] = {}
        self._request_ids = itertools.count()
        self._forwards: dict[StreamKey, asyncio.Task[None]] = {}
        self._lost = False
        self._reading = asyncio.ensure_future(self._read(process.stdout))

    @classmethod
    async def start(
        cls,
        settings: WebRtcSettings,
        on_ended: Callable[[str, str], None],
        on_playout: Callable[[str, int, float, int, bool], None],
        on_lost: Callable[[], None],
    ) -> PeerProcess:
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, path]))}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vaecast.server.faces.whep.peer_host",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        peers = cls(process, on_ended, on_playout, on_lost)
        peers._send(("start", settings, logging.getLogger("vaecast").getEffectiveLevel()))
        log.info("webrtc: the peers' process started (pid %d)", process.pid)
        return peers

    @property
    def alive(self) -> bool:
        return not self._lost

    @property
    def pid(self) -> int:
        return self._process.pid

    async def open(self, session_id: str, plan: PeerPlan) -> str:
        """The SDP answer of a new peer for `plan`; raises MalformedRequestError with the
        reason an offer was refused. Cancelled, it closes the peer being made."""
        if self._lost:
            raise ServerBusyError("the WebRTC peers' process stopped", RETRY_AFTER_S)
        answer = self._answers[session_id] = asyncio.get_running_loop().create_future()
        try:
            self._send(("open", session_id, plan))
            return await answer
        except asyncio.CancelledError:
            self.close_peer(session_id)
            raise
        finally:
            self._answers.pop(session_id, None)

    def forward(self, key: StreamKey, units: UnitLog) -> None:
        """Send `units`' units under `key` as they are appended (once per key)."""
        if key not in self._forwards and not self._lost:
            self._send(("stream", key, units.time_base))  # before any bind that names it
            task = asyncio.ensure_future(self._forward(key, units))
            task.set_name(f"vaecast-webrtc-forward-{key[2]}")
            self._forwards[key] = task

    def bind(self, session_id: str, track_kind: str, key: StreamKey | None) -> None:
        self._send(("bind", session_id, track_kind, key))

    def close_peer(self, session_id: str) -> None:
        self._send(("close", session_id))

    async def drop(self, media_key: tuple[str, str]) -> None:
        """Stop sending the streams of a rendition no session reads any more."""
        mine = [key for key in self._forwards if key[:2] == media_key]
        tasks = [self._forwards.pop(key) for key in mine]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._send(("drop", media_key))

    async def census(self) -> dict[str, int]:
        """What the process holds (peers, streams, tasks): for tests and leak checks."""
        request_id = next(self._request_ids)
        answer = self._censuses[request_id] = asyncio.get_running_loop().create_future()
        try:
            self._send(("census", request_id))
            return await answer
        finally:
            self._censuses.pop(request_id, None)

    async def close(self) -> None:
        """Close every peer and wait for the process to exit (killed if it does not)."""
        for task in self._forwards.values():
            task.cancel()
        await asyncio.gather(*self._forwards.values(), return_exceptions=True)
        self._forwards.clear()
        self._send(("exit",))
        with contextlib.suppress(Exception):
            self._writer.close()
        try:
            await asyncio.wait_for(self._process.wait(), EXIT_TIMEOUT_S)
        except TimeoutError:
            log.warning("webrtc: the peers' process did not exit; killed")
            self._process.kill()
            await self._process.wait()
        await asyncio.gather(self._reading, return_exceptions=True)

    def _send(self, message: Message) -> None:
        if self._lost or self._writer.is_closing():
            return
        self._writer.write(frame(message))

    async def _forward(self, key: StreamKey, units: UnitLog) -> None:
        sent = 0
        try:
            while True:
                await units.wait_for(sent + 1)
                items = units.items()
                if len(items) <= sent:  # finished
                    break
                self._send(("units", key, items[sent:]))
                sent = len(items)
                with contextlib.suppress(ConnectionError):
                    await self._writer.drain()
        except VaecastError as error:
            self._send(("end", key, str(error)))
        else:
            self._send(("end", key, None))

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        try:
            while (message := await read_message(stdout)) is not None:
                self._dispatch(message)
        except Exception as error:  # not this code at the other end: treat it as gone
            log.error("webrtc: the peers' pipe broke: %s", error)
        finally:
            self._lose()

    def _dispatch(self, message: Message) -> None:
        kind, *fields = message
        if kind == "answer" or kind == "refused":
            session_id, text = fields
            waiting = self._answers.get(session_id)
            if waiting is not None and not waiting.done():
                if kind == "answer":
                    waiting.set_result(text)
                else:
                    waiting.set_exception(MalformedRequestError(text))
        elif kind == "ended":
            self._on_ended(*fields)
        elif kind == "playout":
            self._on_playout(*fields)
        elif kind == "census":
            request_id, counts = fields
            waiting_census = self._censuses.get(request_id)
            if waiting_census is not None and not waiting_census.done():
                waiting_census.set_result(counts)
        elif kind == "log":
            level, name, text = fields
            logging.getLogger(name).log(level, "%s", text)

    def _lose(self) -> None:
        if self._lost:
            return
        self._lost = True
        if self._process.returncode is None and not self._writer.is_closing():
            log.error("webrtc: the peers' process closed its pipe")
        for task in self._forwards.values():
            task.cancel()
        gone = ServerBusyError("the WebRTC peers' process stopped", RETRY_AFTER_S)
        for waiting in [*self._answers.values(), *self._censuses.values()]:
            if not waiting.done():
                waiting.set_exception(gone)
        self._on_lost()
