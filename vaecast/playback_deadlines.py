"""When a viewer may start playing a job that is still decoding, and never stall.

Each fragment is committed at a moment c_i and plays from its presentation time p_i
(its first frame's, in seconds of video). A viewer who starts playing d seconds after
the first fragment was committed (at c_0) needs fragment i by c_0 + d + p_i, so it
plays stall-free if d >= c_i - c_0 - p_i for every fragment. For the fragments
committed so far that bound is known; for those still to come it is predicted from
the decode rate r of the last fragments (seconds of video made per second): the next
fragment of duration u comes u / r after the last one, and, if r is below 1, every
later one falls further behind, the last (ending at the video's length T, where
known) most of all. The earliest stall-free start is the largest of these bounds,
and 0 for a decode faster than real time that has nothing to catch up.

`slack` is the other view, of one fragment: how long before a viewer who started at
the first fragment needs it, it arrived (negative: that viewer stalled).

Pure: plain numbers in, numbers out; the job record keeps the commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The decode rate is read over this many of the last fragments: recent enough to
# follow a decode that speeds up or slows down, long enough to smooth one chunk.
RATE_WINDOW = 4


@dataclass(frozen=True, slots=True)
class Commit:
    """One fragment: when it was committed (seconds, any clock), and the span of
    video it plays (seconds from the video's start)."""

    at: float
    pts_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.pts_s + self.duration_s


def slack(first: Commit, commit: Commit) -> float:
    """Seconds fragment `commit` arrived before a viewer who started at `first`
    needed it (negative: that viewer stalled there)."""
    return first.at + commit.pts_s - commit.at


def stall_free_start_s(commits: Sequence[Commit], total_s: float | None) -> float | None:
    """The earliest start delay after the first fragment that plays the whole video
    without a stall, as far as the commits so far tell; None until they tell (before
    the second fragment of a video still decoding: no rate yet). `total_s`: the
    video's length, where known."""
    if not commits:
        return None
    first, last = commits[0], commits[-1]
    needed = max(-slack(first, commit) for commit in commits)
    if total_s is None or last.end_s < total_s - 1e-9:
        window = commits[-(RATE_WINDOW + 1) :]
        elapsed = window[-1].at - window[0].at
        made = window[-1].end_s - window[0].end_s
        if elapsed <= 0 or made <= 0:
            return None  # no rate yet to predict the rest by (0 would read "at once")
        rate = made / elapsed
        step = last.duration_s
        # The next fragment, and (known length, slower than real time) the last one.
        starts = [last.end_s]
        if total_s is not None and rate < 1:
            starts.append(max(last.end_s, total_s - step))
        for start in starts:
            arrives = last.at + (start + step - last.end_s) / rate
            needed = max(needed, arrives - first.at - start)
    return round(max(0.0, needed), 4)
