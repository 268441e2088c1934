"""Fair admission: the places a server's requests and jobs hold, counted by kind and
by client.

A place is one of four kinds:
- `receiving`: a request taken in whose body is still arriving (or being parsed, or a
  demo being rendered): an `Admission` not yet submitted;
- `push_waiting`: a push session that has had no block yet;
- `queued`: a job waiting for a decode slot;
- `decoding`: a job in a slot (Ray mode: a job running in the cluster).

Two pools bound them:
- the decode pool, `decode_slots + max_queued_jobs` places: `push_waiting`, `queued`
  and `decoding` ones. A push session takes its place in the queue when it is made,
  so its first block never pushes the queue past `max_queued_jobs`;
- the pending pool, `max_pending` places: `receiving` and `push_waiting` ones, the
  places of clients that are still sending. Of them one client holds at most
  `max_pending_per_client`, so no client can keep the others out.

A client is the peer's address. It is not the API key: a server has one key, which
every client of it shares. Behind a proxy every client has the proxy's address, so set
`max_pending_per_client` to `max_pending` there.

A pending place is held for a bounded time: a body slower than `min_body_rate` is
refused after its grace (`vaecast.server.edge.body_rate`), a push session with no
block fails after `push_first_block_timeout_s`.

A request is refused (429 with Retry-After) before its body is read when a pool or the
client's share is full, and again, once read, when what it asks for no longer fits.
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Callable, Sequence

from vaecast.errors import ServerBusyError
from vaecast.job.record import JobStatus
from vaecast.server.config import ServerConfig
from vaecast.server.stream.job import Job
from vaecast.server.stream.job_requests import DecodeRequest, PushRequest

JobRequest = DecodeRequest | PushRequest


class PlaceKind(enum.StrEnum):
    RECEIVING = "receiving"
    PUSH_WAITING = "push_waiting"
    QUEUED = "queued"
    DECODING = "decoding"


# The client of a job started in-process (tools, tests), not by a request.
LOCAL_CLIENT = "local"

PENDING_KINDS = frozenset({PlaceKind.RECEIVING, PlaceKind.PUSH_WAITING})


def kind_of(job: Job) -> PlaceKind:
    """The place an unfinished job holds, from its own state."""
    if job.record.status is not JobStatus.QUEUED:
        return PlaceKind.DECODING  # or just ended: its slot is freed when its task ends
    if job.feed is not None and job.plan is None and job.stream_plan is None:
        return PlaceKind.PUSH_WAITING
    return PlaceKind.QUEUED


class Places:
    """The places held on one server, and the rules that refuse a request (429).

    The manager tells it of each job it starts and that ends (`hold`, `release`);
    requests take their place through `admit`, which names their client.
    """

    def __init__(
        self,
        config: ServerConfig,
        retry_after_s: Callable[[], int],
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`retry_after_s`: a guess at when a decode place frees up; `refused(reason)`
        is told of each refusal ("busy": the decode pool, "pending": the pending pool,
        "client": a client's share of it)."""
        self._config = config
        self._refused = refused
        self._decode_retry_after_s = retry_after_s
        self._receiving: collections.Counter[str] = collections.Counter()
        self._jobs: dict[Job, str | None] = {}  # started, not ended, in order: their client

    @property
    def decode_capacity(self) -> int:
        return self._config.decode_slots + self._config.max_queued_jobs

    def counts(self) -> dict[PlaceKind, int]:
        """Places held now, by kind (every kind, zeros included)."""
        counts = dict.fromkeys(PlaceKind, 0)
        counts[PlaceKind.RECEIVING] = self._receiving.total()
        for job in self._jobs:
            counts[kind_of(job)] += 1
        return counts

    @property
    def busy(self) -> bool:
        """Whether any place is held (a job, or a request being read)."""
        return self._receiving.total() > 0 or bool(self._jobs)

    @property
    def decode_left(self) -> int:
        # Every unfinished job's place is in it: push_waiting, queued or decoding.
        return max(0, self.decode_capacity - len(self._jobs))

    @property
    def pending_left(self) -> int:
        counts = self.counts()
        held = sum(counts[kind] for kind in PENDING_KINDS)
        return max(0, self._config.max_pending - held)

    def client_pending_left(self, client: str) -> int:
        """Pending places `client` may still take (at most the pool's own room)."""
        waiting = sum(
            1
            for job, owner in self._jobs.items()
            if owner == client and kind_of(job) is PlaceKind.PUSH_WAITING
        )
        held = self._receiving[client] + waiting
        return max(0, self._config.max_pending_per_client - held)

    def hold(self, job: Job, client: str | None = None) -> None:
        self._jobs[job] = client

    def release(self, job: Job) -> None:
        self._jobs.pop(job, None)

    def admit(
        self,
        start: Callable[[JobRequest], Job],
        check: Callable[[JobRequest], object],
        client: str,
    ) -> Admission:
        """A receiving place for `client`'s request about to be read, or
        ServerBusyError (429) when either pool, or the client's share, is full. `start`
        makes a job of a request (the manager's), `check` refuses one before any job
        of a batch starts."""
        if self.decode_left == 0:
            raise self._decode_full()
        if self.pending_left == 0:
            raise self._pending_full()
        if self.client_pending_left(client) == 0:
            raise self._client_full(client)
        self._receiving[client] += 1
        return Admission(self, start, check, client)

    def make_room(self, requests: Sequence[JobRequest], client: str) -> None:
        """Raise ServerBusyError unless `requests`, read under one admission of
        `client`, fit now: a decode place for each, and a pending place of the pool and
        of the client's share for each push session (the admission's own receiving
        place becomes one of them)."""
        pushes = sum(isinstance(request, PushRequest) for request in requests)
        if len(requests) == 1 and self.decode_left == 0:
            raise self._decode_full()
        if len(requests) > self.decode_left:
            self._refused("busy")
            raise ServerBusyError(
                f"a batch of {len(requests)} videos needs {len(requests)} job places; "
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
        if pushes > self.client_pending_left(client) + 1:
            self._refused("client")
            raise ServerBusyError(
                f"a batch of {pushes} push sessions needs {pushes} pending places; one "
                f"client may hold {self._config.max_pending_per_client} "
                "(--max-pending-per-client); try again later",
                retry_after_s=self._pending_retry_after_s(),
            )

    def started(self, job: Job, client: str) -> None:
        """`job`, just started by `client`'s admission, is that client's."""
        if job in self._jobs:
            self._jobs[job] = client

    def end_receiving(self, client: str) -> None:
        """A request's receiving place is given back (its job, if any, holds its own)."""
        self._receiving[client] -= 1
        if self._receiving[client] <= 0:
            del self._receiving[client]

    def _decode_full(self) -> ServerBusyError:
        self._refused("busy")
        counts = self.counts()
        return ServerBusyError(
            f"all {self._config.decode_slots} decode slot(s) are busy and "
            f"{counts[PlaceKind.QUEUED] + counts[PlaceKind.PUSH_WAITING]} job(s) are "
            "queued; try again later",
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

    def _client_full(self, client: str) -> ServerBusyError:
        self._refused("client")
        return ServerBusyError(
            f"one client may hold {self._config.max_pending_per_client} pending requests "
            "(bodies still arriving, push sessions with no block yet) "
            f"(--max-pending-per-client), and {client} holds them all; try again later",
            retry_after_s=self._pending_retry_after_s(),
        )

    def _pending_retry_after_s(self) -> int:
        """By then a slow body has been refused, or an empty push session has failed."""
        config = self._config
        return max(1, math.ceil(min(config.body_rate_grace_s, config.push_first_block_timeout_s)))


class Admission:
    """A receiving place, held for one client's request while it is being read.

    `submit` turns it into a job; leaving the `with` block without submitting gives
    the place back.
    """

    def __init__(
        self,
        places: Places,
        start: Callable[[JobRequest], Job],
        check: Callable[[JobRequest], object],
        client: str,
    ) -> None:
        self._places: Places | None = places
        self._start = start
        self._check = check
        self._client = client

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
            places.make_room(requests, self._client)
            if len(requests) > 1:
                for request in requests:  # refused here, before any of them runs
                    self._check(request)
            jobs = []
            for request in requests:
                jobs.append(self._start(request))
                places.started(jobs[-1], self._client)
            return jobs
        finally:
            self._give_back()

    def _give_back(self) -> None:
        if self._places is not None:
            self._places.end_receiving(self._client)
            self._places = None
