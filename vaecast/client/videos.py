"""A client for the whole jobs API: upload latents, follow a job, download its video.

    client = Client("http://127.0.0.1:8000")
    job = client.upload("z.safetensors", fps=16, preview="linear")
    print("watch:", client.page_url(job["id"]))
    done = client.wait(job["id"])           # until completed, failed or cancelled
    client.download(job["id"], "video.mp4")  # the MP4 (a kept partial too)
    Path("thumb.webp").write_bytes(client.thumbnail(job["id"]).data)

`AsyncClient` is the same over aiohttp, each method awaited. Both answer with the
server's JSON (the job object: `status`, `progress`, `urls`, ...) and raise `ApiError`
(HTTP status, the error's `type` and `message`) for any refusal. `push(...)` opens a
`PushSession` (or `AsyncPushSession`) on the same server with the same key.

Requests are built without I/O here (`_Requests`); each client is only its transport:
`http.client` for `Client` (no dependency beyond the standard library), aiohttp for
`AsyncClient`. A download streams to a partial file beside its path and renames it
into place once whole, so an interrupted one leaves nothing under the name.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import quote, urlencode, urlsplit

from vaecast.client.protocol import (
    DEFAULT_TIMEOUT_S,
    MAX_ANSWER_BYTES,
    ApiError,
    Fps,
    Request,
    json_fps,
    parse_answer,
    request_headers,
)
from vaecast.client.transport import open_request
from vaecast.errors import InvalidRequestError

if TYPE_CHECKING:
    import aiohttp

    from vaecast.client.push import AsyncPushSession, PushSession

FINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
FIRST_POLL_S = 0.1  # `wait` polls at this, doubling up to MAX_POLL_S
MAX_POLL_S = 2.0
DOWNLOAD_CHUNK_BYTES = 256 * 1024
PARTIAL_NAME_TRIES = 100
MAX_STILL_BYTES = 64 << 20  # a spritesheet of 16 tiles is far smaller
Latents = str | os.PathLike[str] | bytes


@dataclass(frozen=True, slots=True)
class StillImage:
    """A job's thumbnail or spritesheet: the image and what the server said of it.
    `frame` is a thumbnail's frame; `layout` a spritesheet's grid, as its
    `X-Spritesheet` header states it (`columns=4; rows=2; tile=160x90; covered=..`)."""

    data: bytes
    media_type: str
    etag: str
    final: bool  # the video is complete: this image will not change
    frame: int | None = None
    layout: str | None = None


def _still_image(status: int, data: bytes, header_items: Iterable[tuple[str, str]]) -> StillImage:
    if status != 200 or len(data) > MAX_STILL_BYTES:
        parse_answer(status, data[: MAX_ANSWER_BYTES + 1], None, ApiError)
    headers = {name.lower(): value for name, value in header_items}
    frame = headers.get("x-still-frame")
    return StillImage(
        data,
        headers.get("content-type", ""),
        headers.get("etag", ""),
        headers.get("cache-control", "") != "no-cache",
        None if frame is None else int(frame),
        headers.get("x-spritesheet"),
    )


class _Requests:
    """The jobs API's requests, sans I/O: what both clients send."""

    def __init__(self, url: str, api_key: str | None) -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise InvalidRequestError(f"the server URL must be http:// or https://, got {url!r}")
        self.base_url = url.rstrip("/")
        self.api_key = api_key

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        return request_headers(self.api_key, content_type)

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    def upload(self, latents: Latents, options: Mapping[str, Any]) -> Request:
        """The latent file as the raw body, its options in the query string."""
        body = latents if isinstance(latents, bytes) else Path(latents).read_bytes()
        query = {
            key: json_fps(value) if key == "fps" else value
            for key, value in options.items()
            if value is not None
        }
        path = "/v1/videos" + (f"?{urlencode(query)}" if query else "")
        return Request("POST", path, self.headers("application/octet-stream"), body)

    def job(self, video_id: str) -> Request:
        return Request("GET", _job_path(video_id), self.headers())

    def jobs(self, limit: int) -> Request:
        return Request("GET", f"/v1/videos?limit={int(limit)}", self.headers())

    def cancel(self, video_id: str, keep: bool) -> Request:
        query = "" if keep else "?keep=false"
        return Request("DELETE", _job_path(video_id) + query, self.headers())

    def delete(self, video_id: str) -> Request:
        return Request("DELETE", _job_path(video_id), self.headers())

    def content(self, video_id: str, variant: str | None) -> Request:
        query = "" if variant is None else f"?variant={quote(variant)}"
        headers = {**self.headers(), "Accept": "video/mp4"}
        return Request("GET", f"{_job_path(video_id)}/content{query}", headers)

    def still(self, video_id: str, variant: str, image_format: str | None = None) -> Request:
        query = {"variant": variant} | ({} if image_format is None else {"format": image_format})
        return Request("GET", f"{_job_path(video_id)}/content?{urlencode(query)}", self.headers())


def _job_path(video_id: str) -> str:
    return f"/v1/videos/{quote(video_id, safe='')}"


def upload_options(
    model: str | None,
    fps: Fps | None,
    preview: str | None,
    width: int | None,
    height: int | None,
    num_frames: int | None,
    audio_sample_rate: int | None,
    webhook_url: str | None = None,
) -> dict[str, Any]:
    """An upload's options as the API names them (None: the server's default)."""
    return {
        "webhook_url": webhook_url,
        "model": model,
        "fps": fps,
        "preview": preview,
        "width": width,
        "height": height,
        "num_frames": num_frames,
        "audio_sample_rate": audio_sample_rate,
    }


def _poll_delays() -> Iterator[float]:
    delay = FIRST_POLL_S
    while True:
        yield delay
        delay = min(MAX_POLL_S, delay * 2)


@contextlib.contextmanager
def _partial_file(path: Path) -> Iterator[BinaryIO]:
    """A file written beside `path` and renamed to it once the block ends without an
    error (removed if it raises); with the umask's mode, as any file a user writes.

    Created as `mkstemp` creates one (a random name, only if new) but with mode 0666,
    which the kernel narrows by the umask: reading the umask would mean setting it,
    process-wide, under the other threads of the caller's program."""
    for _ in range(PARTIAL_NAME_TRIES):
        partial = path.parent / f".{path.name}.{secrets.token_hex(6)}.part"
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free name for a partial download beside {path}")
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise


class Client:
    """The jobs API over the standard library's http.client; see the module docstring."""

    def __init__(
        self, url: str, *, api_key: str | None = None, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        self._requests = _Requests(url, api_key)
        self.base_url = self._requests.base_url
        self.timeout = timeout

    def upload(
        self,
        latents: Latents,
        *,
        model: str | None = None,
        fps: Fps | None = None,
        preview: str | None = None,
        width: int | None = None,
        height: int | None = None,
        num_frames: int | None = None,
        audio_sample_rate: int | None = None,
        webhook_url: str | None = None,
    ) -> dict[str, Any]:
        """Create a job from a latent file (a path, or its bytes); the job object (201).

        `preview` names a fast decoder streamed first; `width` and `height` crop (or give
        a packed layout's size, with `num_frames`); `webhook_url` is where its start and
        end are POSTed, signed; the rest as `POST /v1/videos` takes them. A batch file
        makes a job each: the answer is then the list's."""
        options = upload_options(
            model, fps, preview, width, height, num_frames, audio_sample_rate, webhook_url
        )
        return self._call(self._requests.upload(latents, options))

    def get(self, video_id: str) -> dict[str, Any]:
        """The job object as it is now."""
        return self._call(self._requests.job(video_id))

    def jobs(self, limit: int = 20) -> list[dict[str, Any]]:
        """Recent jobs, newest first (`GET /v1/videos`)."""
        return list(self._call(self._requests.jobs(limit))["data"])

    def wait(self, video_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """The job object once it has ended (completed, failed or cancelled: check its
        `status`); polls, from 0.1 s apart to 2 s. TimeoutError past `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for delay in _poll_delays():
            job = self.get(video_id)
            if job["status"] in FINAL_STATUSES:
                return job
            if deadline is not None and time.monotonic() + delay > deadline:
                raise TimeoutError(f"video {video_id} is still {job['status']} after {timeout} s")
            time.sleep(delay)
        raise AssertionError("unreachable")

    def download(
        self, video_id: str, path: str | os.PathLike[str], *, variant: str | None = None
    ) -> Path:
        """Write the job's MP4 to `path`: a running job's as it grows, to its end; a kept
        partial too. `variant`: `"preview"` or `"live"` of a job with a preview (the
        final by default). ApiError if it has none (409) or it broke off."""
        target = Path(path)
        request = self._requests.content(video_id, variant)
        connection, response = self._open(request)
        try:
            if response.status != 200:
                parse_answer(response.status, response.read(MAX_ANSWER_BYTES + 1), None, ApiError)
            with _partial_file(target) as file:
                while chunk := response.read(DOWNLOAD_CHUNK_BYTES):
                    file.write(chunk)
        except http.client.IncompleteRead as error:
            raise ApiError(0, "incomplete", f"the video {video_id} broke off: {error}") from None
        finally:
            connection.close()
        return target

    def thumbnail(self, video_id: str, *, image_format: str = "webp") -> StillImage:
        """The job's thumbnail: the middle frame of its video so far, WebP (or "jpeg").
        Waits for the job's first chunk; a running job's changes as it grows."""
        return self._still(self._requests.still(video_id, "thumbnail", image_format))

    def spritesheet(self, video_id: str) -> StillImage:
        """The job's spritesheet: a JPEG grid of up to 16 frames of its video so far."""
        return self._still(self._requests.still(video_id, "spritesheet"))

    def _still(self, request: Request) -> StillImage:
        connection, response = self._open(request)
        try:
            data = response.read(MAX_STILL_BYTES + 1)
        finally:
            connection.close()
        return _still_image(response.status, data, response.getheaders())

    def cancel(self, video_id: str, *, keep: bool = True) -> dict[str, Any]:
        """Cancel a queued or running job; the job object once its decode has stopped.
        What it made so far stays a playable file (`partial`) unless `keep=False`."""
        return self._call(self._requests.cancel(video_id, keep))

    def delete(self, video_id: str) -> None:
        """Delete a finished (or partial) video: its id answers 410 from then on."""
        self._call(self._requests.delete(video_id))

    def page_url(self, video_id: str) -> str:
        """The server's preview page, showing the job."""
        return f"{self.base_url}/?video={quote(video_id, safe='')}"

    def push(self, **options: Any) -> PushSession:
        """A push session on this server with this key (`PushSession`'s options)."""
        from vaecast.client.push import PushSession

        return PushSession(self.base_url, api_key=self._requests.api_key, **options)

    def _open(
        self, request: Request
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        return open_request(self._requests.url(request.path), request, self.timeout, ApiError)

    def _call(self, request: Request) -> dict[str, Any]:
        connection, response = self._open(request)
        try:
            data = response.read(MAX_ANSWER_BYTES + 1)
        finally:
            connection.close()
        return parse_answer(response.status, data, response.getheader("Retry-After"), ApiError)


async def _answer(response: aiohttp.ClientResponse) -> bytes:
    """A JSON answer's bytes, read up to one past the most an answer may hold."""
    data = bytearray()
    async for piece in response.content.iter_chunked(64 * 1024):
        data += piece
        if len(data) > MAX_ANSWER_BYTES:
            break
    return bytes(data)


class AsyncClient:
    """The jobs API over aiohttp (`async with AsyncClient(url) as client:`); the same
    methods as `Client`, awaited."""

    def __init__(
        self, url: str, *, api_key: str | None = None, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        self._requests = _Requests(url, api_key)
        self.base_url = self._requests.base_url
        self.timeout = timeout
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            http_session, self._http = self._http, None
            await http_session.close()

    async def upload(
        self,
        latents: Latents,
        *,
        model: str | None = None,
        fps: Fps | None = None,
        preview: str | None = None,
        width: int | None = None,
        height: int | None = None,
        num_frames: int | None = None,
        audio_sample_rate: int | None = None,
        webhook_url: str | None = None,
    ) -> dict[str, Any]:
        """See `Client.upload`; the file is read in a thread."""
        options = upload_options(
            model, fps, preview, width, height, num_frames, audio_sample_rate, webhook_url
        )
        request = await asyncio.to_thread(self._requests.upload, latents, options)
        return await self._call(request)

    async def get(self, video_id: str) -> dict[str, Any]:
        return await self._call(self._requests.job(video_id))

    async def jobs(self, limit: int = 20) -> list[dict[str, Any]]:
        return list((await self._call(self._requests.jobs(limit)))["data"])

    async def wait(self, video_id: str) -> dict[str, Any]:
        """See `Client.wait`; bound it with `asyncio.timeout`."""
        for delay in _poll_delays():
            job = await self.get(video_id)
            if job["status"] in FINAL_STATUSES:
                return job
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def download(
        self, video_id: str, path: str | os.PathLike[str], *, variant: str | None = None
    ) -> Path:
        """See `Client.download`; written in a thread, off the loop."""
        import aiohttp

        target = Path(path)
        request = self._requests.content(video_id, variant)
        try:
            async with self._session().request(
                request.method, self._requests.url(request.path), headers=request.headers
            ) as response:
                if response.status != 200:
                    parse_answer(response.status, await _answer(response), None, ApiError)
                with _partial_file(target) as file:
                    async for chunk in response.content.iter_chunked(DOWNLOAD_CHUNK_BYTES):
                        await asyncio.to_thread(file.write, chunk)
        except aiohttp.ClientPayloadError as error:
            raise ApiError(0, "incomplete", f"the video {video_id} broke off: {error}") from None
        except aiohttp.ClientError as error:
            raise ApiError(0, "connection_error", f"GET {request.path}: {error}") from error
        return target

    async def thumbnail(self, video_id: str, *, image_format: str = "webp") -> StillImage:
        """See `Client.thumbnail`."""
        return await self._still(self._requests.still(video_id, "thumbnail", image_format))

    async def spritesheet(self, video_id: str) -> StillImage:
        """See `Client.spritesheet`."""
        return await self._still(self._requests.still(video_id, "spritesheet"))

    async def _still(self, request: Request) -> StillImage:
        import aiohttp

        try:
            async with self._session().get(
                self._requests.url(request.path), headers=request.headers
            ) as response:
                data = bytearray()
                async for piece in response.content.iter_chunked(DOWNLOAD_CHUNK_BYTES):
                    data += piece
                    if len(data) > MAX_STILL_BYTES:
                        break
                return _still_image(response.status, bytes(data), response.headers.items())
        except aiohttp.ClientError as error:
            raise ApiError(0, "connection_error", f"GET {request.path}: {error}") from error

    async def cancel(self, video_id: str, *, keep: bool = True) -> dict[str, Any]:
        return await self._call(self._requests.cancel(video_id, keep))

    async def delete(self, video_id: str) -> None:
        await self._call(self._requests.delete(video_id))

    def page_url(self, video_id: str) -> str:
        return f"{self.base_url}/?video={quote(video_id, safe='')}"

    def push(self, **options: Any) -> AsyncPushSession:
        """An `AsyncPushSession` on this server with this key."""
        from vaecast.client.push import AsyncPushSession

        return AsyncPushSession(self.base_url, api_key=self._requests.api_key, **options)

    def _session(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._http is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout, sock_read=self.timeout
            )
            self._http = aiohttp.ClientSession(timeout=timeout)
        return self._http

    async def _call(self, request: Request) -> dict[str, Any]:
        import aiohttp

        where = f"{request.method} {request.path}"
        try:
            async with self._session().request(
                request.method,
                self._requests.url(request.path),
                data=request.body,
                headers=request.headers,
            ) as response:
                data = await _answer(response)
                status, retry_after = response.status, response.headers.get("Retry-After")
        except TimeoutError as error:
            raise ApiError(0, "timeout", f"{where}: no answer in time") from error
        except aiohttp.ClientError as error:
            raise ApiError(0, "connection_error", f"{where}: {error}") from error
        return parse_answer(status, data, retry_after, ApiError)
