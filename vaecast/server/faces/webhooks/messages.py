"""What a webhook says, and how it is signed: no I/O.

A message is the Standard Webhooks envelope, `{"type", "timestamp", "data"}`, with the
job object (as `GET /v1/videos/{id}` answers it, less its queue place) as `data`:

- `video.started`: its decode began;
- `video.completed`: its video is whole;
- `video.failed`, `video.cancelled`: it ended otherwise (`data.partial` says whether
  its video so far is kept).

It is signed with the `standardwebhooks` package (HMAC-SHA256 of
`{webhook-id}.{webhook-timestamp}.{body}`, the key the server's `--webhook-secret`),
so a receiver verifies it with the Standard Webhooks library of its language. The
`webhook-id` is the same for every try of one message, before and after a restart
(`msg_{job id}_{event}`): a receiver that saw it already can drop it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook

from vaecast.job.record import JobStatus

STARTED = "video.started"
COMPLETED = "video.completed"
FAILED = "video.failed"
CANCELLED = "video.cancelled"
# A job's event (`GET .../events`) -> its webhook; an `error` is failed or cancelled.
BY_EVENT = {"started": STARTED, "done": COMPLETED}
ENDINGS = {JobStatus.COMPLETED: COMPLETED, JobStatus.FAILED: FAILED, JobStatus.CANCELLED: CANCELLED}


@dataclass(frozen=True, slots=True)
class Message:
    """One webhook: its id, type, target and body (the bytes signed and sent)."""

    id: str
    job_id: str
    type: str
    url: str
    body: bytes


def message(job_object: dict[str, Any], event_type: str, url: str, at: datetime) -> Message:
    job_id = job_object["id"]
    body = {"type": event_type, "timestamp": at.isoformat(), "data": job_object}
    data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return Message(
        f"msg_{job_id}_{event_type.removeprefix('video.')}", job_id, event_type, url, data
    )


def signed_headers(signer: Webhook, message: Message, at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of one try of `message`, sent at `at`."""
    return {
        "Content-Type": "application/json",
        "webhook-id": message.id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signer.sign(message.id, at, message.body),
    }


def now() -> datetime:
    return datetime.now(UTC)


def retry_delays(first_s: float, max_s: float, attempts: int) -> list[float]:
    """The waits before the 2nd, 3rd, ... try: from `first_s`, five times longer each
    time, at most `max_s`; `attempts - 1` of them."""
    delays, delay = [], first_s
    for _ in range(max(0, attempts - 1)):
        delays.append(min(max_s, delay))
        delay = min(max_s, delay * 5)  # capped as it grows: no overflow however many
    return delays
