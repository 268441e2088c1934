"""What making and running a job needs of the server, handed down instead of the manager.

The runners (`job_runners`, Ray mode's `vaecast.cluster.runners`), the durable store's
side (`durable_jobs`, `restored_job`) and retention each need a few of the server's
parts. They get `JobServices`, a frozen set of them, and, where they find or evict
jobs, a `JobTable`; neither is the manager, which they therefore never import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from vaecast.models.base import ChunkedDecoder
from vaecast.pipeline.run import Stages, Workers
from vaecast.server.config import ServerConfig
from vaecast.server.metrics import Metrics
from vaecast.server.stream.job import Job
from vaecast.server.stream.previews import Previews
from vaecast.server.stream.rendition import RenditionHooks
from vaecast.server.stream.retention import Retention
from vaecast.server.stream.segment_log import SegmentLog


@dataclass(frozen=True)
class JobServices:
    config: ServerConfig
    metrics: Metrics
    workers: Workers  # the threads jobs decode and encode on
    stages: Stages  # the host conversion and the encoder factory every job uses
    attach: RenditionHooks  # what each new rendition is shown to (the faces' hooks)
    decoders: Mapping[str, ChunkedDecoder]
    previews: Previews
    # A new job's log: in the store's file for it, or None (its own, in memory).
    new_log: Callable[[str], SegmentLog | None]


class JobTable(Protocol):
    """The server's jobs, as what finds or evicts them sees them."""

    services: JobServices
    jobs: dict[str, Job]
    draining: bool
    retention: Retention

    def adopt(self, job: Job) -> None:
        """Serve `job`, which runs elsewhere, from here."""
