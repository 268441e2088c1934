"""Each live viewer's playout, as the server pictures it from what it sent and when.

No client code reports anything: the server knows, for each viewer of a running job,
how much media it has sent (the fragments written to that viewer, each with its
duration) and when. From that it pictures the viewer's player (`ViewerPlayout`): it
starts playing as the first media reaches it, plays in real time, stalls whenever
what was sent runs out, and plays on as soon as more comes. Two numbers follow:

- `slack_s`, media time sent minus the media time a player that started with the
  first media and never stalled would have played: negative once that viewer is
  behind real time (the issue's definition, and what `/metrics` shows);
- `stalls` and `stalled_s`: the stalls the pictured player had, and how long in all.

A job keeps its viewers' playouts (`JobViewers`): its job object's `viewers` summary
is made from them, and each face that sends media to a viewer opens one per viewer and
tells it what it sent (`sent`: the progressive MP4), or, where the server paces what
it sends at real time itself (WebRTC), the stalls its sender had (`paced`). The
network between the server and the player is not seen: a viewer's kernel buffers and
the player's own start delay make the real player later, never earlier, than this
one (so a stall predicted is one that happened or worse).
Pure state: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

OBSERVE_EVERY_S = 1.0


@dataclass(eq=False, slots=True)
class ViewerPlayout:
    """One viewer's pictured player (see the module docstring)."""

    kind: str  # the face: "progressive", "webrtc"
    opened_at: float
    started_at: float | None = None  # when its first media was sent
    sent_s: float = 0.0  # media time sent so far
    playhead_s: float = 0.0  # where the pictured player is, as of `clock`
    clock: float = 0.0
    stalls: int = 0
    stalled_s: float = 0.0
    stalled: bool = False
    observed_at: float | None = None  # when its slack last went to `on_sent`
    # Brings it up to date before it is read (a face that tells it in batches sets it).
    sync: Callable[[], None] | None = None
    paced: bool = False  # its sender paces it at real time (WebRTC): see `JobViewers.paced`

    def sent(self, media_end_s: float, at: float) -> bool:
        """Media up to `media_end_s` has been sent by `at`; True if the player had
        stalled since the previous call (a new stall)."""
        new_stall = self._advance(at)
        if media_end_s > self.sent_s:
            if self.started_at is None:
                self.started_at = self.clock = at
            self.sent_s = media_end_s
            self.stalled = False
        return new_stall

    def slack_s(self, now: float) -> float | None:
        """Media sent minus real time since its first media (None before any)."""
        if self.started_at is None:
            return None
        if self.paced:  # sent as it plays: behind by what it stalled, no more
            return -self.stalled_s
        return self.sent_s - (now - self.started_at)

    def _advance(self, now: float) -> bool:
        if self.started_at is None or self.stalled:
            if self.stalled:
                self.stalled_s += max(0.0, now - self.clock)
                self.clock = max(self.clock, now)
            return False
        elapsed = max(0.0, now - self.clock)
        left = self.sent_s - self.playhead_s
        self.clock = max(self.clock, now)
        if elapsed <= left:
            self.playhead_s += elapsed
            return False
        self.playhead_s = self.sent_s  # it ran out `left` seconds in, and waits since
        self.stalls += 1
        self.stalled = True
        self.stalled_s += elapsed - left
        return True


@dataclass
class JobViewers:
    """A job's viewers' playouts: those watching now, and a tally of those who left.

    `on_sent(kind, slack_s, new_stall)` (a job's metrics) is told of a viewer's `sent`
    at most once every `OBSERVE_EVERY_S` for each viewer, and at each new stall: with a
    thousand viewers of one job, an observation each per fragment would cost the loop
    more than their sends."""

    on_sent: Callable[[str, float, bool], None] = lambda kind, slack, stall: None
    watching: set[ViewerPlayout] = field(default_factory=set)
    seen: int = 0
    stalls_of_those_gone: int = 0
    stalled_s_of_those_gone: float = 0.0

    def open(self, kind: str, now: float) -> ViewerPlayout:
        playout = ViewerPlayout(kind, now, clock=now)
        self.watching.add(playout)
        self.seen += 1
        return playout

    def sent(self, playout: ViewerPlayout, media_end_s: float, now: float) -> None:
        new_stall = playout.sent(media_end_s, now)
        observed_at = playout.observed_at
        if not new_stall and observed_at is not None and now - observed_at < OBSERVE_EVERY_S:
            return
        slack = playout.slack_s(now)
        if slack is not None:
            playout.observed_at = now
            self.on_sent(playout.kind, slack, new_stall)

    def paced(self, playout: ViewerPlayout, stalls: int, stalled_s: float, now: float) -> None:
        """A viewer whose media the server sends paced at real time (WebRTC), as its
        sender reports it: its stalls so far and how long they lasted. Its slack is then
        minus that time: behind real time by as much as it stalled."""
        if playout.started_at is None:
            playout.started_at = now
        new_stall = stalls > playout.stalls
        playout.paced = True
        playout.stalls, playout.stalled_s = stalls, stalled_s
        playout.observed_at = now
        self.on_sent(playout.kind, -stalled_s, new_stall)

    def close(self, playout: ViewerPlayout) -> None:
        if playout in self.watching:
            self.watching.discard(playout)
            self.stalls_of_those_gone += playout.stalls
            self.stalled_s_of_those_gone += playout.stalled_s

    def summary(self, now: float) -> dict[str, Any]:
        """The job object's `viewers`: how many watch now and have watched, the least
        slack among those watching, and the stalls pictured for all of them."""
        for playout in self.watching:
            if playout.sync is not None:
                playout.sync()
        slacks = [s for p in self.watching if (s := p.slack_s(now)) is not None]
        return {
            "watching": len(self.watching),
            "seen": self.seen,
            "min_slack_s": None if not slacks else round(min(slacks), 3),
            "stalls": self.stalls_of_those_gone + sum(p.stalls for p in self.watching),
            "stalled_s": round(
                self.stalled_s_of_those_gone + sum(p.stalled_s for p in self.watching), 3
            ),
        }
