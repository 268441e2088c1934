"""Which decoder's frames a live rendition carries, chunk by chunk: the final's when
they are ready in time for that chunk's playout deadline, the preview's otherwise.

This is the rule of the live rendition a job with a preview decoder serves
(`vaecast.server.stream.live_rendition`: one stream that never stalls a viewer who
starts with its first fragment and plays in real time); it is pure, and `simulate`
plays it over decode timelines.

- The live stream's first fragment is committed at `start_at`; a viewer starts it
  `delay_s` later. Chunk i, whose first frame is `frame_start`, plays from
  `frame_start / fps`, so it must be committed by its deadline
  `start_at + delay_s + frame_start / fps`.
- Encoding a chunk takes about `encode_s`, so its choice is made by
  `deadline - encode_s`, from what exists then: the final's frames of that chunk, if
  they are decoded; else the preview's. A chunk whose final frames exist earlier is
  decided then (nothing is won by waiting); one for which neither exists at its
  decision time waits for whichever comes first: that is the stall the start delay is
  chosen to avoid.
- Chunks go out in order: a chunk is decided no earlier than the one before it was
  committed.
- The start delay is chosen from the rates measured (`start_delay_s`): at least the
  preview's own stall-free start (`playback_deadlines`) plus one encode, so that the
  preview alone meets every deadline while its rate holds; and as much of the final's
  stall-free start as the one tunable allows, `max_delay_s` (a live latency, as
  LL-HLS players keep one): the longer the delay, the more chunks the final makes in
  time. A final faster than real time needs none, and the delay is the preview's.
  While the final's rate is not known yet, the stream waits as long as the tunable
  allows, unless the final shows it needs less first.
- The first chunk has no deadline to keep: it goes out as soon as either decoder has
  made it (the time to the first frame is the faster decoder's, the preview's).
- A final always ahead of real time: every chunk after the first is the final's. A
  final always behind: every chunk is the preview's. The final rendition stays whole
  for download either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Source = Literal["final", "preview"]
FINAL: Source = "final"
PREVIEW: Source = "preview"


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk of the video: its first frame and how many frames it holds."""

    frame_start: int
    frames: int


def deadline(start_at: float, delay_s: float, frame_start: int, fps: float) -> float:
    """When a viewer who started `delay_s` after the first fragment needs this chunk."""
    return start_at + delay_s + frame_start / fps


def decide(
    now: float,
    due: float,
    encode_s: float,
    final_ready: bool,
    preview_ready: bool,
    final_coming: bool = True,
) -> Source | None:
    """The source of a chunk due at `due`, at `now`; None: not yet (wait and ask again:
    the final may still come in time, or neither is there). A final that is no longer
    `final_coming` (it ended, or was stopped) brings nothing more: the preview at once."""
    if final_ready:
        return FINAL
    if preview_ready and (now >= due - encode_s or not final_coming):
        return PREVIEW
    return None


@dataclass(frozen=True, slots=True)
class Played:
    """One chunk of the live stream, as `simulate` plays it."""

    source: Source
    committed_at: float
    due_at: float

    @property
    def stalled_s(self) -> float:
        return max(0.0, self.committed_at - self.due_at)


def simulate(
    chunks: Sequence[Chunk],
    final_ready_at: Sequence[float],
    preview_ready_at: Sequence[float],
    fps: float,
    encode_s: float,
    delay_s: float,
) -> list[Played]:
    """The live stream over these timelines: chunk i's final frames exist from
    `final_ready_at[i]`, its preview frames from `preview_ready_at[i]`; each encode
    takes `encode_s`. The viewer starts `delay_s` after the first fragment; a chunk
    committed after its deadline stalls it by as much, and (as a live player does) the
    deadlines after it move on by as much too."""
    played: list[Played] = []
    start_at: float | None = None
    shift = 0.0  # the viewer's stalls so far move every later deadline
    free_at = 0.0  # the encoder's: when it is done with the chunk before
    for chunk, final_at, preview_at in zip(chunks, final_ready_at, preview_ready_at, strict=True):
        if start_at is None:  # the first chunk: whichever exists first, at once
            source = FINAL if final_at <= preview_at else PREVIEW
            decided = min(final_at, preview_at)
            start_at = decided + encode_s
            due = deadline(start_at, delay_s, 0, fps)
        else:
            due = deadline(start_at, delay_s, chunk.frame_start, fps) + shift
            # Asked as each source appears and at the decision time, in that order.
            moments = sorted({max(free_at, final_at), max(free_at, preview_at),
                              max(free_at, due - encode_s)})  # fmt: skip
            for moment in moments:
                choice = decide(moment, due, encode_s, final_at <= moment, preview_at <= moment)
                if choice is not None:
                    source, decided = choice, moment
                    break
            else:  # (cannot happen: the last moment has both)
                raise AssertionError("no source at any moment")
        committed = max(decided, free_at) + encode_s
        free_at = committed
        item = Played(source, committed, due)
        shift += item.stalled_s
        played.append(item)
    return played


# The one tunable: how much start delay the live stream may spend to carry more of the
# final (a live latency of a second, as LL-HLS players keep about one to three).
MAX_DELAY_S = 1.0


def start_delay_s(
    preview_stall_free_s: float | None,
    final_stall_free_s: float | None,
    encode_s: float,
    max_delay_s: float = MAX_DELAY_S,
) -> float | None:
    """The live stream's start delay (None while the preview's rate is not known). A
    final whose rate is not known yet (`final_stall_free_s` None) may need all the
    tunable allows: the stream waits that long for it, unless it shows it needs less."""
    if preview_stall_free_s is None:
        return None
    floor = max(0.0, preview_stall_free_s) + encode_s
    if final_stall_free_s is None:
        return max(floor, max_delay_s)
    wanted = max(0.0, final_stall_free_s) + encode_s
    return max(floor, min(wanted, max_delay_s))
