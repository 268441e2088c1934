"""Live viewers as broadcast members: the same bytes, the same guarantees as alone.

Each test runs a real job on a real server over 127.0.0.1 and checks, besides what
viewers receive, that the broadcast really carried them (its member count while the
decode is held), so a regression to the per-viewer path cannot pass unnoticed.

Every test runs twice: with the members' sends made on the server's fan-out thread
(`fanout_sender.py`, here however few the members), and made by the loop, as for a
member the thread cannot take (no descriptor to spare).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import io
import os
import re
import socket
from dataclasses import replace

import aiohttp
import pytest
import torch
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from tests.helpers import FailingDecoder, GatedDecoder, safetensors_bytes, smooth_latents, until
from tests.helpers.mp4_duration import as_streamed
from tests.helpers.server import (
    TEST_CONFIG,
    Server,
    StartServer,
    noisy_latents,
    read_boxes,
    serve_on_loopback,
)
from vaecast.codecs.fmp4_reader import iter_boxes
from vaecast.server.faces.progressive import broadcast
from vaecast.server.faces.progressive.broadcast import (
    BROADCAST,
    Broadcast,
    can_broadcast_to,
    frame_chunk,
)
from vaecast.server.stream.job import Job
from vaecast.server.stream.segment_log import SegmentLog

VIEWERS = 40
LATENT_FRAMES = 6
# Near-lossless H.264 of random colour blocks: ~230 KB a fragment, more than a socket
# that is not read takes (so its transport pauses), ~8 MB in all.
BIG_VIDEO = {"frames": 36, "height": 56, "width": 56}
BIG_ENCODER = replace(TEST_CONFIG.encoder, crf=1)


@pytest.fixture(params=["thread", "loop"], autouse=True)
def sends(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Who writes to the members: the fan-out thread (here from the first member), or
    the loop."""
    if request.param == "loop":
        monkeypatch.setattr(broadcast, "open_member_socket", lambda fd: None)
    else:
        monkeypatch.setattr(broadcast, "THREAD_FROM_MEMBERS", 1)
    return request.param


def duplicated_sockets() -> int:
    """Sockets this process holds more than one descriptor of (the fan-out thread's)."""
    inodes: collections.Counter[int] = collections.Counter()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes[int(target[8:-1])] += 1
    return sum(1 for count in inodes.values() if count > 1)


async def create_job(server: Server, latents: torch.Tensor) -> Job:
    body = io.BytesIO(safetensors_bytes(latents=latents))
    async with server.client.post("/v1/videos", data=body) as r:
        assert r.status == 201
        return server.manager.get((await r.json())["id"])


def content_url(job: Job) -> str:
    return f"/v1/videos/{job.id}/content"


def members(job: Job) -> int:
    broadcast = job.final.attached(BROADCAST)
    assert broadcast is not None
    return broadcast.members


async def watch(server: Server, job: Job) -> bytes:
    async with server.client.get(content_url(job)) as response:
        assert response.status == 200
        return await response.read()


async def finished_file(server: Server, job: Job) -> bytes:
    """The finished file, as its live viewers were sent it: byte for byte, but for the
    durations its init segment states now and could not then (`fmp4_finish`)."""
    await asyncio.wait_for(job.wait(), 60)
    async with server.client.get(content_url(job)) as response:
        assert response.headers["ETag"]  # the finished-file path, not the stream
        return as_streamed(await response.read())


async def bytes_sent(server: Server) -> float:
    async with server.client.get("/metrics") as response:
        text = await response.text()
    found = re.search(r"^vaecast_bytes_sent_total (\S+)$", text, re.MULTILINE)
    assert found is not None
    return float(found.group(1))


def raw_request(
    server: Server, path: str, *, close: bool, rcvbuf: int | None = None
) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect((host, int(port)))
    connection = "Connection: close\r\n" if close else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{connection}\r\n".encode())
    return sock


class RawResponse:
    """A strict HTTP/1.1 reader of one response on a raw socket: every chunk as sent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise EOFError("the server closed the connection")
        self.buffer += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _take(self, count: int) -> bytes:
        while len(self.buffer) < count:
            self._fill()
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def head(self) -> tuple[bytes, dict[str, str]]:
        status = self._line()
        headers = {}
        while line := self._line():
            name, value = line.decode().split(":", 1)
            headers[name.strip().lower()] = value.strip()
        return status, headers

    def chunks(self) -> list[bytes]:
        """The chunked body, one item per chunk; the terminating chunk must be there."""
        chunks = []
        while True:
            size_line = self._line()
            assert re.fullmatch(rb"[0-9a-f]+", size_line), size_line
            size = int(size_line, 16)
            if size == 0:
                assert self._line() == b""  # no trailers
                return chunks
            chunks.append(self._take(size))
            assert self._take(2) == b"\r\n"

    def body(self, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding") == "chunked":
            return b"".join(self.chunks())
        return self._take(int(headers["content-length"]))


def test_a_chunk_is_framed_as_aiohttp_frames_it() -> None:
    assert frame_chunk(b"a") == b"1\r\na\r\n"
    assert frame_chunk(b"x" * 255) == b"ff\r\n" + b"x" * 255 + b"\r\n"
    assert frame_chunk(b"x" * 0x1000) == b"1000\r\n" + b"x" * 0x1000 + b"\r\n"


async def test_many_viewers_get_the_finished_file_byte_for_byte_through_the_broadcast(
    start_server: StartServer, sends: str
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
    viewers = [asyncio.create_task(watch(server, job)) for _ in range(VIEWERS)]
    # Held at chunk 2: each has been written the init segment alone, and then joined.
    await until(lambda: members(job) == VIEWERS)
    # The thread writes to a duplicate of each member's socket (the loop owns the original).
    assert duplicated_sockets() == (VIEWERS if sends == "thread" else 0)
    decoder.gate.set()
    streams = await asyncio.gather(*viewers)
    assert (server.fanout.batches_sent > 0) == (sends == "thread")
    await until(lambda: duplicated_sockets() == 0)  # each given back as its member left
    sent = await bytes_sent(server)
    whole = await finished_file(server, job)
    assert {hashlib.sha256(stream).digest() for stream in streams} == {
        hashlib.sha256(whole).digest()
    }
    assert [box.type for box in iter_boxes(whole)].count("moof") == LATENT_FRAMES
    assert sent == VIEWERS * len(whole)  # the metric counts broadcast bytes per viewer
    assert members(job) == 0 and job.viewers == 0


async def test_broadcast_chunks_are_one_segment_each_and_the_connection_stays_usable(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
    sock = raw_request(server, content_url(job), close=False)
    try:
        reader = RawResponse(sock)
        await until(lambda: members(job) == 1)
        decoder.gate.set()
        status, headers = await asyncio.to_thread(reader.head)
        assert status == b"HTTP/1.1 200 OK"
        assert headers["transfer-encoding"] == "chunked"
        chunks = await asyncio.to_thread(reader.chunks)
        await asyncio.wait_for(job.wait(), 60)
        segments = [await job.log.read_segment(i) for i in range(len(job.log))]
        segments[0] = as_streamed(segments[0])  # as it went out live: no duration yet
        # The init segment went through aiohttp's writer, the rest through the broadcast:
        # the same framing, one chunk per segment, then the terminating chunk.
        assert chunks == segments
        # aiohttp still knows where the response ended: the next request on this very
        # connection is answered (keep-alive).
        host = server.url.removeprefix("http://").split(":")[0]
        sock.sendall(f"GET {content_url(job)} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        status, headers = await asyncio.to_thread(reader.head)
        assert status == b"HTTP/1.1 200 OK"
        assert as_streamed(await asyncio.to_thread(reader.body, headers)) == b"".join(segments)
    finally:
        sock.close()


async def test_a_late_joiner_catches_up_from_spilled_segments_and_joins(
    start_server: StartServer, tmp_path
):
    held = 3
    decoder = GatedDecoder(hold_at=held)
    server = await start_server(
        decoders={"linear": decoder}, spill_threshold_bytes=1024, spill_dir=str(tmp_path)
    )
    job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
    early = await server.client.get(content_url(job))
    early_boxes = await read_boxes(early, 2 + 2 * held)
    await until(lambda: members(job) == 1)
    assert job.log.spill_path is not None  # the late joiner reads most of it from disk
    late = await server.client.get(content_url(job))
    late_boxes = await read_boxes(late, 2 + 2 * held)
    assert late_boxes == early_boxes
    await until(lambda: members(job) == 2)  # caught up: now a member too
    decoder.gate.set()
    early_rest, late_rest = await asyncio.gather(early.read(), late.read())
    whole = await finished_file(server, job)
    assert b"".join(early_boxes) + early_rest == whole
    assert b"".join(late_boxes) + late_rest == whole
    early.close()
    late.close()


@pytest.mark.parametrize("handler_cancellation", [True, False])
async def test_a_member_that_leaves_does_not_disturb_the_others(
    start_server: StartServer, handler_cancellation: bool
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(
        decoders={"linear": decoder}, handler_cancellation=handler_cancellation
    )
    job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
    leaving = await server.client.get(content_url(job))
    await read_boxes(leaving, 2 + 2 * 2)
    staying = [asyncio.create_task(watch(server, job)) for _ in range(4)]
    await until(lambda: members(job) == 5)
    leaving.close()
    if handler_cancellation:  # its handler is cancelled, and leaves the broadcast at once
        await until(lambda: members(job) == 4)
    else:  # it is found gone at the next append, without a write to its closed socket
        await until(lambda: server.lost_connections > 0)
    decoder.gate.set()
    streams = await asyncio.gather(*staying)
    whole = await finished_file(server, job)
    assert streams == [whole] * 4
    await until(lambda: job.viewers == 0)
    assert members(job) == 0


async def test_a_member_whose_socket_fills_catches_up_alone_and_joins_again(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=30)  # ~7 MB in: far past what the sockets buffer
    server = await start_server(
        decoders={"linear": decoder}, encoder=BIG_ENCODER, reader_write_timeout_s=60
    )
    job = await create_job(server, noisy_latents(**BIG_VIDEO))
    slow = raw_request(server, content_url(job), close=True, rcvbuf=4096)
    try:
        await until(lambda: job.viewers == 1)
        reading = asyncio.create_task(watch(server, job))
        await asyncio.to_thread(decoder.holding.wait, 60)
        # The reading viewer is a member; the one that reads nothing left at an append
        # that found its socket full, and waits for it to drain, still attached.
        await until(lambda: members(job) == 1)
        assert job.viewers == 2
        received = bytearray()

        def read_to_the_end() -> None:
            while data := slow.recv(1 << 16):
                received.extend(data)

        read_all = asyncio.create_task(asyncio.to_thread(read_to_the_end))
        await until(lambda: members(job) == 2)  # it caught up alone, and joined again
        decoder.gate.set()
        await read_all
        whole = await finished_file(server, job)
        assert await reading == whole
        head, body = RawResponse(slow), bytes(received)
        head.buffer = body
        status, _ = head.head()
        assert status == b"HTTP/1.1 200 OK"
        assert b"".join(head.chunks()) == whole
    finally:
        slow.close()


async def test_a_member_that_stops_reading_is_dropped_while_the_others_finish(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(
        decoders={"linear": decoder}, encoder=BIG_ENCODER, reader_write_timeout_s=0.5
    )
    job = await create_job(server, noisy_latents(**BIG_VIDEO))
    stalled = raw_request(server, content_url(job), close=True, rcvbuf=4096)
    try:
        await until(lambda: job.viewers == 1)
        readers = [asyncio.create_task(watch(server, job)) for _ in range(3)]
        # The readers are members; the stalled one may have left already (socket full).
        await until(lambda: members(job) >= 3)
        decoder.gate.set()
        streams = await asyncio.gather(*readers)
        whole = await finished_file(server, job)
        assert streams == [whole] * 3
        await until(lambda: job.viewers == 0)
        async with server.client.get("/metrics") as response:
            assert "vaecast_readers_dropped_total 1.0" in await response.text()
        # It was cut, not ended: what it had buffered, then no terminating chunk.
        cut = RawResponse(stalled)
        status, _ = await asyncio.to_thread(cut.head)
        assert status == b"HTTP/1.1 200 OK"
        with pytest.raises(EOFError):
            await asyncio.to_thread(cut.chunks)
    finally:
        stalled.close()


async def test_a_cancelled_job_truncates_every_member(start_server: StartServer):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
    responses = [await server.client.get(content_url(job)) for _ in range(5)]
    await until(lambda: members(job) == 5)
    deleting = asyncio.create_task(server.client.delete(f"/v1/videos/{job.id}"))
    await until(lambda: job.error is not None)
    decoder.gate.set()
    async with await deleting as response:
        assert response.status == 200
    for response in responses:
        with pytest.raises(aiohttp.ClientPayloadError):  # no terminating chunk
            await response.read()
        response.close()
    await until(lambda: job.viewers == 0)
    assert members(job) == 0


async def test_a_failed_job_truncates_every_member(start_server: StartServer):
    decoder = FailingDecoder(fail_at=3)
    decoder.hold_at = 3  # held before it fails, so the viewers are members by then
    server = await start_server(decoders={"linear": decoder})
    job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
    responses = [await server.client.get(content_url(job)) for _ in range(5)]
    await until(lambda: members(job) == 5)
    decoder.gate.set()
    for response in responses:
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
        response.close()
    await asyncio.wait_for(job.wait(), 30)
    assert job.record.status == "failed"
    await until(lambda: job.viewers == 0)


async def test_a_response_aiohttp_compresses_follows_the_log_alone():
    """The writer is aiohttp's only while framing is all it does: compression is not."""
    log = SegmentLog()
    counter = Counter("sent", "bytes", registry=CollectorRegistry())
    broadcast = Broadcast(log, counter)
    takes_over: list[bool] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        response.enable_compression(web.ContentCoding.deflate)
        writer = await response.prepare(request)
        takes_over.append(can_broadcast_to(response, writer))
        await broadcast.follow(log, response, writer, 10)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    url = await serve_on_loopback(app, runner)
    try:
        await log.append(b"init" * 100)
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers={"Accept-Encoding": "deflate"}) as response,
        ):
            assert response.headers["Content-Encoding"] == "deflate"
            await until(lambda: takes_over == [False])
            for part in (b"a" * 5000, b"b" * 7000):
                await log.append(part)
                await asyncio.sleep(0.01)  # the handler's turn, were it to join
                assert broadcast.members == 0
            log.finish()
            body = await response.read()  # decompressed by the client
        assert body == b"init" * 100 + b"a" * 5000 + b"b" * 7000
    finally:
        await runner.cleanup()


async def test_aiohttp_counts_the_broadcast_bytes_it_did_not_write_itself():
    """`response.body_length` (the access log's size) is what went on the wire."""
    log = SegmentLog()
    broadcast = Broadcast(log, Counter("sent", "bytes", registry=CollectorRegistry()))
    lengths: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        writer = await response.prepare(request)
        await broadcast.follow(log, response, writer, 10)
        await response.write_eof()
        lengths.append(response.body_length)
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    url = await serve_on_loopback(app, runner)
    host, port = url.removeprefix("http://").split(":")
    try:
        await log.append(b"init" * 100)
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await until(lambda: broadcast.members == 1)
        for part in (b"a" * 5000, b"b" * 70000, b"c"):
            await log.append(part)
        log.finish()
        wire = bytearray()

        def read_to_the_end() -> None:
            while data := sock.recv(1 << 16):
                wire.extend(data)

        await asyncio.to_thread(read_to_the_end)
        sock.close()
        await until(lambda: len(lengths) == 1)
        assert lengths == [len(wire)]
        reader = RawResponse(sock)
        reader.buffer = bytes(wire)
        reader.head()
        assert reader.chunks() == [b"init" * 100, b"a" * 5000, b"b" * 70000, b"c"]
    finally:
        await runner.cleanup()


async def test_the_log_tells_its_listeners_of_spilled_segments_and_of_its_release(tmp_path):
    told: list[bytes | str] = []

    class Recorder:
        def appended(self, segment: bytes) -> None:
            told.append(segment)

        def closed(self) -> None:
            told.append("closed")

    log = SegmentLog(spill_threshold_bytes=100, spill_dir=tmp_path)
    await log.append(b"i" * 60)
    log.add_listener(Recorder())  # from now on
    await log.append(b"a" * 80)  # spilled: the listener still gets its bytes
    assert log.spill_path is not None
    await log.release()
    assert told == [b"a" * 80, "closed"]


async def test_members_of_a_log_released_midway_are_cut(start_server: StartServer):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
    responses = [await server.client.get(content_url(job)) for _ in range(3)]
    await until(lambda: members(job) == 3)
    await job.log.release()  # what eviction or shutdown does to a job's bytes
    for response in responses:
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
        response.close()
    await until(lambda: job.viewers == 0)
    decoder.gate.set()
    await asyncio.wait_for(job.wait(), 30)


async def test_a_few_members_are_written_by_the_loop_and_many_by_the_thread(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch, sends: str
):
    """(With no descriptor for the thread, the loop writes to them however many.)"""
    monkeypatch.setattr(broadcast, "THREAD_FROM_MEMBERS", 8)
    server = await start_server(decoders={"linear": GatedDecoder(hold_at=2)})
    sender = server.fanout
    for viewers, thread_used in ((7, False), (8, True)):
        decoder = GatedDecoder(hold_at=2)
        server.manager.decoders["linear"] = decoder
        job = await create_job(server, smooth_latents(frames=LATENT_FRAMES))
        before = sender.batches_sent
        watching = [asyncio.create_task(watch(server, job)) for _ in range(viewers)]
        await until(lambda: members(job) == viewers)  # noqa: B023 (awaited here)
        decoder.gate.set()
        streams = await asyncio.gather(*watching)
        assert streams == [await finished_file(server, job)] * viewers
        assert (sender.batches_sent > before) == (thread_used and sends == "thread"), viewers
