"""The fan-out thread on real sockets: what it writes, what it reports, its bounds."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from vaecast.server.faces.progressive import broadcast
from vaecast.server.faces.progressive.broadcast import thread_descriptor
from vaecast.server.faces.progressive.fanout_sender import (
    FAILED,
    SKIPPED,
    FanoutSender,
    SendBatch,
    open_member_socket,
    send,
)


@dataclass
class Target:
    fd: int | None
    detached: bool = False


class HeldTarget:
    """A target whose descriptor the thread cannot read until `release` is set."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.reached = threading.Event()
        self.release = threading.Event()
        self.detached = False

    @property
    def fd(self) -> int:
        self.reached.set()
        assert self.release.wait(10)
        return self._fd


@pytest.fixture
def pairs():
    made: list[tuple[socket.socket, socket.socket]] = []

    def make(count: int = 1) -> list[tuple[socket.socket, socket.socket]]:
        for _ in range(count):
            ours, theirs = socket.socketpair()
            ours.setblocking(False)
            made.append((ours, theirs))
        return made[-count:]

    yield make
    for ours, theirs in made:
        ours.close()
        theirs.close()


def read_exactly(sock: socket.socket, count: int) -> bytes:
    sock.settimeout(10)
    data = b""
    while len(data) < count:
        data += sock.recv(count - len(data))
    return data


async def submit_and_wait(sender: FanoutSender, batch: SendBatch) -> list[int]:
    reported: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    assert sender.submit(batch, lambda _batch, results: reported.set_result(results))
    return await asyncio.wait_for(reported, 10)


async def test_a_batch_reaches_every_target_in_order_and_is_reported_on_the_loop(pairs):
    sender = FanoutSender()
    sockets = pairs(3)
    targets = [Target(ours.fileno()) for ours, _ in sockets]
    try:
        first = await submit_and_wait(sender, SendBatch(b"one,", targets))
        second = await submit_and_wait(sender, SendBatch(b"two", targets))
    finally:
        await asyncio.to_thread(sender.close)
    assert first == [4, 4, 4] and second == [3, 3, 3]
    for _, theirs in sockets:
        assert read_exactly(theirs, 7) == b"one,two"
    assert sender.batches_sent == 2


def test_a_full_socket_takes_part_and_its_target_is_skipped_afterwards(pairs):
    ((ours, theirs),) = pairs()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    target = Target(ours.fileno())
    frame = os.urandom(4 << 20)  # far more than the socket takes unread
    written = send(frame, target)
    assert 0 < written < len(frame) and target.detached
    assert send(b"later", target) == SKIPPED
    assert read_exactly(theirs, written) == frame[:written]  # nothing but the frame's head


def test_a_connection_that_is_gone_fails_without_raising(pairs):
    ((ours, theirs),) = pairs()
    theirs.close()
    target = Target(ours.fileno())
    assert send(b"x" * 1000, target) == FAILED
    assert target.detached


async def test_a_full_queue_refuses_at_once_instead_of_waiting(pairs):
    ((ours, theirs),) = pairs()
    sender = FanoutSender(max_batches=1)
    held = HeldTarget(ours.fileno())
    reported: list[list[int]] = []
    try:
        assert sender.submit(SendBatch(b"a", [held]), lambda _b, r: reported.append(r))
        assert await asyncio.to_thread(held.reached.wait, 10)  # the thread is in it
        assert sender.submit(SendBatch(b"b", [Target(ours.fileno())]), lambda _b, r: None)
        # The queue holds its one batch: the next is refused, not waited for.
        assert not sender.submit(SendBatch(b"c", [Target(ours.fileno())]), lambda _b, r: None)
    finally:
        held.release.set()
        await asyncio.to_thread(sender.close)
    assert read_exactly(theirs, 2) == b"ab"  # close sent what was queued
    await asyncio.sleep(0)  # the report of the first batch, scheduled on this loop
    assert reported == [[1]]
    assert not sender.submit(SendBatch(b"d", [Target(ours.fileno())]), lambda _b, r: None)


async def test_the_thread_starts_with_the_first_batch_and_close_joins_it(pairs):
    ((ours, _),) = pairs()
    sender = FanoutSender()
    assert not fanout_threads()  # made, not started
    await submit_and_wait(sender, SendBatch(b"a", [Target(ours.fileno())]))
    assert len(fanout_threads()) == 1
    await asyncio.to_thread(sender.close)
    assert not fanout_threads()


def fanout_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "vaecast-fanout"]


def test_a_member_socket_is_a_duplicate_only_of_a_non_blocking_socket(pairs):
    ((ours, theirs),) = pairs()
    duplicate = open_member_socket(ours.fileno())
    assert duplicate is not None and duplicate != ours.fileno()
    try:
        assert os.fstat(duplicate).st_ino == os.fstat(ours.fileno()).st_ino
    finally:
        os.close(duplicate)
    theirs.setblocking(True)
    assert open_member_socket(theirs.fileno()) is None
    assert open_member_socket(1 << 30) is None  # no such descriptor


class FakeTransport:
    def __init__(self, extra: dict[str, object]) -> None:
        self.extra = extra

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.extra.get(name, default)


def test_the_thread_never_gets_the_socket_under_a_tls_transport(pairs):
    ((ours, _),) = pairs()
    plain = thread_descriptor(FakeTransport({"socket": ours}))
    assert plain is not None
    os.close(plain)
    tls = FakeTransport({"socket": ours, "ssl_object": object()})
    assert thread_descriptor(tls) is None
    assert thread_descriptor(FakeTransport({})) is None


DESCRIPTOR_PROBE = """
import json, os, resource, socket
from vaecast.server.faces.progressive.fanout_sender import open_member_socket
from vaecast.server.app import raise_open_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
ours, theirs = socket.socketpair()
ours.setblocking(False)
taken = []
while True:  # duplicates for the thread, until it keeps the rest for connections
    duplicate = open_member_socket(ours.fileno())
    if duplicate is None:
        break
    taken.append(duplicate)
spare = os.dup(ours.fileno())  # what an accept would still get
raised = raise_open_file_limit()
print(json.dumps({"highest": max(taken), "spare": spare, "raised": raised,
                  "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "hard": hard}))
"""


def test_duplicates_leave_a_quarter_of_the_limit_and_serve_raises_the_limit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", DESCRIPTOR_PROBE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["highest"] == 64 * 3 // 4 - 1  # every number below 48, none above
    assert found["spare"] < 64  # the descriptors left for accepting connections
    assert found["raised"] == found["soft"] == found["hard"]


class PendingTransport:
    """A member's transport: `pending` bytes it still holds for the socket."""

    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.pending

    def write(self, data: bytes) -> None:
        self.written.append(data)


class RecordingSender:
    def __init__(self) -> None:
        self.batches: list[SendBatch] = []

    def submit(self, batch: SendBatch, reported: object) -> bool:
        self.batches.append(batch)
        return True


@pytest.mark.parametrize("pending", [0, 30_000])
async def test_the_thread_never_overtakes_bytes_the_transport_still_holds(
    pairs, monkeypatch: pytest.MonkeyPatch, pending: int
):
    # A member the loop wrote to before (under the thread's threshold, or catching up
    # alone) may still have bytes in its transport. A send straight to its socket
    # would go out before them: the viewer would read a chunk inside another (seen
    # under load in test_broadcast's catch-up test). Until its transport is empty, the
    # loop writes to it through the transport, which keeps the order.
    monkeypatch.setattr(broadcast, "THREAD_FROM_MEMBERS", 1)
    ((ours, _),) = pairs()
    sender = RecordingSender()

    class Log:
        def add_listener(self, listener: object) -> None:
            pass

    class Counter:
        def inc(self, amount: float = 1) -> None:
            pass

    hub = broadcast.Broadcast(Log(), Counter(), sender)  # type: ignore[arg-type]
    transport = PendingTransport(pending)
    writer = SimpleNamespace(
        protocol=SimpleNamespace(transport=transport, writing_paused=False),
        output_size=0,
        buffer_size=0,
    )
    member = broadcast._Member(writer, asyncio.get_running_loop().create_future(), 1)  # type: ignore[arg-type]
    member.fd = open_member_socket(ours.fileno())
    hub._members[member] = None
    try:
        hub.appended(b"segment")
        frame = broadcast.frame_chunk(b"segment")
        if pending:
            assert transport.written == [frame] and sender.batches == []
            assert member.written == 2 and member.in_flight == 0
        else:
            assert transport.written == []
            assert [batch.targets for batch in sender.batches] == [[member]]
            assert member.in_flight == 1
    finally:
        os.close(member.fd)
