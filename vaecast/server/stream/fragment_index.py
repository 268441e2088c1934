"""Each fragment's facts, kept beside a rendition's log: the one index the faces read.

The encoder hands over each fragment's facts with its bytes (`codecs.fragment`: how
long it plays, whether it starts on a keyframe, each track's ticks). A rendition keeps
them here, in the order its log takes the bytes. HLS lists its parts from them, the
finished file states the durations they sum to, and the store writes each fragment's
row from them; a restored job's come back from those rows. Nothing here parses a
fragment.
"""

from __future__ import annotations

from vaecast.codecs.fmp4_finish import DurationTally
from vaecast.codecs.fragment import FragmentFacts, facts_of


class FragmentIndex:
    """A rendition's fragments' facts: `facts[i]` is segment i + 1's (segment 0 is the
    init segment, which has none)."""

    def __init__(self) -> None:
        self.facts: list[FragmentFacts] = []
        self._durations = DurationTally()
        self._started = False

    def __len__(self) -> int:
        return len(self.facts)

    def add(self, segment: bytes) -> None:
        """Take the next segment of the log: the init segment first, then fragments,
        each with the facts the encoder handed over (a TypeError otherwise: every
        fragment a rendition takes was written by `codecs.stream`)."""
        self._durations.add(segment)
        if not self._started:
            self._started = True
            return
        facts = facts_of(segment)
        if facts is None:
            raise TypeError("a fragment came without its facts (not from codecs.stream)")
        self.facts.append(facts)

    def restore(self, facts: list[FragmentFacts]) -> None:
        """The facts of a finished rendition, as the store kept them (its init segment
        states its durations already)."""
        self._started = True
        self.facts = facts

    def finished_init(self) -> bytes | None:
        """The init segment stating the fragments' durations; None with the reason in
        `unreadable` (see `fmp4_finish.DurationTally`)."""
        return self._durations.finished_init()

    @property
    def unreadable(self) -> str | None:
        return self._durations.unreadable
