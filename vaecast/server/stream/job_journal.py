"""A job's journal: what happens to it, told to the durable store as it happens.

Observes the job's transitions (`Job.observe`): its creation, each event with the
record as it is then (`vaecast.job.snapshot`), each segment's place in the video
file with its HLS part, and its end. A completed job's `done` goes with the order
to fsync its file first (`Store.completed`), as does the end of a failed or cancelled
one that keeps its video so far (`partial`); any other's video is dropped, as in
memory. Only jobs whose log writes the store's file are journalled, and
only until their video outgrows the store's budget (`NotStored`): the store then keeps
why, for a 410 after a restart, and nothing more of it.
A job's preview rendition is not: only its record's counters are, so after a
restart only its final video is served.
"""

from __future__ import annotations

import time
from typing import Any

from vaecast.job.record import FINAL, Completed, Ended, NotStored, SegmentAdded, Transition
from vaecast.job.snapshot import snapshot
from vaecast.server.stream.job import Job
from vaecast.store import Store, StoredSegment

# Why a video the store could not keep is gone after a restart (its 410).
NOT_STORED = "not stored: the store's budget (--store-max-gb) had no room for it"


class JobJournal:
    def __init__(self, store: Store, job: Job, retention_s: float) -> None:
        self._store = store
        self._job = job
        self._retention_s = retention_s
        self._size = 0
        self._kept = True
        store.created(job.id, snapshot(job.record))
        job.observe(self.applied)

    def applied(self, transition: Transition, event: dict[str, Any] | None) -> None:
        job, store = self._job, self._store
        if not self._kept:
            return
        if isinstance(transition, NotStored):
            self._kept = False
            store.not_stored(job.id, NOT_STORED)
            return
        if isinstance(transition, SegmentAdded) and transition.variant == FINAL:
            # (A preview's bytes are kept in memory only: the store keeps the video.)
            index = len(job.log) - 1
            facts = job.fragments.facts[index - 1] if index > 0 else None
            self._size += transition.size
            store.segment(
                job.id,
                index,
                StoredSegment(
                    job.log.size - transition.size,
                    transition.size,
                    None if facts is None else facts.duration_s,
                    True if facts is None else facts.keyframe,
                ),
            )
        if event is None:
            return
        numbered = (len(job.events) - 1, event)
        if isinstance(transition, Completed) or (
            isinstance(transition, Ended) and transition.partial
        ):
            # A kept partial is a finished video, as a completed one is.
            expires_at = time.time() + self._retention_s
            store.completed(job.id, numbered, snapshot(job.record), self._size, expires_at)
        elif isinstance(transition, Ended):
            store.ended(job.id, numbered, snapshot(job.record))
        else:
            store.event(job.id, *numbered, snapshot(job.record), self._size)
