"""The push protocol without I/O: what both push sessions send, and how they read answers.

`vaecast.client` holds the two sessions, over http.client and over aiohttp; everything
they share lives here so that each is only its transport: the job's creation and push
requests (`Request`), the push token and sequence headers, the session's state and the
job's URLs (`PushSessionBase`), reading an answer into JSON or a `PushError`
(`parse_answer`), and when a failed push is sent again (`retry_delay`). The retry
rules are those of `vaecast.client`'s module docstring.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any
from urllib.parse import urlsplit

from vaecast.client.blocks import Array, encode_block, encode_frames_block
from vaecast.errors import InvalidRequestError, VaecastError

Fps = int | float | Fraction | str

DEFAULT_TIMEOUT_S = 300.0  # seconds a request may wait for the server, backpressure included
PUSH_TOKEN_HEADER = "X-Push-Token"
PUSH_SEQ_HEADER = "X-Push-Seq"
DEFAULT_RETRY_S = 60.0  # how long one push may go on being retried
RETRY_STATUSES = frozenset({429, 502, 503, 504})
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
MAX_ANSWER_BYTES = 1 << 20  # JSON answers are small: a URL that serves a video is a mistake
_ENDED = (404, 409, 410)  # the job is over or gone: a DELETE would delete its record


class ApiError(VaecastError):
    """The server refused a request, or gave no answer.

    `status` is the HTTP status (0 when no answer came: `type` is then `timeout` or
    `connection_error`, or `incomplete` for a video that broke off), `type` and
    `message` those of the server's JSON error, and `retry_after_s` the `Retry-After` of
    a 429 or 503, if it sent one.
    """

    def __init__(
        self, status: int, error_type: str, message: str, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = error_type
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        prefix = f"HTTP {self.status} " if self.status else ""
        return f"{prefix}{self.type}: {self.message}"


class PushError(ApiError):
    """The server refused a request of a push session, or gave no answer (`ApiError`)."""


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # below the base URL, from "/"
    headers: dict[str, str]
    body: bytes | None = None


def parse_answer(
    status: int, data: bytes, retry_after: str | None, error_class: type[ApiError] = PushError
) -> dict[str, Any]:
    """The JSON of a 2xx answer, or the `error_class` error of any other."""
    try:
        parsed = json.loads(data) if len(data) <= MAX_ANSWER_BYTES else None
    except ValueError:
        parsed = None
    if 200 <= status < 300 and isinstance(parsed, dict):
        return parsed
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        error_type, message = str(error.get("type", "error")), str(error.get("message", ""))
    else:  # not vaecast's JSON (a proxy's page, a wrong URL): quote the start of it
        error_type = "bad_response" if 200 <= status < 300 else "http_error"
        message = data[:200].decode("utf-8", "replace").strip() or "(empty answer)"
    seconds = re.fullmatch(r"[0-9]{1,9}", retry_after or "")  # the HTTP-date form is not used
    retry_after_s = float(seconds.group()) if seconds else None
    raise error_class(status, error_type, message, retry_after_s)


def retry_delay(error: PushError, attempt: int, spent_s: float, budget_s: float) -> float | None:
    """Seconds to wait before sending a push again, or None to raise `error`.

    `attempt` counts the tries so far (1 after the first), `spent_s` the time since the
    first began: a retry that would start past `budget_s` is not made.
    """
    # A timeout is not retried: `timeout` bounds the wait for an answer, backpressure
    # included, and the same server would hold the same push again.
    if not (error.type == "connection_error" or error.status in RETRY_STATUSES):
        return None
    backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (attempt - 1))
    delay = error.retry_after_s if error.retry_after_s is not None else backoff
    return delay if spent_s + delay <= budget_s else None


def request_headers(api_key: str | None, content_type: str | None = None) -> dict[str, str]:
    """The headers every client request carries: JSON answers, who asks, the key."""
    headers = {"Accept": "application/json", "User-Agent": "vaecast-client"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def json_fps(fps: Fps) -> int | float | str:
    """fps as JSON: a number as given, a Fraction as an int or a ratio the server reads."""
    if isinstance(fps, Fraction):
        return fps.numerator if fps.denominator == 1 else f"{fps.numerator}/{fps.denominator}"
    return fps


class PushSessionBase:
    """What both sessions share: the requests they send, their state and the job's URLs."""

    def __init__(
        self,
        url: str,
        *,
        fps: Fps = 16,
        model: str | None = None,
        api_key: str | None = None,
        audio_sample_rate: int | None = None,
        audio_channels: int | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        retry_s: float = DEFAULT_RETRY_S,
        kind: str = "latents",
        value_range: tuple[float, float] = (0.0, 1.0),
        width: int | None = None,
        height: int | None = None,
        batch: int = 1,
        preview: str | None = None,
        webhook_url: str | None = None,
        expected_frames: int | None = None,
    ) -> None:
        """`kind` "frames" pushes decoded frames (see `vaecast.client`); `width` and
        `height` crop the video to its top-left part (a decoder's padding); `batch` > 1
        pushes blocks of that many videos at once, `(B, C, t, H, W)`, watched as one
        job each (`content_urls`); `preview` names a fast decoder of the same latents
        that plays first (`"none"`: none, where the server has a default);
        `webhook_url` is where the job's start and end are POSTed, signed;
        `expected_frames`, the length the producer expects, lets the server predict a
        viewer's stall-free start over the whole video."""
        if urlsplit(url).scheme not in ("http", "https"):
            raise InvalidRequestError(f"the server URL must be http:// or https://, got {url!r}")
        if kind not in ("latents", "frames"):
            raise InvalidRequestError(f"kind is 'latents' or 'frames', got {kind!r}")
        self.kind = kind
        self.value_range = (float(value_range[0]), float(value_range[1]))
        self.base_url = url.rstrip("/")
        self.timeout = timeout
        self.retry_s = retry_s
        self._api_key = api_key
        self._next_seq = 0  # the index the next push carries
        create: dict[str, Any] = {"input": "push", "fps": json_fps(fps)}
        optional = {
            "kind": "frames" if kind == "frames" else None,
            "model": model,
            "audio_sample_rate": audio_sample_rate,
            "audio_channels": audio_channels,
            "width": width,
            "height": height,
            "batch": batch if batch != 1 else None,
            "preview": preview,
            "webhook_url": webhook_url,
            "expected_frames": expected_frames,
        }
        create.update({key: value for key, value in optional.items() if value is not None})
        self._create_body = json.dumps(create).encode()
        self._job: dict[str, Any] | None = None
        self._batch_jobs: list[dict[str, Any]] = []
        self._push_path = ""
        self._token = ""  # shown once, at creation; kept out of `job` so it is not logged
        self._finalized = False  # the final mark went out: the job will complete on its own
        self._closed = False

    # The job and its URLs.

    @property
    def job(self) -> dict[str, Any]:
        """The job object as last seen: at creation, or at the last `refresh()`."""
        return dict(self._opened())

    @property
    def id(self) -> str:
        return str(self._opened()["id"])

    @property
    def content_url(self) -> str:
        """The MP4, progressive while the job runs: what a player or `curl` opens."""
        return self._url(self._opened()["urls"]["content"])

    @property
    def watch_url(self) -> str:
        return self.content_url

    @property
    def content_urls(self) -> list[str]:
        """Each video's MP4: one for a session, B for a batch (in its order)."""
        jobs = self._batch_jobs or [self._opened()]
        return [self._url(job["urls"]["content"]) for job in jobs]

    @property
    def events_url(self) -> str:
        return self._url(self._opened()["urls"]["events"])

    @property
    def page_url(self) -> str:
        """The server's preview page, showing this job."""
        return f"{self.base_url}/?video={self.id}"

    @property
    def push_url(self) -> str:
        self._opened()
        return self._url(self._push_path)

    def _opened(self) -> dict[str, Any]:
        if self._job is None:
            raise RuntimeError("the push session is not open: use it in a `with` or call open()")
        return self._job

    def _url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    # Requests, sans I/O.

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        return request_headers(self._api_key, content_type)

    def _create_request(self) -> Request:
        return Request("POST", "/v1/videos", self._headers("application/json"), self._create_body)

    def _created(self, answer: dict[str, Any]) -> None:
        push = answer.pop("push", None)
        if isinstance(answer.get("data"), list) and answer["data"]:  # a batch: a job each
            self._batch_jobs = [dict(job) for job in answer["data"]]
            answer = dict(answer["data"][0])
        urls = answer.get("urls")
        if not (
            "id" in answer
            and isinstance(urls, dict)
            and {"self", "content", "events"} <= urls.keys()
            and isinstance(push, dict)
            and {"url", "token"} <= push.keys()
        ):
            raise PushError(201, "bad_response", "the job object lacks its id, urls or push")
        self._push_path, self._token = str(push["url"]), str(push["token"])
        self._job = answer

    def _check_pushable(self) -> None:
        if self._closed:
            raise RuntimeError("the push session is closed")
        self._opened()

    def _push_request(self, body: bytes, final: bool) -> Request:
        self._check_pushable()
        headers = {
            **self._headers("application/octet-stream"),
            PUSH_TOKEN_HEADER: self._token,
            PUSH_SEQ_HEADER: str(self._next_seq),
        }
        return Request("POST", self._push_path + ("?final=1" if final else ""), headers, body)

    def _encode(self, block: Array, audio: Array | None) -> bytes:
        if self.kind == "frames":
            return encode_frames_block(block, audio, self.value_range)
        return encode_block(block, audio)

    def _pushed(self, answer: dict[str, Any]) -> dict[str, Any]:
        self._next_seq += 1
        return answer

    def _gave_up(self, error: PushError, attempts: int, started: float) -> PushError:
        if attempts > 1:
            error.add_note(
                f"gave up after {attempts} tries in {time.monotonic() - started:.1f} s "
                f"(retry_s={self.retry_s:g})"
            )
        return error

    def _cancel_request(self) -> Request:
        return Request("DELETE", self._opened()["urls"]["self"], self._headers())

    def _refresh_request(self) -> Request:
        return Request("GET", self._opened()["urls"]["self"], self._headers())

    def _should_cancel(self, error: BaseException) -> bool:
        ended = isinstance(error, PushError) and error.status in _ENDED
        return self._job is not None and not self._finalized and not ended
