"""How long a request body may take to arrive: a pause limit and a minimum rate. Pure.

Two rules, as nginx's `client_body_timeout` and Apache mod_reqtimeout's `MinRate`:
- a pause: no read may wait longer than `pause_s` for the next bytes;
- a rate: once `grace_s` has passed since the body began, it must have averaged at
  least `min_rate` bytes/s. As in mod_reqtimeout, each byte received buys 1/min_rate s
  more, so the deadline is `started + max(grace_s, received / min_rate)`; a body at 1
  byte/s is refused after its grace, one at the rate or faster never.

The reader waits for its next bytes until `next_deadline` and, when that passes,
asks `BodyPace.refusal` for the error to answer with (408).
"""

from __future__ import annotations

from dataclasses import dataclass

from vaecast.errors import RequestTimeoutError


@dataclass(frozen=True, slots=True)
class BodyPace:
    """The rules for one body (`min_rate` 0: no minimum rate)."""

    pause_s: float
    min_rate: int
    grace_s: float

    def rate_deadline(self, started: float, received: int) -> float | None:
        """When a body begun at `started`, `received` bytes in, falls under the rate."""
        if self.min_rate <= 0:
            return None
        return started + max(self.grace_s, received / self.min_rate)

    def next_deadline(self, now: float, started: float, received: int) -> float:
        """Until when the reader may wait, at `now`, for the body's next bytes."""
        paused = now + self.pause_s
        slow = self.rate_deadline(started, received)
        return paused if slow is None else min(paused, slow)

    def refusal(self, now: float, started: float, received: int) -> RequestTimeoutError:
        """The error for a body whose `next_deadline` passed at `now`."""
        slow = self.rate_deadline(started, received)
        if slow is not None and now >= slow:
            elapsed = max(now - started, 1e-9)
            return RequestTimeoutError(
                f"the request body arrived at {received / elapsed:.0f} bytes/s "
                f"({received} bytes in {elapsed:.1f} s); this server needs at least "
                f"{self.min_rate} bytes/s after the first {self.grace_s:g} s"
            )
        return RequestTimeoutError(f"no part of the request body arrived for {self.pause_s:g} s")
