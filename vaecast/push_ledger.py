"""The rules of a push session, pure: which block a push is, whether it is new, and
when a quiet session has timed out. Both keepers of a session's state use them: the
server's `PushSession`, and in Ray mode the job host's `SharedJob`.

A producer on a network that drops connections cannot know whether a block whose
answer it never read was taken. So each block may carry its index (`X-Push-Seq: N`,
counting from 0), and the session answers by the index alone:

- the next index: a new block; once it is taken, its answer is recorded;
- an index already taken: a retry; it is answered again with the recorded answer,
  and adds nothing;
- an index past the next: a gap (a block was lost on the way); 409 with
  `expected_seq`, the index the session waits for;
- no index: taken as the next block in a session that has never seen one (simple
  clients that do not retry); 428 in a session that has, since a block without an
  index cannot be told from a retry.

The ledger keeps every answer it gave (a few numbers each; a session holds at most
as many blocks as the frame limit allows), so a retry of any earlier block is
answered the same.

The idle rule (`idle_left`): a session that has received nothing for its idle
timeout, with no push in flight (a push waiting for room in a full queue is not
idle: its producer is held back), fails with `SessionTimeoutError`. The same rule,
from the session's start, bounds the wait for its first block (its own timeout).

Sans-IO: no asyncio, no HTTP, no torch; the session serializes its pushes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vaecast.errors import (
    InvalidRequestError,
    JobStateError,
    PreconditionRequiredError,
    SessionTimeoutError,
)

SEQ_HEADER = "X-Push-Seq"
# An index is a count of blocks: a few digits. Longer is refused before int() runs.
MAX_SEQ_DIGITS = 12


class PushGapError(JobStateError):
    """A block's index is past the one the session waits for: a block before it is missing."""

    type = "push_sequence_gap"

    def __init__(self, message: str, expected_seq: int) -> None:
        super().__init__(message)
        self.expected_seq = expected_seq

    def fields(self) -> dict[str, Any]:
        return {"expected_seq": self.expected_seq}


@dataclass(slots=True)
class PushLedger:
    """Which indices a session has taken, and what it answered for each."""

    next_seq: int = 0
    sequenced: bool = False  # a block with an index has been seen
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)

    def replay(self, seq: int | None) -> dict[str, Any] | None:
        """The recorded answer if `seq` was taken already; None for the next block.

        Raises `PushGapError` for an index past the next one and
        `PreconditionRequiredError` for a missing index once the session is sequenced.
        """
        if seq is None:
            if self.sequenced:
                raise PreconditionRequiredError(
                    f"this push session numbers its blocks: send {SEQ_HEADER}: "
                    f"{self.next_seq} with the next one"
                )
            return None
        if seq < self.next_seq:
            return self.answers[seq]
        if seq > self.next_seq:
            raise PushGapError(
                f"block {seq} is ahead of this session: it waits for block {self.next_seq}",
                expected_seq=self.next_seq,
            )
        return None

    def taken(self, seq: int | None, answer: dict[str, Any]) -> dict[str, Any]:
        """Block `seq` (the next one) was taken with `answer`; returns the answer."""
        assert seq is None or seq == self.next_seq, (seq, self.next_seq)
        if seq is not None:
            self.sequenced = True
            answer = {**answer, "seq": seq}
        self.answers[self.next_seq] = answer
        self.next_seq += 1
        return answer


def parse_seq(text: str | None) -> int | None:
    """The `X-Push-Seq` header's index, or None without one; 422 for anything else."""
    if text is None:
        return None
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit() or len(stripped) > MAX_SEQ_DIGITS:
        shown = stripped if len(stripped) <= 20 else f"{stripped[:20]}..."
        raise InvalidRequestError(
            f"{SEQ_HEADER} must be a block index, a whole number from 0, got {shown!r}"
        )
    return int(stripped)


def idle_left(now: float, last_push: float, pushing: bool, timeout_s: float) -> float | None:
    """Seconds until a session that last heard from its producer at `last_push` times
    out (a push in flight, `pushing`, keeps it alive: the full wait); None: it has."""
    if pushing:
        return timeout_s
    left = last_push + timeout_s - now
    return None if left <= 0 else left


def idle_error(timeout_s: float) -> SessionTimeoutError:
    return SessionTimeoutError(f"the push session received nothing for {timeout_s:g} s")


def first_block_error(timeout_s: float) -> SessionTimeoutError:
    """A session whose first block did not come in time: it held a pending place
    (vaecast.server.stream.admission), and must free it for others."""
    return SessionTimeoutError(f"the push session received no block within {timeout_s:g} s")


def session_timeout(
    now: float,
    opened: float,
    last_push: float,
    pushing: bool,
    has_block: bool,
    idle_timeout_s: float,
    first_block_timeout_s: float,
) -> tuple[float, SessionTimeoutError | None]:
    """When to look again at a push session opened at `opened`, and its error once it
    has timed out: nothing received for the idle timeout, or no block yet within the
    first-block timeout of its start. The same rule for a local and a cluster job."""
    waits = [(idle_left(now, last_push, pushing, idle_timeout_s), idle_error(idle_timeout_s))]
    if not has_block:
        left = idle_left(now, opened, pushing, first_block_timeout_s)
        waits.append((left, first_block_error(first_block_timeout_s)))
    for left, error in waits:
        if left is None:
            return 0.0, error
    return max(0.01, min(left for left, _ in waits if left is not None)), None
