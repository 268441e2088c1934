"""Prometheus metrics of one server (prometheus-client), in a registry of its own.

A registry per app, not the process-global one, so tests and several apps in one
process never share counters. Job and queue gauges are read from the JobManager at
scrape time rather than kept in step by hand.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Latency buckets from a 10 ms chunk to a minute-long decode.
SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A fragment's slack: late (negative) to well ahead of its viewer.
SLACK_BUCKETS = (-5, -1, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Event-loop lag: a healthy loop is late by a millisecond or two; 100 ms is felt.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


@dataclass(frozen=True, slots=True)
class ServerState:
    """What the server's gauges show, read from the job manager at scrape time."""

    statuses: Iterable[str]  # of every job held
    queue_depth: int
    readers: int
    places: Mapping[str, int]  # held, by kind (vaecast.server.stream.admission)


class _StateCollector(Collector):
    def __init__(self, read_state: Callable[[], ServerState]) -> None:
        self._read_state = read_state

    def collect(self) -> Iterator[Metric]:
        state = self._read_state()
        statuses, queue_depth, readers = state.statuses, state.queue_depth, state.readers
        jobs = GaugeMetricFamily(
            "vaecast_jobs", "Jobs held by the server, by status", labels=["status"]
        )
        for status, count in sorted(Tally(statuses).items()):
            jobs.add_metric([status], count)
        yield jobs
        yield GaugeMetricFamily(
            "vaecast_queue_depth", "Jobs waiting for a decode slot", value=queue_depth
        )
        yield GaugeMetricFamily(
            "vaecast_active_readers", "Viewers being streamed to", value=readers
        )
        places = GaugeMetricFamily(
            "vaecast_places",
            "Places held by requests being read and by unfinished jobs, by kind",
            labels=["kind"],
        )
        for kind, count in state.places.items():
            places.add_metric([kind], count)
        yield places


class _ReplicaCollector(Collector):
    """Ray mode: the decoder replicas, as the front end last heard from Serve."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        read = self._metrics.read_replicas
        health = None if read is None else read()
        if health is None:
            return
        replicas = GaugeMetricFamily(
            "vaecast_replicas", "Decoder replicas, by state (Ray Serve)", labels=["state"]
        )
        for state, count in sorted(health["states"].items()):
            replicas.add_metric([state], count)
        yield replicas
        yield GaugeMetricFamily(
            "vaecast_replicas_healthy",
            "Decoder replicas running (Ray Serve)",
            value=health["healthy"],
        )


class Metrics:
    def __init__(self, read_state: Callable[[], ServerState]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_StateCollector(read_state))
        # Ray mode: the replicas' health (vaecast.cluster.runners sets it).
        self.read_replicas: Callable[[], dict[str, Any] | None] | None = None
        self.registry.register(_ReplicaCollector(self))
        r = self.registry
        self._count_jobs(r)
        self._time_jobs(r)
        self._watch_the_loop(r)
        self._count_webrtc(r)

    def _count_jobs(self, r: CollectorRegistry) -> None:
        """Jobs that ended, were refused or evicted; bytes and viewers."""
        self.jobs_finished = Counter(
            "vaecast_jobs_finished", "Jobs that ended, by final status", ["status"], registry=r
        )
        self.jobs_rejected = Counter(
            "vaecast_jobs_rejected",
            "Job requests refused for capacity (429) or shutdown (503)",
            ["reason"],
            registry=r,
        )
        self.bytes_sent = Counter("vaecast_bytes_sent", "MP4 bytes written to viewers", registry=r)
        self.readers_dropped = Counter(
            "vaecast_readers_dropped",
            "Viewers dropped for not reading within the write timeout",
            registry=r,
        )
        self.jobs_evicted = Counter(
            "vaecast_jobs_evicted", "Finished jobs evicted, by reason", ["reason"], registry=r
        )

    def _time_jobs(self, r: CollectorRegistry) -> None:
        """How long a job's steps take: first fragment, decode, encode, slack."""
        self.time_to_first_fragment = Histogram(
            "vaecast_time_to_first_fragment_seconds",
            "From job creation to its first fragment in the log",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.variant_time_to_first_fragment = Histogram(
            "vaecast_variant_time_to_first_fragment_seconds",
            "Jobs with a preview: from creation to each rendition's first fragment",
            ["variant"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.final_ready_seconds = Histogram(
            "vaecast_preview_to_final_ready_seconds",
            "Jobs with a preview: from the preview's first fragment to final_ready",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.fragment_slack = Histogram(
            "vaecast_fragment_slack_seconds",
            "How long before a viewer who started at a job's first fragment needed each "
            "fragment it was committed (negative: that viewer stalled)",
            buckets=SLACK_BUCKETS,
            registry=r,
        )
        self.predicted_stalls = Counter(
            "vaecast_predicted_stalls",
            "Fragments committed after a viewer who started at the first fragment needed them",
            registry=r,
        )
        self.viewer_slack = Histogram(
            "vaecast_viewer_slack_seconds",
            "Each live viewer's slack as fragments are sent to it (at most once a second "
            "each): media time sent minus real time since its first media (negative: "
            "behind real time)",
            ["face"],
            buckets=SLACK_BUCKETS,
            registry=r,
        )
        self.viewer_stalls = Counter(
            "vaecast_viewer_stalls",
            "Stalls of live viewers' players as the server pictures them from what it "
            "sent each and when (a player starting with the first media, in real time)",
            ["face"],
            registry=r,
        )
        self.live_chunks = Counter(
            "vaecast_live_chunks",
            "Chunks of live renditions, by the rendition each came from (the final's in "
            "time for its playout deadline, else the preview's)",
            ["source"],
            registry=r,
        )
        self.decode_seconds = Histogram(
            "vaecast_decode_seconds",
            "From a job's start to its last chunk",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.chunk_encode_seconds = Histogram(
            "vaecast_chunk_encode_seconds",
            "H.264 + fMP4 time of one chunk",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )

        self.block_to_fragment_seconds = Histogram(
            "vaecast_push_block_to_fragment_seconds",
            "Push sessions: from a latent block's arrival to the fragment of a chunk it "
            "completed, in the log",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )

    def _watch_the_loop(self, r: CollectorRegistry) -> None:
        """How late the event loop runs."""
        self.loop_lag = Histogram(
            "vaecast_event_loop_lag_seconds",
            "How late a periodic event-loop tick fired (anything that blocks the loop shows here)",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.loop_lag_max = Gauge(
            "vaecast_event_loop_lag_max_seconds",
            "The worst event-loop lag seen since the server started",
            registry=r,
        )
        self._worst_lag_s = 0.0

    def _count_webrtc(self, r: CollectorRegistry) -> None:
        """WHEP viewers, sessions, shared encodes and stalls."""
        self.webrtc_viewers = Gauge(
            "vaecast_webrtc_viewers",
            "WHEP viewers connected or connecting, by what their video is: the job's own "
            "H.264 packetized per viewer (h264) or the VP8 encode shared per job (vp8)",
            ["video"],
            registry=r,
        )
        self.webrtc_sessions = Counter(
            "vaecast_webrtc_sessions",
            "WHEP sessions by how they ended (refused: over --max-webrtc-viewers)",
            ["outcome"],
            registry=r,
        )
        self.webrtc_shared_encodes = Counter(
            "vaecast_webrtc_shared_encodes",
            "Encodes started for WebRTC viewers, one per job and codec however many share it",
            ["codec"],
            registry=r,
        )
        self.webrtc_stalls = Counter(
            "vaecast_webrtc_stalls",
            "Units a WHEP viewer's track sent late because they were not yet decoded",
            registry=r,
        )
        self.webrtc_late_sends = Counter(
            "vaecast_webrtc_late_sends",
            "Units a WHEP viewer's track had in time but sent late: the peers' process "
            "got no CPU soon enough (a busy host)",
            registry=r,
        )

    def record_loop_lag(self, lag_s: float) -> None:
        self.loop_lag.observe(lag_s)
        if lag_s > self._worst_lag_s:
            self._worst_lag_s = lag_s
            self.loop_lag_max.set(lag_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
