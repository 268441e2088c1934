"""The body pace rules (vaecast.server.edge.body_rate), as a table: no server."""

from __future__ import annotations

import pytest

from vaecast.server.edge.body_rate import BodyPace

PACE = BodyPace(pause_s=60.0, min_rate=1000, grace_s=5.0)


@pytest.mark.parametrize(
    ("now", "received", "deadline"),
    [
        (0.0, 0, 5.0),  # the grace first: any rate at all
        (4.0, 10, 5.0),
        (10.0, 20_000, 20.0),  # each byte buys 1/min_rate s
        (19.0, 20_000, 20.0),
        (30.0, 10**9, 90.0),  # fast: the pause limit
    ],
)
def test_the_next_read_waits_until_the_pause_or_the_rate_deadline(now, received, deadline):
    assert PACE.next_deadline(now, 0.0, received) == deadline


def test_no_minimum_rate_leaves_the_pause_limit_alone():
    pace = BodyPace(pause_s=60.0, min_rate=0, grace_s=5.0)
    assert pace.next_deadline(100.0, 0.0, 1) == 160.0
    assert pace.refusal(160.0, 0.0, 1).message == "no part of the request body arrived for 60 s"


def test_a_body_under_the_rate_is_refused_with_its_rate():
    error = PACE.refusal(5.0, 0.0, 5)
    assert (error.status, error.type) == (408, "request_timeout")
    assert error.message == (
        "the request body arrived at 1 bytes/s (5 bytes in 5.0 s); this server needs at "
        "least 1000 bytes/s after the first 5 s"
    )


def test_a_pause_before_the_rate_deadline_is_refused_as_a_pause():
    pace = BodyPace(pause_s=1.0, min_rate=1000, grace_s=5.0)
    assert pace.next_deadline(2.0, 0.0, 10) == 3.0
    assert pace.refusal(3.0, 0.0, 10).message == "no part of the request body arrived for 1 s"
