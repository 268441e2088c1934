"""A fragment as the encoder wrote it: its bytes, and what the encoder knew of them.

What follows a fragment wants its facts, not its boxes: how long it plays and whether
it starts on a keyframe (HLS parts, the store's rows), how long each of its tracks
runs (the durations a finished file states). The encoder knows them as it writes the
boxes, so it hands them over with the bytes (`codecs.stream`), and nothing parses a
fragment vaecast wrote. A `Fragment` is `bytes` with `facts`: every log, file and
socket takes it as the bytes it is, and whatever needs the facts reads them. It
pickles with its facts (a Ray replica's fragments cross to the front end so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FragmentFacts:
    """One fragment: `duration_s`, its video's (its audio's when it has no video, as
    the sound after a push session's last frame); `keyframe`, whether its video starts
    on one (never for an audio-only fragment); `track_ticks`, each track's samples'
    duration in that track's timescale, as (track id, ticks) pairs."""

    duration_s: float
    keyframe: bool
    track_ticks: tuple[tuple[int, int], ...] = ()


class Fragment(bytes):
    """A fragment's bytes, with its `facts`."""

    facts: FragmentFacts

    def __new__(cls, data: bytes, facts: FragmentFacts) -> Fragment:
        fragment = super().__new__(cls, data)
        fragment.facts = facts
        return fragment

    def __reduce__(self) -> tuple[Any, ...]:
        return (Fragment, (bytes(self), self.facts))


def facts_of(segment: bytes) -> FragmentFacts | None:
    """The facts a fragment came with; None for bytes that are not a `Fragment` (an
    init segment, or a fragment read back from a file)."""
    return segment.facts if isinstance(segment, Fragment) else None
