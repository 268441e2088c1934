"""A WebRTC viewer's clock tells a stream that ran dry (a stall: the unit came after it
was due) from a sender that woke late with the unit already there (a late send: the
host was busy). Both move the clock on by the lateness, so what follows keeps its
spacing; only the first says the job's media was late."""

from __future__ import annotations

import asyncio
from fractions import Fraction

from vaecast.codecs.access_units import AccessUnit
from vaecast.server.faces.whep.media import UnitLog
from vaecast.server.faces.whep.tracks import STALL_TOLERANCE_S, ViewerClock

LATE_S = 4 * STALL_TOLERANCE_S


async def test_a_unit_there_in_time_but_sent_late_is_a_late_send_not_a_stall():
    loop = asyncio.get_running_loop()
    clock = ViewerClock(join_s=0.0)
    clock.start(0.0)
    arrived = loop.time() - 1.0  # it was here a second before it was due
    await asyncio.sleep(LATE_S)  # and the sender wakes late
    await clock.wait_until_due(0.0, arrived)
    assert (clock.stalls, clock.stalled_s) == (0, 0.0)
    assert clock.late_sends == 1 and clock.late_s >= LATE_S
    # The clock moved on by as much: the next frame is due a frame after now.
    assert clock.stream_time(0.0) == clock.late_s


async def test_a_unit_that_came_after_it_was_due_is_a_stall():
    loop = asyncio.get_running_loop()
    clock = ViewerClock(join_s=0.0)
    clock.start(0.0)
    await asyncio.sleep(LATE_S)
    await clock.wait_until_due(0.0, loop.time())  # it comes only now
    assert clock.stalls == 1 and clock.stalled_s >= LATE_S
    assert clock.late_sends == 0
    # A unit with no arrival time known counts as one that came just now.
    await asyncio.sleep(LATE_S)
    await clock.wait_until_due(0.0, None)
    assert clock.stalls == 2 and clock.late_sends == 0


async def test_a_unit_due_later_waits_and_counts_nothing():
    loop = asyncio.get_running_loop()
    clock = ViewerClock(join_s=0.0)
    clock.start(0.0)
    started = loop.time()
    await clock.wait_until_due(0.1, started)
    assert loop.time() - started >= 0.1 - 0.005
    assert (clock.stalls, clock.late_sends) == (0, 0)


async def test_a_unit_log_keeps_when_each_received_unit_came():
    log = UnitLog(Fraction(1, 90000))
    unit = AccessUnit(pts=0, duration=3000, keyframe=True, data=b"\x00")
    log.append(unit)  # (the server's side appends without a time)
    log.receive([unit, unit], at=5.0)
    log.receive([unit], at=6.0)
    assert [log.arrived_at(i) for i in range(5)] == [None, 5.0, 5.0, 6.0, None]
