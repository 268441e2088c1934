"""Fair admission: the places a server's requests and jobs hold, counted by kind.

A place is one of four kinds:
- `receiving`: a request taken in whose body is still arriving (or being parsed, or a
  demo being rendered): an `Admission` not yet submitted;
- `push_waiting`: a push session that has had no block yet;
- `queued`: a job waiting for a decode slot;
- `decoding`: a job in a slot (Ray mode: a job running in the cluster).

They fill two pools apart. `queued` and `decoding` places are the decode pool,
`decode_slots + max_queued_jobs` of them; `receiving` and `push_waiting` places are the
pending pool, `max_pending` of them. A client that is slow (a body trickling in, a push
session that never pushes) holds a pending place only, so slow clients can never fill
the decode pool and lock out a request whose body has arrived; and each holds it for a
bounded time: a body slower than `min_body_rate` is refused after its grace
(`vaecast.server.edge.body_rate`), a push session with no block fails after
`push_first_block_timeout_s`.

A request is refused (429 with Retry-After) before its body is read when either pool is
full, and again, once read, when the decode pool filled meanwhile. A push session moves
from the pending pool into the decode queue with its first block, unrefused (its
producer is mid-stream): the queue then holds more than `max_queued_jobs` jobs, by at
most `max_pending`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence

from vaecast.errors import ServerBusyError
from vaecast.job_record import JobStatus
from vaecast.server.config import ServerConfig
from vaecast.server.stream.job import Job
from vaecast.server.stream.job_requests import DecodeRequest, PushRequest

JobRequest = DecodeRequest | PushRequest


class PlaceKind(enum.StrEnum):
    RECEIVING = "receiving"
    PUSH_WAITING = "push_waiting"
    QUEUED = "queued"
    DECODING = "decoding"


PENDING_KINDS = frozenset({PlaceKind.RECEIVING, PlaceKind.PUSH_WAITING})


def kind_of(job: Job) -> PlaceKind:
    """The place an unfinished job holds, from its own state."""
    if job.status is not JobStatus.QUEUED:
        return PlaceKind.DECODING  # or just ended: its slot is freed when its task ends
    if job.feed is not None and job.plan is None and job.stream_plan is None:
        return PlaceKind.PUSH_WAITING
    return PlaceKind.QUEUED


class Places:
    """The places held on one server, and the rules that refuse a request (429).

    The manager tells it of each job it starts and that ends (`hold`, `release`);
    requests take their place through `admit`.
    """

    def __init__(
        self,
        config: ServerConfig,
        retry_after_s: Callable[[], int],
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`retry_after_s`: a guess at when a decode place frees up; `refused(reason)`
        is told of each refusal ("busy": the decode pool, "pending": the other)."""
        self._config = config
        self._refused = refused
        self._decode_retry_after_s = retry_after_s
        self._receiving = 0
        self._jobs: dict[Job, None] = {}  # started, not ended, in order

    @property
    def decode_capacity(self) -> int:
        return self._config.decode_slots + self._config.max_queued_jobs

    def counts(self) -> dict[PlaceKind, int]:
        """Places held now, by kind (every kind, zeros included)."""
        counts = dict.fromkeys(PlaceKind, 0)
        counts[PlaceKind.RECEIVING] = self._receiving
        for job in self._jobs:
            counts[kind_of(job)] += 1
        return counts

    @property
    def busy(self) -> bool:
        """Whether any place is held (a job, or a request being read)."""
        return self._receiving > 0 or bool(self._jobs)

    @property
    def decode_left(self) -> int:
        counts = self.counts()
        return max(0, self.decode_capacity - counts[PlaceKind.QUEUED] - counts[PlaceKind.DECODING])

    @property
    def pending_left(self) -> int:
        counts = self.counts()
        held = sum(counts[kind] for kind in PENDING_KINDS)
        return max(0, self._config.max_pending - held)

    def hold(self, job: Job) -> None:
        self._jobs[job] = None

    def release(self, job: Job) -> None:
        self._jobs.pop(job, None)

    def admit(
        self, start: Callable[[JobRequest], Job], check: Callable[[JobRequest], object]
    ) -> Admission:
        """A receiving place for a request about to be read, or ServerBusyError (429)
        when either pool is full. `start` makes a job of a request (the manager's),
        `check` refuses one before any job of a batch starts."""
        if self.decode_left == 0:
            raise self._decode_full()
        if self.pending_left == 0:
            raise self._pending_full()
        self._receiving += 1
        return Admission(self, start, check)

    def make_room(self, requests: Sequence[JobRequest]) -> None:
        """Raise ServerBusyError unless `requests`, read under one admission, fit now: a
        decode place for each upload, a pending place for each push session (the
        admission's own receiving place becomes one of them)."""
        uploads = sum(isinstance(request, DecodeRequest) for request in requests)
        pushes = len(requests) - uploads
        if uploads == 1 and pushes == 0 and self.decode_left == 0:
            raise self._decode_full()
        if uploads > self.decode_left:
            self._refused("busy")
            raise ServerBusyError(
                f"a batch of {uploads} videos needs {uploads} job places; "
                f"this server has {self.decode_left} free now; try again later",
                retry_after_s=self._decode_retry_after_s(),
            )
        if pushes > self.pending_left + 1:
            self._refused("pending")
            raise ServerBusyError(
                f"a batch of {pushes} push sessions needs {pushes} pending places; "
                f"this server has {self.pending_left + 1} free now; try again later",
                retry_after_s=self._pending_retry_after_s(),
            )

    def end_receiving(self) -> None:
        """A request's receiving place is given back (its job, if any, holds its own)."""
        self._receiving -= 1

    def _decode_full(self) -> ServerBusyError:
        self._refused("busy")
        queued = self.counts()[PlaceKind.QUEUED]
        return ServerBusyError(
            f"all {self._config.decode_slots} decode slot(s) are busy and "
            f"{queued} job(s) are queued; try again later",
            retry_after_s=self._decode_retry_after_s(),
        )

    def _pending_full(self) -> ServerBusyError:
        self._refused("pending")
        counts = self.counts()
        return ServerBusyError(
            f"this server holds at most {self._config.max_pending} pending requests and "
            f"has {counts[PlaceKind.RECEIVING]} whose body is arriving and "
            f"{counts[PlaceKind.PUSH_WAITING]} push session(s) with no block yet; "
            "try again later",
            retry_after_s=self._pending_retry_after_s(),
        )

    def _pending_retry_after_s(self) -> int:
        """By then a slow body has been refused, or an empty push session has failed."""
        config = self._config
        return max(1, math.ceil(min(config.body_rate_grace_s, config.push_first_block_timeout_s)))


class Admission:
    """A receiving place, held for one request while it is being read.

    `submit` turns it into a job; leaving the `with` block without submitting gives
    the place back.
    """

    def __init__(
        self,
        places: Places,
        start: Callable[[JobRequest], Job],
        check: Callable[[JobRequest], object],
    ) -> None:
        self._places: Places | None = places
        self._start = start
        self._check = check

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._give_back()

    def submit(self, request: JobRequest) -> Job:
        """The request's job; ServerBusyError (429) when its place filled meanwhile."""
        return self.submit_batch([request])[0]

    def submit_batch(self, requests: Sequence[JobRequest]) -> list[Job]:
        """One job per request, all or none: the places for all are checked first (429
        when the server has fewer left), and each request checked before any job starts."""
        places = self._places
        if places is None:
            raise RuntimeError("an admission is used once")
        try:
            places.make_room(requests)
            if len(requests) > 1:
                for request in requests:  # refused here, before any of them runs
                    self._check(request)
            return [self._start(request) for request in requests]
        finally:
            self._give_back()

    def _give_back(self) -> None:
        if self._places is not None:
            self._places.end_receiving()
            self._places = None
