"""The live rendition's rule (`job.live_choice`), played over decode timelines: a final
faster than real time, 1.5x and 3x slower, with a preview twice as fast as real time."""

from __future__ import annotations

import math

import pytest

from vaecast.job.live_choice import (
    FINAL,
    PREVIEW,
    Chunk,
    decide,
    simulate,
    start_delay_s,
)
from vaecast.playback_deadlines import Commit, stall_free_start_s

FPS = 16.0
ENCODE_S = 0.03
# 81 frames as a causal VAE makes them: 1, then 4 a chunk.
CHUNKS = [Chunk(0, 1)] + [Chunk(1 + 4 * i, 4) for i in range(20)]
NEVER = math.inf


def ready_at(seconds_per_video_second: float, first_s: float) -> list[float]:
    """Each chunk decoded at this pace (1.0: real time), the first after `first_s`."""
    return [first_s + (c.frame_start + c.frames) / FPS * seconds_per_video_second for c in CHUNKS]


PREVIEW_AT = ready_at(0.5, 0.05)


def stall_free(ready: list[float]) -> float | None:
    """A rendition's stall-free start, as the server measures it from its commits."""
    commits = [
        Commit(at + ENCODE_S, c.frame_start / FPS, c.frames / FPS)
        for c, at in zip(CHUNKS, ready, strict=True)
    ]
    return stall_free_start_s(commits, 81 / FPS)


def delay_for(preview_at: list[float], final_at: list[float]) -> float:
    delay = start_delay_s(stall_free(preview_at), stall_free(final_at), ENCODE_S)
    assert delay is not None
    return delay


def play(final_at: list[float], preview_at: list[float], delay: float) -> tuple[int, float, float]:
    """(stalls, seconds stalled, share of chunks from the final)."""
    played = simulate(CHUNKS, final_at, preview_at, FPS, ENCODE_S, delay)
    stalled = [p.stalled_s for p in played]
    share = sum(p.source == FINAL for p in played) / len(played)
    return sum(s > 1e-9 for s in stalled), sum(stalled), share


def test_the_rule_takes_the_final_when_it_is_there_and_the_preview_at_the_last_moment():
    assert decide(1.0, due=5.0, encode_s=0.1, final_ready=True, preview_ready=True) == FINAL
    assert decide(1.0, due=5.0, encode_s=0.1, final_ready=False, preview_ready=True) is None
    assert decide(4.9, due=5.0, encode_s=0.1, final_ready=False, preview_ready=True) == PREVIEW
    assert decide(6.0, due=5.0, encode_s=0.1, final_ready=False, preview_ready=False) is None
    assert start_delay_s(None, 0.5, 0.1) is None
    assert start_delay_s(0.0, None, 0.1) == 1.0  # a final not measured yet: the tunable's
    assert start_delay_s(0.0, 0.0, 0.1) == 0.1  # a final ahead of real time: no wait
    assert start_delay_s(0.0, 2.5, 0.1) == 1.0  # a slow final: what the tunable allows
    assert start_delay_s(1.5, 2.5, 0.1) == pytest.approx(1.6)  # never less than the preview


def test_a_final_faster_than_real_time_is_all_final_once_it_has_caught_up():
    final_at = ready_at(0.5, 0.2)
    delay = delay_for(PREVIEW_AT, final_at)
    stalls, _, share = play(final_at, PREVIEW_AT, delay)
    sources = [p.source for p in simulate(CHUNKS, final_at, PREVIEW_AT, FPS, ENCODE_S, delay)]
    assert stalls == 0 and sources[0] == PREVIEW  # the first frame: the faster decoder's
    caught_up = sources.index(FINAL)
    assert sources[caught_up:] == [FINAL] * (len(sources) - caught_up) and share > 0.8


@pytest.mark.parametrize("slower", [1.5, 3.0])
def test_a_final_slower_than_real_time_never_stalls_the_live_stream(slower: float):
    final_at = ready_at(slower, 0.2)
    delay = delay_for(PREVIEW_AT, final_at)
    assert delay == 1.0  # the most the tunable allows: the final needs more
    live_stalls, _, live_share = play(final_at, PREVIEW_AT, delay)
    final_stalls, final_stalled_s, _ = play(final_at, [NEVER] * len(CHUNKS), 0.0)
    preview_stalls, _, preview_share = play([NEVER] * len(CHUNKS), PREVIEW_AT, delay)
    assert live_stalls == 0 and final_stalls > 0 and final_stalled_s > 1.0
    assert preview_stalls == 0 and preview_share == 0.0
    if slower == 1.5:  # the final keeps up with the start delay for a while: some of it
        assert 0.0 < live_share < 1.0
    else:
        assert live_share < 0.2


def test_a_preview_that_falls_behind_is_what_the_start_delay_covers():
    slow_preview = ready_at(1.3, 0.05)  # a preview slower than real time
    final_at = ready_at(3.0, 0.2)
    stalls, _, _ = play(final_at, slow_preview, delay_for(slow_preview, final_at))
    assert stalls == 0  # its stall-free start, measured, is in the delay
    too_short = play(final_at, slow_preview, 0.0)
    assert too_short[0] > 0
