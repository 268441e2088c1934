"""The earliest stall-free start (`vaecast.playback_deadlines`), checked against a
viewer simulated frame by frame: starting there plays every fragment in time, and
starting 20% earlier stalls where the decode runs below real time."""

from __future__ import annotations

import pytest

from vaecast.playback_deadlines import Commit, slack, stall_free_start_s

CHUNK_S = 0.25


def paced(rate: float, chunks: int, first_at: float = 1.0) -> list[Commit]:
    """A decode making `rate` seconds of video per second, a chunk at a time."""
    return [
        Commit(first_at + index * CHUNK_S / rate, index * CHUNK_S, CHUNK_S)
        for index in range(chunks)
    ]


def stalls(commits: list[Commit], start_delay_s: float) -> int:
    """Fragments a viewer starting `start_delay_s` after the first one waits for."""
    first = commits[0]
    return sum(first.at + start_delay_s + c.pts_s < c.at - 1e-9 for c in commits)


def test_faster_than_real_time_starts_at_once():
    commits = paced(2.0, 12)
    assert stall_free_start_s(commits[:3], 3.0) == 0.0
    assert stall_free_start_s(commits, 3.0) == 0.0


@pytest.mark.parametrize("rate", [0.5, 0.8, 0.95])
def test_slower_than_real_time_is_predicted_from_the_first_fragments(rate: float):
    commits = paced(rate, 16)
    total = 16 * CHUNK_S
    predicted = stall_free_start_s(commits[:3], total)  # after 3 of 16 chunks
    assert predicted is not None and predicted > 0
    assert stalls(commits, predicted) == 0
    assert stalls(commits, 0.8 * predicted) > 0
    # And with every fragment in, it is exactly the smallest that works.
    whole = stall_free_start_s(commits, total)
    assert whole == pytest.approx(predicted, abs=1e-3)
    assert slack(commits[0], commits[-1]) == pytest.approx(-whole, abs=1e-3)


def test_a_decode_that_slows_down_raises_the_prediction():
    fast = paced(2.0, 4)
    slow_start = fast[-1].at
    slowed = [
        *fast,
        *(
            Commit(slow_start + (i + 1) * CHUNK_S / 0.5, (4 + i) * CHUNK_S, CHUNK_S)
            for i in range(4)
        ),
    ]
    total = 16 * CHUNK_S
    assert stall_free_start_s(fast, total) == 0.0
    assert stall_free_start_s(slowed, total) > 1.0


def test_a_stream_of_unknown_length_looks_one_fragment_ahead():
    commits = paced(0.5, 4)
    known_next = stall_free_start_s(commits, None)
    assert known_next == pytest.approx(-slack(commits[0], paced(0.5, 5)[-1]), abs=1e-3)
    assert stall_free_start_s([], None) is None
    assert stall_free_start_s(commits[:1], None) is None  # no rate yet: not "at once"
    assert stall_free_start_s(commits[:1], CHUNK_S) == 0.0  # a one-chunk video is whole
