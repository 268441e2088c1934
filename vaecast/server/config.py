"""Server settings: limits, encoder options, defaults and the faces served, in one
frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from vaecast.codecs.encoder_settings import EncoderSettings
from vaecast.server.edge.body_rate import BodyPace
from vaecast.server.edge.security_config import SecurityConfig

MIB = 1024 * 1024
# What one request's fields may be: a form field's text, and a preview decoder's name
# (a plugin's "package.module:factory" fits). The intake checks them, the API document
# states them.
MAX_FIELD_BYTES = 1024
MAX_PREVIEW_NAME = 200


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask for; past these the server answers 413."""

    max_upload_bytes: int = 512 * MIB
    max_frames: int = 2001
    max_pixels_per_frame: int = 1920 * 1088


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """Webhooks (the webhooks face): sent only when the server has a `secret` to sign
    them with (Standard Webhooks: `whsec_` and base64, as its libraries take it). A job
    names its `webhook_url`, or gets `default_url`. A delivery is tried `attempts`
    times at most, each given `timeout_s`, the waits between them growing from
    `first_retry_s` fivefold to `max_retry_s`. Private targets are refused unless
    `allow_private` (`vaecast.server.edge.outbound`)."""

    secret: str | None = None
    default_url: str | None = None
    allow_private: bool = False
    attempts: int = 6
    timeout_s: float = 5.0
    first_retry_s: float = 1.0
    max_retry_s: float = 300.0
    senders: int = 4  # deliveries in flight at once


class FaceSpec(Protocol):
    """A delivery face as the config names it, with its own settings (frozen).
    `build()` makes the running face for one app (`vaecast.server.faces.face.Face`)."""

    @property
    def name(self) -> str: ...

    def build(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class ServerConfig:
    default_model: str = "tiny"
    default_fps: Fraction = Fraction(16)
    device: str = "cpu"
    encoder: EncoderSettings = field(default_factory=EncoderSettings)
    limits: Limits = field(default_factory=Limits)
    decode_slots: int = 1
    # Chunks that may wait between the decoder thread and the encoder before the
    # decoder blocks: small, so memory stays O(chunk) however long the video.
    queue_chunks: int = 2
    # Jobs waiting for a decode slot; past this, POST answers 429 with Retry-After.
    max_queued_jobs: int = 8
    # A comment line on idle event streams, so proxies and browsers keep them open.
    events_keepalive_s: float = 15.0
    # A viewer whose socket accepts nothing for this long is dropped (only it).
    reader_write_timeout_s: float = 30.0
    # A connection must deliver a whole request head within this long of opening (or
    # of its previous response), and a request body may pause at most this long
    # between two reads: nginx's client_header_timeout and client_body_timeout.
    header_timeout_s: float = 60.0
    body_timeout_s: float = 60.0
    # Push sessions: latent blocks that may wait for the decoder before a push waits
    # (backpressure), and how long a session may receive nothing before it fails.
    push_queue_blocks: int = 4
    push_idle_timeout_s: float = 60.0
    # Finished jobs stay fetchable this long, and while their bytes in RAM fit the
    # budget (oldest evicted first); a job's MP4 past the spill threshold goes to a
    # temporary file in spill_dir (None: the system's temp dir).
    retention_s: float = 3600.0
    retention_memory_bytes: int = 2048 * MIB
    spill_threshold_bytes: int = 64 * MIB
    spill_dir: str | None = None
    # The durable store (vaecast.store): job records in SQLite and one MP4 file per job
    # under this folder, so finished videos survive a restart; None: memory only (the
    # CLI's default is the user's data directory). Its videos may take at most
    # store_max_bytes of disk: past it the oldest finished go first, then a running
    # video that does not fit streams without being kept (its job says `not_stored`).
    store_dir: str | None = None
    store_max_bytes: int = 20 * 1024 * MIB
    # Fair admission (vaecast.server.stream.admission): a body arriving slower than
    # min_body_rate bytes/s, after a grace of body_rate_grace_s, is refused (408) and
    # gives its place back; at most max_pending places are held by bodies still
    # arriving and by push sessions with no block yet, max_pending_per_client of them
    # by one client (its address); a push session's first block must come within
    # push_first_block_timeout_s.
    min_body_rate: int = 64 * 1024
    body_rate_grace_s: float = 5.0
    max_pending: int = 16
    max_pending_per_client: int = 8  # a batch of 8 push sessions; the other half for others
    push_first_block_timeout_s: float = 15.0
    # Preview-then-final: a model's default preview decoder (model, decoder) pairs, as
    # `--preview wan2.1=taehv` gives them; a request's "preview" overrides it ("none":
    # no preview). preview_device: where preview decoders run; None: with the model.
    previews: tuple[tuple[str, str], ...] = ()
    preview_device: str | None = None
    # On SIGTERM/SIGINT: refuse new jobs, let running ones finish this long, then cancel.
    shutdown_grace_s: float = 30.0
    # API key, host names answered to, CORS origins (vaecast.server.edge.security).
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # Signed webhooks of each job's start and end (the webhooks face); off without a secret.
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    # The delivery faces, in the order their routes are added; None: the standard set
    # (`vaecast.server.faces.standard.standard_faces()`: progressive MP4, LL-HLS, WHEP,
    # stills). A face of your own is one more entry (`vaecast.server.faces.face` says
    # what it is).
    faces: tuple[FaceSpec, ...] | None = None

    def body_pace(self) -> BodyPace:
        """How long a request body may take to arrive (`header_timeout_s`' twin for
        bodies, and the minimum rate after its grace)."""
        return BodyPace(self.body_timeout_s, self.min_body_rate, self.body_rate_grace_s)
