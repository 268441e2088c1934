"""A client for push sessions: send latents to a vaecast server while they are generated.

    with PushSession("http://127.0.0.1:8000", fps=16) as session:
        print("watch:", session.watch_url)
        for block in generate_blocks():  # (C, t, H, W) or (1, C, t, H, W) latent frames
            session.push(block)

A producer that decodes on its own pushes frames instead (`kind="frames"`): uint8
`(T, H, W, 3)` RGB, or floats `(1, 3, T, H, W)` / `(3, T, H, W)` in `value_range`
(default [0, 1]), torch or numpy. Float frames are quantized to uint8 where they are
(on the GPU for a CUDA tensor) and copied to the host once per block: a quarter of the
bytes of float32 go over the network, and the server encodes the same pixels.

`AsyncPushSession` is the same over aiohttp (`async with`, `await session.push(block)`).
Entering creates the job (`POST /v1/videos`, `{"input": "push", ...}`); each `push`
sends one safetensors block to the job's latents URL with its push token and returns the
server's 202 answer once the block is queued. That POST waits while the server's block
queue is full, so a generator is held back exactly as far as the decoder is behind.
Leaving normally sends the final mark (an empty block with `?final=1`); leaving by an
exception cancels the job (`DELETE`) and re-raises.

Each request goes on a new connection: a generator may take longer between blocks than
the server keeps an idle keep-alive connection.

Pushes are safe to retry: each block carries its index (`X-Push-Seq`, from 0, the
final mark included), and the server answers a block it already took with the same
answer and adds nothing. A push whose connection fails (refused, reset, closed before
the answer) or that gets a 502, 503, 504 or 429 is sent again with the same index (a
timeout is not: `timeout` bounds the wait, backpressure included), after `Retry-After`
where the server sent one, else after a backoff doubling from 0.1 s to 2 s, for at most
`retry_s` seconds in all (60 by default; 0: never), then `PushError` is raised. Other
answers (a 4xx that says what is wrong with the block) are raised at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

import numpy as np
import torch
from safetensors.torch import save as save_safetensors

from vaecast.errors import InvalidRequestError, VaecastError

if TYPE_CHECKING:
    import aiohttp

Array = torch.Tensor | np.ndarray
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
_NUMPY_FLOATS = (np.float16, np.float32, np.float64)


class PushError(VaecastError):
    """The server refused a request of a push session, or gave no answer.

    `status` is the HTTP status (0 when no answer came: `type` is then `timeout` or
    `connection_error`), `type` and `message` those of the server's JSON error, and
    `retry_after_s` the `Retry-After` of a 429 or 503, if it sent one.
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


def encode_block(latents: Array, audio: Array | None = None) -> bytes:
    """One block as the server reads it: safetensors with `latents` and maybe `audio`.

    The latents keep their float dtype (the server converts); the audio goes as float32.
    Checked here only as far as a mistake would otherwise cost a round trip.
    """
    tensor = _tensor(latents, "latents")
    if not tensor.is_floating_point():
        raise InvalidRequestError(f"latents must be floating point, got {tensor.dtype}")
    if tensor.ndim not in (4, 5):
        raise InvalidRequestError(
            f"a block is (C, t, H, W) or (B, C, t, H, W), got shape {tuple(tensor.shape)}"
        )
    if tensor.numel() == 0:
        raise InvalidRequestError(f"the block is empty: shape {tuple(tensor.shape)}")
    tensors = {"latents": tensor.contiguous()}
    if audio is not None:
        tensors["audio"] = _tensor(audio, "audio").to(torch.float32).contiguous()
    return save_safetensors(tensors)


def encode_frames_block(
    frames: Array, audio: Array | None = None, value_range: tuple[float, float] = (0.0, 1.0)
) -> bytes:
    """One frames block as the server reads it: safetensors with uint8 `frames`, `(T, H, W,
    3)` for one video or `(B, 3, T, H, W)` for a batch, and maybe `audio`. Floats are
    quantized to uint8 first, on their own device (`vaecast.codecs.quantize.quantize_to_host`,
    the server's own rounding), and copied to the host once per video."""
    from vaecast.codecs.quantize import quantize_to_host

    if isinstance(frames, np.ndarray) and frames.dtype == np.uint8:
        pixels = torch.from_numpy(frames if frames.flags.writeable else frames.copy())
    elif isinstance(frames, torch.Tensor) and frames.dtype == torch.uint8:
        pixels = frames.detach().cpu()
    else:
        tensor = frames if isinstance(frames, torch.Tensor) else _tensor(frames, "frames")
        if not tensor.is_floating_point():
            raise InvalidRequestError(f"frames must be uint8 or floating point, got {tensor.dtype}")
        if tensor.ndim == 4:
            tensor = tensor.unsqueeze(0)
        if tensor.ndim != 5 or tensor.shape[1] != 3:
            raise InvalidRequestError(
                f"float frames are (B, 3, T, H, W) or (3, T, H, W), got {tuple(frames.shape)}"
            )
        videos = [
            torch.from_numpy(quantize_to_host(tensor[b : b + 1].detach(), value_range))
            for b in range(tensor.shape[0])
        ]
        # One video as (T, H, W, 3); a batch as (B, 3, T, H, W), the server's batched form.
        pixels = videos[0] if len(videos) == 1 else torch.stack(videos).permute(0, 4, 1, 2, 3)
    one_video = pixels.ndim == 4 and pixels.shape[-1] == 3
    batched = pixels.ndim == 5 and pixels.shape[1] == 3
    if not (one_video or batched) or pixels.numel() == 0:
        raise InvalidRequestError(
            f"uint8 frames are (T, H, W, 3) or (B, 3, T, H, W), got {tuple(pixels.shape)}"
        )
    tensors = {"frames": pixels.contiguous()}
    if audio is not None:
        tensors["audio"] = _tensor(audio, "audio").to(torch.float32).contiguous()
    return save_safetensors(tensors)


def _tensor(value: Array, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()  # a block on the GPU is copied once, here
    if isinstance(value, np.ndarray):
        if value.dtype not in _NUMPY_FLOATS:
            raise InvalidRequestError(f"{name} must be float16, 32 or 64, got {value.dtype}")
        # torch.from_numpy warns on a read-only array; a copy is one block, cheap.
        writable = value if value.flags.writeable else value.copy()
        return torch.from_numpy(np.ascontiguousarray(writable))
    raise InvalidRequestError(f"{name} must be a torch tensor or a numpy array, got {type(value)}")


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str  # below the base URL, from "/"
    headers: dict[str, str]
    body: bytes | None = None


def _answer(status: int, data: bytes, retry_after: str | None) -> dict[str, Any]:
    """The JSON of a 2xx answer, or the PushError of any other."""
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
    raise PushError(status, error_type, message, retry_after_s)


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


def _json_fps(fps: Fps) -> int | float | str:
    """fps as JSON: a number as given, a Fraction as an int or a ratio the server reads."""
    if isinstance(fps, Fraction):
        return fps.numerator if fps.denominator == 1 else f"{fps.numerator}/{fps.denominator}"
    return fps


class _Session:
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
    ) -> None:
        """`kind` "frames" pushes decoded frames (see the module docstring); `width` and
        `height` crop the video to its top-left part (a decoder's padding); `batch` > 1
        pushes blocks of that many videos at once, `(B, C, t, H, W)`, watched as one
        job each (`content_urls`)."""
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
        create: dict[str, Any] = {"input": "push", "fps": _json_fps(fps)}
        optional = {
            "kind": "frames" if kind == "frames" else None,
            "model": model,
            "audio_sample_rate": audio_sample_rate,
            "audio_channels": audio_channels,
            "width": width,
            "height": height,
            "batch": batch if batch != 1 else None,
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
        headers = {"Accept": "application/json", "User-Agent": "vaecast-client"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _create_request(self) -> _Request:
        return _Request("POST", "/v1/videos", self._headers("application/json"), self._create_body)

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

    def _push_request(self, body: bytes, final: bool) -> _Request:
        self._check_pushable()
        headers = {
            **self._headers("application/octet-stream"),
            PUSH_TOKEN_HEADER: self._token,
            PUSH_SEQ_HEADER: str(self._next_seq),
        }
        return _Request("POST", self._push_path + ("?final=1" if final else ""), headers, body)

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

    def _cancel_request(self) -> _Request:
        return _Request("DELETE", self._opened()["urls"]["self"], self._headers())

    def _refresh_request(self) -> _Request:
        return _Request("GET", self._opened()["urls"]["self"], self._headers())

    def _should_cancel(self, error: BaseException) -> bool:
        ended = isinstance(error, PushError) and error.status in _ENDED
        return self._job is not None and not self._finalized and not ended


class PushSession(_Session):
    """A push session over the standard library's http.client; see the module docstring."""

    def open(self) -> Self:
        """Create the job (once); `with` does this."""
        if self._job is None:
            self._created(self._send(self._create_request()))
        return self

    def push(
        self, block: Array, audio: Array | None = None, *, final: bool = False
    ) -> dict[str, Any]:
        """Send one block (latents, or frames in a frames session); the server's answer
        once it is queued (`latent_frames`, ...).

        `final=True` marks it the last, so leaving the session sends nothing more.
        """
        self._check_pushable()  # before the work of serializing
        answer = self._push(self._push_request(self._encode(block, audio), final))
        self._finalized |= final
        return answer

    def _push(self, request: _Request) -> dict[str, Any]:
        """Send a push, retried with the same index as the module docstring says."""
        started, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            try:
                return self._pushed(self._send(request))
            except PushError as error:
                spent = time.monotonic() - started
                delay = retry_delay(error, attempts, spent, self.retry_s)
                if delay is None:
                    raise self._gave_up(error, attempts, started) from error.__cause__
            time.sleep(delay)

    def refresh(self) -> dict[str, Any]:
        """The job as the server has it now (status, progress, ...); updates `job`."""
        self._job = {**self._opened(), **self._send(self._refresh_request())}
        return self.job

    def cancel(self) -> dict[str, Any]:
        """Cancel the job (DELETE); the session is closed. The server's answer."""
        answer = self._send(self._cancel_request())
        self._closed = True
        return answer

    def close(self, final: bool = True) -> None:
        """End the session: send the final mark (`final=True`) or cancel the job.

        Once the final mark has gone out (`push(..., final=True)`) there is nothing to
        send or cancel. The session is closed even when this request fails; closing
        twice does nothing.
        """
        if self._closed or self._job is None or self._finalized:
            self._closed = True
            return
        request = self._push_request(b"", final=True) if final else self._cancel_request()
        self._closed = True  # even if this fails: the server ends a session left open
        if final:
            self._push(request)
        else:
            self._send(request)
        self._finalized = final

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close(final=True)
            return
        if self._should_cancel(exc):
            try:
                self._send(self._cancel_request())
            except Exception as cancel_error:  # the original error is the one to see
                exc.add_note(f"cancelling the job failed too: {cancel_error}")
        self._closed = True

    def _send(self, request: _Request) -> dict[str, Any]:
        parts = urlsplit(self._url(request.path))
        connection_type = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        connection = connection_type(parts.hostname or "", parts.port, timeout=self.timeout)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            # A server may answer (401, 413) before reading a whole block: read that answer.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                connection.request(request.method, target, request.body, request.headers)
            response = connection.getresponse()
            data = response.read(MAX_ANSWER_BYTES + 1)
        except TimeoutError as error:
            raise PushError(0, "timeout", f"{request.method} {target}: no answer") from error
        except (OSError, http.client.HTTPException) as error:
            raise PushError(0, "connection_error", f"{request.method} {target}: {error}") from error
        finally:
            connection.close()
        return _answer(response.status, data, response.getheader("Retry-After"))


class AsyncPushSession(_Session):
    """A push session over aiohttp, for a generator running in an event loop."""

    _http: aiohttp.ClientSession | None = None

    async def open(self) -> Self:
        """Create the job (once); `async with` does this."""
        if self._job is None:
            import aiohttp  # here, so that the sync client and `vaecast push` need none of it

            if self._http is None:
                timeout = aiohttp.ClientTimeout(
                    total=None, sock_connect=self.timeout, sock_read=self.timeout
                )
                connector = aiohttp.TCPConnector(force_close=True)  # see the module docstring
                self._http = aiohttp.ClientSession(connector=connector, timeout=timeout)
            try:
                self._created(await self._send(self._create_request()))
            except BaseException:
                await self._close_http()
                raise
        return self

    async def push(
        self, block: Array, audio: Array | None = None, *, final: bool = False
    ) -> dict[str, Any]:
        """Send one block; see `PushSession.push`. Serialized in a thread, off the loop."""
        self._check_pushable()  # before the work of serializing
        body = await asyncio.to_thread(self._encode, block, audio)
        answer = await self._push(self._push_request(body, final))
        self._finalized |= final
        return answer

    async def _push(self, request: _Request) -> dict[str, Any]:
        """See `PushSession._push`."""
        started, attempts = time.monotonic(), 0
        while True:
            attempts += 1
            try:
                return self._pushed(await self._send(request))
            except PushError as error:
                spent = time.monotonic() - started
                delay = retry_delay(error, attempts, spent, self.retry_s)
                if delay is None:
                    raise self._gave_up(error, attempts, started) from error.__cause__
            await asyncio.sleep(delay)

    async def refresh(self) -> dict[str, Any]:
        self._job = {**self._opened(), **(await self._send(self._refresh_request()))}
        return self.job

    async def cancel(self) -> dict[str, Any]:
        try:
            return await self._send(self._cancel_request())
        finally:
            self._closed = True
            await self._close_http()

    async def close(self, final: bool = True) -> None:
        """See `PushSession.close`; also closes the HTTP client."""
        try:
            if not (self._closed or self._job is None or self._finalized):
                request = self._push_request(b"", final=True) if final else self._cancel_request()
                self._closed = True  # even if this fails: the server ends a session left open
                if final:
                    await self._push(request)
                else:
                    await self._send(request)
                self._finalized = final
        finally:
            self._closed = True
            await self._close_http()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close(final=True)
            return
        try:
            if self._should_cancel(exc):
                await self._send(self._cancel_request())
        except Exception as cancel_error:
            exc.add_note(f"cancelling the job failed too: {cancel_error}")
        finally:
            self._closed = True
            await self._close_http()

    async def _close_http(self) -> None:
        if self._http is not None:
            http_session, self._http = self._http, None
            await http_session.close()

    async def _send(self, request: _Request) -> dict[str, Any]:
        import aiohttp

        if self._http is None:
            raise RuntimeError("the push session is closed")
        where = f"{request.method} {request.path}"
        try:
            async with self._http.request(
                request.method,
                self._url(request.path),
                data=request.body,
                headers=request.headers,
            ) as response:
                data = bytearray()
                async for piece in response.content.iter_chunked(64 * 1024):
                    data += piece
                    if len(data) > MAX_ANSWER_BYTES:
                        break
                status, retry_after = response.status, response.headers.get("Retry-After")
        except TimeoutError as error:
            raise PushError(0, "timeout", f"{where}: no answer in time") from error
        except aiohttp.ClientError as error:
            raise PushError(0, "connection_error", f"{where}: {error}") from error
        return _answer(status, bytes(data), retry_after)
