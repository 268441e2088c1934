"""A job's live viewers, written to in one batch as each segment of its MP4 is appended.

Every viewer of a running job gets the same bytes. Following the log each on its own
(woken at every append, a timeout scope and an aiohttp `write` per part) cost the
event loop ~50 us per viewer per fragment, most of what a hundred viewers add to it.
So a viewer that has been written everything so far (caught up), and whose socket
takes more (its transport not paused for writing), joins the log's `Broadcast`: at
each append the segment is framed once as an HTTP/1.1 chunk and sent to every member
in one batch, and the member's coroutine sleeps until something concerns it. What a
segment then costs per viewer is one send (the kernel's; on the fan-out thread from
`THREAD_FROM_MEMBERS` members on, see below) and a few attribute updates; the loop's
cost with 1 to 1,000 viewers is in benchmarks/results/benchmarks.md ("Fan-out").

What stays per viewer, through aiohttp's own `write` under `reader_write_timeout_s`:
the init segment (so the headers are out before any broadcast byte), catching up (a
late joiner, or a member whose socket was full at an append: it leaves, catches up
alone, and joins again), and the end (`write_eof`'s terminating chunk, or a cut). The
log's append still never waits: a full socket is skipped, not waited for.

Writing under aiohttp's writer is kept narrow. Only a chunked, uncompressed response
written by aiohttp's own `StreamWriter` with no hooks is a member; its bytes are
framed exactly as `StreamWriter._write_chunked_payload` frames them, and its
`output_size` and `buffer_size` grow as aiohttp's `_write` grows them (the access
log's body length; the drain aiohttp does past 64 KiB). `write_eof` then ends the
chunked body as usual, so keep-alive works. Any other writer follows the log alone.

The sends themselves are made by the server's `FanoutSender` thread where there is one
(`fanout_sender.py`: the kernel's send was most of the loop's CPU with many viewers).
Then a member's bytes stay in order by two rules: the thread gets a member only while
its transport holds none of its bytes (`_holds_nothing`: a send straight to the socket
would pass them), and while any queued batch names a member, nothing on the loop
writes to it, and it is not woken. A wake that comes
meanwhile (its socket filled, the log closed) waits until its last batch is reported
back; a short write's remainder is written by the loop, through the transport, when
its batch is reported, before anything else can be. Without a sender (or without a
descriptor for the thread) the loop writes to the member itself, at the append.

A broadcast with few members, and no batch out, is written by the loop too: for one
viewer (the usual case) a hop to the thread saves nothing, and it would add the thread's
wake-up and its wait for the GIL (which the decode thread may hold for milliseconds)
to every fragment's way to the viewer, the first one's included.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from aiohttp import web
from aiohttp.http_writer import StreamWriter

from vaecast.codecs.fragment import facts_of
from vaecast.server.faces.progressive.fanout_sender import (
    FAILED,
    SKIPPED,
    FanoutSender,
    SendBatch,
    open_member_socket,
)
from vaecast.server.stream.rendition import Attachment
from vaecast.server.stream.segment_log import SegmentLog

CRLF = b"\r\n"
# `on_written(n, at)`: a viewer had been written n segments by `at` (perf_counter).
Written = Callable[[int, float], None]
# From this many members a segment's sends go to the fan-out thread (measured: one
# send costs the loop ~14 us; a batch's hop and report ~40 us).
THREAD_FROM_MEMBERS = 8


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Woken(enum.Enum):
    BEHIND = enum.auto()  # its socket was full at an append: catch up alone
    CLOSED = enum.auto()  # the log finished or broke
    LEFT = enum.auto()  # the connection is gone


@dataclass(eq=False, slots=True)
class _Member:
    writer: StreamWriter
    woken: asyncio.Future[_Woken]
    written: int  # segments of the log it has been written
    fd: int | None = None  # its socket, duplicated for the sender thread
    detached: bool = False  # the thread's: it wrote short or failed; write no more
    in_flight: int = 0  # queued batches that name it
    why: _Woken | None = None  # the wake that waits for its batches
    on_written: Written | None = None  # its viewer's playout (see `Broadcast.tell`)
    told: int = 0  # segments `on_written` has been told of


def _holds_nothing(transport: asyncio.WriteTransport, member: _Member) -> bool:
    """Whether the fan-out thread may write `member`'s next frame to its socket.

    A batch already out for it: yes (the loop has written nothing to it since, so its
    transport holds nothing of its own). None: only if the transport's buffer is empty.
    Bytes the loop wrote earlier (while the member was under `THREAD_FROM_MEMBERS`, or
    catching up alone before it joined) may still wait there for the socket to drain,
    and a send straight to the socket would go out before them. Until they are out,
    the loop keeps writing to it through the transport, which keeps the order.
    """
    return member.in_flight > 0 or transport.get_write_buffer_size() == 0


def frame_chunk(data: bytes) -> bytes:
    """`data` as one HTTP/1.1 chunk, as aiohttp's chunked writer writes it."""
    return b"".join((b"%x\r\n" % len(data), data, CRLF))


def can_broadcast_to(response: web.StreamResponse, writer: object) -> bool:
    """Whether bytes framed here are what aiohttp would write for this response.

    aiohttp's `StreamWriter.write` frames a chunk itself only when it is chunked and
    neither compresses nor reports chunks to hooks; a subclass may do anything. The
    private attributes are read with a default that says no: an aiohttp that renamed
    them gets the per-viewer path, not wrong bytes. `writing_paused` (flow control, as
    the protocol sees it) is what a broadcast asks before each write.
    """
    return (
        type(writer) is StreamWriter
        and hasattr(writer.protocol, "writing_paused")
        and writer.chunked
        and writer.length is None
        and not response.compression
        and getattr(writer, "_compress", False) is None
        and getattr(writer, "_on_chunk_sent", False) is None
        and getattr(writer, "on_body_write", False) is None
    )


def thread_descriptor(transport: asyncio.BaseTransport) -> int | None:
    """A descriptor the fan-out thread may write a member's bytes to, or None.

    Only a transport that writes to its socket as is: bytes written to the socket under
    a TLS transport would go out unencrypted (vaecast serves no TLS itself, but a
    subclass or an embedding application could).
    """
    if transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    return None if sock is None else open_member_socket(sock.fileno())


class Broadcast:
    """The broadcast members among one SegmentLog's viewers (a job makes one with its log)."""

    def __init__(
        self, log: SegmentLog, bytes_sent: _Counter, sender: FanoutSender | None = None
    ) -> None:
        """Listens to `log`; `bytes_sent` counts the body bytes written to members;
        `sender` makes the sends off the loop (None: the loop makes them)."""
        # No reference to the log: it holds this one as a listener.
        self._members: dict[_Member, None] = {}
        self._bytes_sent = bytes_sent
        self._sender = sender
        self._batches_out = 0  # queued on the sender and not yet reported
        # The media time the first n + 1 segments hold, by n: a viewer written n + 1
        # segments has been sent `media_ends[n]` seconds (its playout, `viewers.py`);
        # and when segment n was appended, which is when its members were sent it.
        self.media_ends: list[float] = []
        self.append_times: list[float] = []
        self._by_viewer: dict[Written, _Member] = {}
        log.add_listener(self)

    @property
    def members(self) -> int:
        return len(self._members)

    # SegmentListener: called by the log, synchronously.

    def appended(self, segment: bytes) -> None:
        facts = facts_of(segment)  # None for the init segment
        ends = self.media_ends
        ends.append((ends[-1] if ends else 0.0) + (0.0 if facts is None else facts.duration_s))
        # Members are told of what they were sent later, in one go (`tell`): a call per
        # member per segment would cost the loop more than the sends with many viewers.
        self.append_times.append(time.perf_counter())
        if not self._members or not segment:  # an empty chunk would end the body
            return
        frame = frame_chunk(segment)
        size = len(frame)
        sent = 0
        for_thread: list[_Member] = []
        # The loop may write to a member with a descriptor only while no batch is out.
        to_thread = self._batches_out > 0 or len(self._members) >= THREAD_FROM_MEMBERS
        for member in list(self._members):
            writer = member.writer
            protocol = writer.protocol
            transport = protocol.transport
            if transport is None or transport.is_closing():
                self._wake(member, _Woken.LEFT)
                continue
            if to_thread and member.fd is not None and _holds_nothing(transport, member):
                # The thread writes to the socket itself, past the transport: only while
                # the transport holds none of this member's bytes, or the frame would
                # overtake them. Then nothing on the loop writes to it until the batch is
                # reported, and a short write by the thread wakes it. The thread finds a
                # full socket itself.
                member.in_flight += 1
                for_thread.append(member)
                continue
            if protocol.writing_paused:
                self._wake(member, _Woken.BEHIND)
                continue
            try:
                transport.write(frame)
            except (OSError, RuntimeError):  # a socket that failed between the checks
                self._wake(member, _Woken.LEFT)
                continue
            writer.output_size += size
            writer.buffer_size += size
            member.written += 1
            sent += 1
        if sent:
            self._bytes_sent.inc(len(segment) * sent)
        if for_thread:
            assert self._sender is not None  # members get a descriptor only with one
            reported = functools.partial(self._reported, len(segment))
            if self._sender.submit(SendBatch(frame, for_thread), reported):
                self._batches_out += 1
            else:
                for member in for_thread:  # the thread is far behind: each catches up alone
                    member.in_flight -= 1
                    self._wake(member, _Woken.BEHIND)

    def closed(self) -> None:
        for member in list(self._members):
            self._wake(member, _Woken.CLOSED)

    def _reported(self, segment_bytes: int, batch: SendBatch, results: list[int]) -> None:
        """The sender thread's results for `batch`, on the loop, in the order sent."""
        self._batches_out -= 1
        frame = batch.frame
        size = len(frame)
        sent = 0
        members = self._members
        targets = cast("list[_Member]", batch.targets)  # what `appended` queued
        for member, written in zip(targets, results, strict=True):
            member.in_flight -= 1
            if written == size:
                writer = member.writer
                writer.output_size += size
                writer.buffer_size += size
                member.written += 1
                sent += 1
                if member.in_flight == 0 and member not in members:
                    self._settle(member)  # it left while this batch was out
                continue
            if written == FAILED:
                self._wake(member, _Woken.LEFT)
            elif written != SKIPPED:  # short: its socket is full
                transport = member.writer.transport
                if transport is None or transport.is_closing():
                    self._wake(member, _Woken.LEFT)
                else:
                    # Nothing else can have been written to it since: its later batches
                    # skip it (detached), and the loop writes to no member in a batch.
                    transport.write(frame[written:])
                    member.writer.output_size += size
                    member.writer.buffer_size += size
                    member.written += 1
                    sent += 1
                    self._wake(member, _Woken.BEHIND)
            self._settle(member)  # SKIPPED: woken by an earlier batch, waiting for this one
        if sent:
            self._bytes_sent.inc(segment_bytes * sent)

    def _wake(self, member: _Member, why: _Woken) -> None:
        self._members.pop(member, None)
        if member.why is None:
            member.why = why
        self._settle(member)

    def _settle(self, member: _Member) -> None:
        """Wake a member that has left the broadcast once no batch names it any more,
        and give back its descriptor."""
        if member.in_flight or member in self._members:
            return
        if member.fd is not None:
            os.close(member.fd)
            member.fd = None
        if not member.woken.done():
            member.woken.set_result(member.why or _Woken.LEFT)

    # One viewer.

    async def follow(
        self,
        log: SegmentLog,
        response: web.StreamResponse,
        writer: object,
        timeout_s: float,
        on_written: Written | None = None,
    ) -> None:
        """Write the whole log to one prepared response, alone or as a member;
        `on_written(n, at)` is told that the viewer had been written n segments by
        `at`: at once when it is written alone, and for its time as a member when it
        leaves the broadcast, or is asked (`tell`).

        Returns after the log's last segment; raises the log's error if it broke,
        TimeoutError if the viewer took nothing for `timeout_s`, ConnectionError
        if it left. The caller ends or cuts the response.
        """
        broadcastable = can_broadcast_to(response, writer)
        index = 0
        while True:
            while index < len(log):
                part = await log.read_segment(index)
                async with asyncio.timeout(timeout_s):
                    await response.write(part)
                self._bytes_sent.inc(len(part))
                index += 1
                if on_written is not None:
                    on_written(index, time.perf_counter())
            if log.closed:
                if log.error is not None:
                    raise log.error.detached()
                return
            if not broadcastable or index == 0:  # members' headers are out: init went alone
                await log.wait_for_segments(index + 1)
                continue
            assert isinstance(writer, StreamWriter)
            transport = writer.transport
            if transport is None or transport.is_closing():
                # Checked here, not left to drain(): a lost connection's protocol stays
                # "paused", and drain() then returns at once, without yielding.
                raise ConnectionResetError("the viewer's connection is gone")
            if writer.protocol.writing_paused:  # caught up, but its socket is full
                async with asyncio.timeout(timeout_s):
                    await writer.drain()
                continue
            # Nothing awaited since `index == len(log)` was seen: no append is missed.
            why, index = await self._member(writer, index, on_written)
            if why is _Woken.LEFT:
                raise ConnectionResetError("the viewer's connection is gone")

    def tell(self, on_written: Written) -> None:
        """Tell the viewer of `on_written`, while it is a member, what it was sent."""
        member = self._by_viewer.get(on_written)
        if member is not None:
            self._tell(member)

    def _tell(self, member: _Member) -> None:
        told, on_written, times = member.told, member.on_written, self.append_times
        if on_written is None:
            return
        for count in range(told + 1, member.written + 1):
            on_written(count, times[count - 1])
        member.told = max(told, member.written)

    async def _member(
        self, writer: StreamWriter, index: int, on_written: Written | None
    ) -> tuple[_Woken, int]:
        member = _Member(writer, asyncio.get_running_loop().create_future(), index)
        member.on_written, member.told = on_written, index
        if on_written is not None:
            self._by_viewer[on_written] = member
        if self._sender is not None:
            member.fd = thread_descriptor(writer.transport)
        self._members[member] = None
        try:
            why = await member.woken
        finally:
            # Cancelled: the handler is gone; its descriptor goes when no batch names it.
            self._members.pop(member, None)
            self._settle(member)
            if on_written is not None:
                self._by_viewer.pop(on_written, None)
                self._tell(member)
        return why, member.written


# Each rendition's broadcast, attached by the progressive face as the rendition is made.
BROADCAST = Attachment("progressive.broadcast", Broadcast)
