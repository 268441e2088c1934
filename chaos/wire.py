"""Raw HTTP/1.1 over asyncio streams: requests no well-behaved client library would
send, and connections left the rude way (FIN or RST at any byte)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

HEAD_LIMIT_BYTES = 1 << 20
CLOSED_WHILE_SENDING = "closed by the server while the request was still being sent"
SEND_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back: `status` None when no status line did (`problem` says why)."""

    status: int | None
    head_s: float  # from connecting to the whole response head (or to giving up)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    problem: str | None = None

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.problem}) after {self.head_s:.2f} s"
        excerpt = self.body[:160].decode(errors="replace").replace("\n", " ")
        return f"{self.status} after {self.head_s:.2f} s: {excerpt}"


def request_head(
    method: str, target: str, host: str, headers: list[tuple[str, str]], body_length: int | None
) -> bytes:
    """A request head; `body_length` None leaves Content-Length to the caller's headers."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


async def exchange(
    port: int,
    data: bytes,
    head_timeout_s: float,
    body_timeout_s: float = 2.0,
    max_body_bytes: int = 1 << 20,
) -> Answer:
    """Send `data` (head and body) while reading the answer: a server may answer and
    close before the body is all sent, and its answer must not be lost to a reset."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, limit=HEAD_LIMIT_BYTES), head_timeout_s
        )
    except (OSError, TimeoutError) as error:
        return Answer(None, time.monotonic() - started, problem=f"connect: {error!r}")
    sending = asyncio.ensure_future(_send(writer, data))
    try:
        answer = await _read_answer(reader, started, head_timeout_s, body_timeout_s, max_body_bytes)
        if answer.status is None and sending.done() and not sending.result():
            # The server closed while the request was still arriving (an oversized
            # head, say): the failed write ends the reader too, and with it any
            # answer that had arrived, so none can be expected.
            return Answer(None, answer.head_s, problem=CLOSED_WHILE_SENDING)
        return answer
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await close(writer)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> bool:
    """Whether all of `data` went out before the connection closed."""
    try:
        for start in range(0, len(data), SEND_CHUNK_BYTES):
            writer.write(data[start : start + SEND_CHUNK_BYTES])
            await writer.drain()
    except ConnectionError:
        return False
    return True


async def _read_answer(
    reader: asyncio.StreamReader,
    started: float,
    head_timeout_s: float,
    body_timeout_s: float,
    max_body_bytes: int,
) -> Answer:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), head_timeout_s)
    except TimeoutError:
        return Answer(None, time.monotonic() - started, problem="timeout")
    except asyncio.IncompleteReadError as error:
        problem = "closed without an answer" if not error.partial else "truncated head"
        return Answer(None, time.monotonic() - started, problem=problem)
    except (ConnectionError, asyncio.LimitOverrunError) as error:
        return Answer(None, time.monotonic() - started, problem=repr(error))
    status, headers = parse_head(head)
    while status is not None and 100 <= status < 200:  # interim (100 Continue): read on
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), head_timeout_s)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as error:
            problem = f"nothing after {status}: {error!r}"
            return Answer(None, time.monotonic() - started, problem=problem)
        status, headers = parse_head(head)
    head_s = time.monotonic() - started
    if status is None:
        return Answer(None, head_s, problem=f"unparseable head {head[:80]!r}")
    body = await read_some(reader, max_body_bytes, body_timeout_s)
    return Answer(status, head_s, headers, body)


def parse_head(head: bytes) -> tuple[int | None, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isascii():
        return None, {}
    if not parts[1].isdigit():
        return None, {}
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def read_some(reader: asyncio.StreamReader, max_bytes: int, timeout_s: float) -> bytes:
    """Up to `max_bytes`, until EOF or `timeout_s`; a reset ends it like EOF."""
    body = bytearray()
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(TimeoutError, ConnectionError):
        while len(body) < max_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            chunk = await asyncio.wait_for(reader.read(max_bytes - len(body)), remaining)
            if not chunk:
                break
            body += chunk
    return bytes(body)


async def close(writer: asyncio.StreamWriter) -> None:
    """Close politely (FIN), without waiting long for the peer."""
    writer.close()
    with contextlib.suppress(ConnectionError, TimeoutError, OSError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0): the abrupt end of a crashed or killed client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def connection(
    port: int, abrupt: bool
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection that is always left, whatever happens: with RST if `abrupt`, else FIN."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5.0)
    try:
        yield reader, writer
    finally:
        if abrupt:
            reset(writer)
        else:
            await close(writer)
