"""A small Chrome DevTools Protocol client: headless Chromium driven over one websocket.

`launch_chromium()` starts Debian's /usr/bin/chromium with a fresh profile and
`--remote-debugging-port=0`, reads the port Chromium chose from the profile's
`DevToolsActivePort`, and connects aiohttp's websocket client to the browser
endpoint. Pages are targets attached in flat mode, so every page speaks through
the same socket with its own `sessionId`. Every wait here is bounded, and the
browser's process group is killed and its profile removed however the test ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = Path("/usr/bin/chromium")
# Headless as root needs --no-sandbox; the rest keeps Chromium from
# phoning home (component updates, sync, QUIC probes) and lets muted video autoplay.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
    "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.02

Listener = Callable[[dict[str, Any]], None]


class CDPError(Exception):
    pass


class Connection:
    """One DevTools websocket: commands matched to replies by id, events to listeners."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._http = http
        self._ws = ws
        self._next_id = 0
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: list[tuple[str | None, str, Listener]] = []
        self._reader = asyncio.create_task(self._read(), name="cdp-reader")

    async def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session_id: str | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        reply = self._replies[self._next_id] = asyncio.get_running_loop().create_future()
        try:
            await self._ws.send_json(message)
            result = await asyncio.wait_for(reply, timeout_s)
        finally:
            self._replies.pop(message["id"], None)
        if "error" in result:
            raise CDPError(f"{method}: {result['error'].get('message')} {result['error']}")
        return result.get("result", {})

    def on(self, method: str, listener: Listener, session_id: str | None = None) -> None:
        """Call `listener(params)` for each `method` event (of `session_id`'s target)."""
        self._listeners.append((session_id, method, listener))

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                if message.type is not aiohttp.WSMsgType.TEXT:
                    continue
                data = message.json()
                if "id" in data:
                    reply = self._replies.get(data["id"])
                    if reply is not None and not reply.done():
                        reply.set_result(data)
                    continue
                for session_id, method, listener in self._listeners:
                    if method == data.get("method") and session_id == data.get("sessionId"):
                        listener(data.get("params", {}))
        finally:
            for reply in self._replies.values():
                if not reply.done():
                    reply.set_exception(CDPError("the DevTools connection closed"))

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._http.close()


class Page:
    """One browser tab: navigation, script evaluation, and what it requested and logged."""

    def __init__(self, connection: Connection, session_id: str, target_id: str) -> None:
        self.connection = connection
        self.session_id = session_id
        self.target_id = target_id
        self.requests: list[str] = []  # every URL the page asked for, in order
        self.console: list[str] = []  # console messages and uncaught exceptions
        self._loaded = asyncio.Event()
        connection.on("Network.requestWillBeSent", self._on_request, session_id)
        connection.on("Page.loadEventFired", lambda _: self._loaded.set(), session_id)
        connection.on("Runtime.consoleAPICalled", self._on_console, session_id)
        connection.on("Runtime.exceptionThrown", self._on_exception, session_id)

    async def enable(self) -> None:
        for domain in ("Page", "Network", "Runtime"):
            await self.send(f"{domain}.enable")

    async def send(
        self, method: str, timeout_s: float = COMMAND_TIMEOUT_S, **params: Any
    ) -> dict[str, Any]:
        return await self.connection.send(method, params, self.session_id, timeout_s)

    async def navigate(self, url: str, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self._loaded.clear()
        result = await self.send("Page.navigate", url=url)
        if "errorText" in result:
            raise CDPError(f"navigating to {url}: {result['errorText']}")
        await asyncio.wait_for(self._loaded.wait(), timeout_s)

    async def evaluate(self, expression: str, timeout_s: float = COMMAND_TIMEOUT_S) -> Any:
        """The value of a JS expression (awaited if it is a promise), as JSON."""
        result = await self.send(
            "Runtime.evaluate",
            timeout_s=timeout_s,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            description = details.get("exception", {}).get("description", details.get("text"))
            raise CDPError(f"{expression!r} threw: {description}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = COMMAND_TIMEOUT_S) -> Any:
        """Poll a JS expression until it is truthy; its value. Fails after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{expression!r} still {value!r} after {timeout_s} s; console: {self.console}"
                )
            await asyncio.sleep(POLL_INTERVAL_S)

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(result["data"]))

    def _on_request(self, params: dict[str, Any]) -> None:
        self.requests.append(params["request"]["url"])

    def _on_console(self, params: dict[str, Any]) -> None:
        text = " ".join(str(arg.get("value", arg.get("description"))) for arg in params["args"])
        self.console.append(f"{params['type']}: {text}")

    def _on_exception(self, params: dict[str, Any]) -> None:
        details = params["exceptionDetails"]
        self.console.append(
            f"exception: {details.get('exception', {}).get('description', details.get('text'))}"
        )


class Browser:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    async def new_page(self, width: int = 1280, height: int = 900) -> Page:
        target = await self.connection.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.connection.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self.connection, attached["sessionId"], target["targetId"])
        await page.enable()
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return page

    async def close_page(self, page: Page) -> None:
        await self.connection.send("Target.closeTarget", {"targetId": page.target_id})


@contextlib.asynccontextmanager
async def launch_chromium(executable: Path = CHROMIUM) -> AsyncIterator[Browser]:
    profile = Path(tempfile.mkdtemp(prefix="vaecast-chromium-"))
    log_path = profile.parent / f"{profile.name}.log"
    process = await asyncio.to_thread(_spawn, executable, profile, log_path)
    connection: Connection | None = None
    try:
        port, path = await asyncio.to_thread(_devtools_address, profile, process, log_path)
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        except BaseException:
            await http.close()
            raise
        connection = Connection(http, ws)
        yield Browser(connection)
    finally:
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.send("Browser.close"), CLOSE_TIMEOUT_S)
            await connection.close()
        await asyncio.to_thread(_stop, process)
        shutil.rmtree(profile, ignore_errors=True)
        log_path.unlink(missing_ok=True)


def _spawn(executable: Path, profile: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        # A session of its own, so teardown can kill Chromium's helper processes
        # (zygote, renderer, GPU) with the browser, and nothing else.
        return subprocess.Popen(
            [str(executable), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def _devtools_address(
    profile: Path, process: subprocess.Popen[bytes], log_path: Path
) -> tuple[int, str]:
    """The (port, browser websocket path) Chromium wrote to DevToolsActivePort."""
    active_port = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = log_path.read_text(errors="replace")
            raise CDPError(f"chromium exited with {process.returncode}: {log}")
        # Chromium writes the file whole once it listens; a partial read is retried.
        lines = active_port.read_text().split() if active_port.exists() else []
        if len(lines) == 2:
            return int(lines[0]), lines[1]
        time.sleep(0.05)
    raise CDPError(f"chromium wrote no {active_port} within {START_TIMEOUT_S} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Wait briefly for the browser to exit after Browser.close, then kill its group."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(CLOSE_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(CLOSE_TIMEOUT_S)
