"""Push sessions: send latents (or frames) to a vaecast server while they are generated.

    with PushSession("http://127.0.0.1:8000", fps=16) as session:
        print("watch:", session.watch_url)
        for block in generate_blocks():  # (C, t, H, W) or (1, C, t, H, W) latent frames
            session.push(block)

A producer that decodes on its own pushes frames instead (`kind="frames"`): uint8
`(T, H, W, 3)` RGB, or floats `(1, 3, T, H, W)` / `(3, T, H, W)` in `value_range`
(default [0, 1]), torch or numpy. Float frames are quantized to uint8 where they are
(on the GPU for a CUDA tensor) and copied to the host once per block: a quarter of the
bytes of float32 go over the network, and the server encodes the same pixels.

`AsyncPushSession` is the same over aiohttp (`async with`, `await session.push(block)`).
Entering creates the job (`POST /v1/videos`, `{"input": "push", ...}`); each `push`
sends one safetensors block to the job's latents URL with its push token and returns the
server's 202 answer once the block is queued. That POST waits while the server's block
queue is full, so a generator is held back exactly as far as the decoder is behind.
Leaving normally sends the final mark (an empty block with `?final=1`); leaving by an
exception cancels the job (`DELETE`) and re-raises.

Each request goes on a new connection: a generator may take longer between blocks than
the server keeps an idle keep-alive connection.

Pushes are safe to retry: each block carries its index (`X-Push-Seq`, from 0, the
final mark included), and the server answers a block it already took with the same
answer and adds nothing. A push whose connection fails (refused, reset, closed before
the answer) or that gets a 502, 503, 504 or 429 is sent again with the same index (a
timeout is not: `timeout` bounds the wait, backpressure included), after `Retry-After`
where the server sent one, else after a backoff doubling from 0.1 s to 2 s, for at most
`retry_s` seconds in all (60 by default; 0: never), then `PushError` is raised. Other
answers (a 4xx that says what is wrong with the block) are raised at once.
"""

from __future__ import annotations

import asyncio
import http.client
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from vaecast.client.blocks import Array
from vaecast.client.protocol import (
    MAX_ANSWER_BYTES,
    PushError,
    PushSessionBase,
    Request,
    parse_answer,
    retry_delay,
)
from vaecast.client.transport import open_request

if TYPE_CHECKING:
    import aiohttp


class PushSession(PushSessionBase):
    """A push session over the standard library's http.client; see the module docstring."""

    def open(self) -> Self:
        """Create the job (once); `with` does this."""
        if self._job is None:
            self._created(self._send(self._create_request()))
        return self

    def push(
        self, block: Array, audio: Array | None = None, *, final: bool = False
    ) -> dict[str, Any]:
        """Send one block (latents, or frames in a frames session); the server's answer
        once it is queued (`latent_frames`, ...).

        `final=True` marks it the last, so leaving the session sends nothing more.
        """
        self._check_pushable()  # before the work of serializing
        answer = self._push(self._push_request(self._encode(block, audio), final))
        self._finalized |= final
        return answer

    def _push(self, request: Request) -> dict[str, Any]:
        """Send a push, retried with the same index as the module docstring says."""
        started, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            try:
                return self._pushed(self._send(request))
            except PushError as error:
                spent = time.monotonic() - started
                delay = retry_delay(error, attempts, spent, self.retry_s)
                if delay is None:
                    raise self._gave_up(error, attempts, started) from error.__cause__
            time.sleep(delay)

    def refresh(self) -> dict[str, Any]:
        """The job as the server has it now (status, progress, ...); updates `job`."""
        self._job = {**self._opened(), **self._send(self._refresh_request())}
        return self.job

    def cancel(self) -> dict[str, Any]:
        """Cancel the job (DELETE); the session is closed. The server's answer."""
        answer = self._send(self._cancel_request())
        self._closed = True
        return answer

    def close(self, final: bool = True) -> None:
        """End the session: send the final mark (`final=True`) or cancel the job.

        Once the final mark has gone out (`push(..., final=True)`) there is nothing to
        send or cancel. The session is closed even when this request fails; closing
        twice does nothing.
        """
        if self._closed or self._job is None or self._finalized:
            self._closed = True
            return
        request = self._push_request(b"", final=True) if final else self._cancel_request()
        self._closed = True  # even if this fails: the server ends a session left open
        if final:
            self._push(request)
        else:
            self._send(request)
        self._finalized = final

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close(final=True)
            return
        if self._should_cancel(exc):
            try:
                self._send(self._cancel_request())
            except Exception as cancel_error:  # the original error is the one to see
                exc.add_note(f"cancelling the job failed too: {cancel_error}")
        self._closed = True

    def _send(self, request: Request) -> dict[str, Any]:
        url = self._url(request.path)
        connection, response = open_request(url, request, self.timeout, PushError)
        try:
            data = response.read(MAX_ANSWER_BYTES + 1)
        except TimeoutError as error:
            raise PushError(0, "timeout", f"{request.method} {url}: no answer") from error
        except (OSError, http.client.HTTPException) as error:
            raise PushError(0, "connection_error", f"{request.method} {url}: {error}") from error
        finally:
            connection.close()
        return parse_answer(response.status, data, response.getheader("Retry-After"))


class AsyncPushSession(PushSessionBase):
    """A push session over aiohttp, for a generator running in an event loop."""

    _http: aiohttp.ClientSession | None = None

    async def open(self) -> Self:
        """Create the job (once); `async with` does this."""
        if self._job is None:
            import aiohttp  # here, so that the sync client and `vaecast push` need none of it

            if self._http is None:
                timeout = aiohttp.ClientTimeout(
                    total=None, sock_connect=self.timeout, sock_read=self.timeout
                )
                connector = aiohttp.TCPConnector(force_close=True)  # see the module docstring
                self._http = aiohttp.ClientSession(connector=connector, timeout=timeout)
            try:
                self._created(await self._send(self._create_request()))
            except BaseException:
                await self._close_http()
                raise
        return self

    async def push(
        self, block: Array, audio: Array | None = None, *, final: bool = False
    ) -> dict[str, Any]:
        """Send one block; see `PushSession.push`. Serialized in a thread, off the loop."""
        self._check_pushable()  # before the work of serializing
        body = await asyncio.to_thread(self._encode, block, audio)
        answer = await self._push(self._push_request(body, final))
        self._finalized |= final
        return answer

    async def _push(self, request: Request) -> dict[str, Any]:
        """See `PushSession._push`."""
        started, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            try:
                return self._pushed(await self._send(request))
            except PushError as error:
                spent = time.monotonic() - started
                delay = retry_delay(error, attempts, spent, self.retry_s)
                if delay is None:
                    raise self._gave_up(error, attempts, started) from error.__cause__
            await asyncio.sleep(delay)

    async def refresh(self) -> dict[str, Any]:
        self._job = {**self._opened(), **(await self._send(self._refresh_request()))}
        return self.job

    async def cancel(self) -> dict[str, Any]:
        try:
            return await self._send(self._cancel_request())
        finally:
            self._closed = True
            await self._close_http()

    async def close(self, final: bool = True) -> None:
        """See `PushSession.close`; also closes the HTTP client."""
        try:
            if not (self._closed or self._job is None or self._finalized):
                request = self._push_request(b"", final=True) if final else self._cancel_request()
                self._closed = True  # even if this fails: the server ends a session left open
                if final:
                    await self._push(request)
                else:
                    await self._send(request)
                self._finalized = final
        finally:
            self._closed = True
            await self._close_http()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close(final=True)
            return
        try:
            if self._should_cancel(exc):
                await self._send(self._cancel_request())
        except Exception as cancel_error:
            exc.add_note(f"cancelling the job failed too: {cancel_error}")
        finally:
            self._closed = True
            await self._close_http()

    async def _close_http(self) -> None:
        if self._http is not None:
            http_session, self._http = self._http, None
            await http_session.close()

    async def _send(self, request: Request) -> dict[str, Any]:
        import aiohttp

        if self._http is None:
            raise RuntimeError("the push session is closed")
        where = f"{request.method} {request.path}"
        try:
            async with self._http.request(
                request.method,
                self._url(request.path),
                data=request.body,
                headers=request.headers,
            ) as response:
                data = bytearray()
                async for piece in response.content.iter_chunked(64 * 1024):
                    data += piece
                    if len(data) > MAX_ANSWER_BYTES:
                        break
                status, retry_after = response.status, response.headers.get("Retry-After")
        except TimeoutError as error:
            raise PushError(0, "timeout", f"{where}: no answer in time") from error
        except aiohttp.ClientError as error:
            raise PushError(0, "connection_error", f"{where}: {error}") from error
        return parse_answer(status, bytes(data), retry_after)
