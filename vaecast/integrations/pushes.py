"""How the integrations talk to a server: one upload of whole latents (`urllib`, a
safetensors body), push sessions opened with the pipeline's first final block
(`vaecast.client.PushSession`), and the step callbacks that push from inside a
pipeline's denoising loop."""

from __future__ import annotations

import contextlib
import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import torch
from safetensors.torch import save as save_safetensors

from vaecast.client import DEFAULT_TIMEOUT_S, PushSession
from vaecast.errors import InvalidRequestError, VaecastError
from vaecast.integrations.calls import Job, PipelineError

OnJob = Callable[[Job], None]
StepCallback = Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]
CONTENT_SUFFIX = "/content"  # a job's MP4 is `/v1/videos/{id}/content`, the job `/v1/videos/{id}`


class UploadError(VaecastError):
    """The server refused an upload (`status`, and its error's `type` and message), or
    gave no answer (`status` 0, `type` `connection_error`)."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = error_type

    def __str__(self) -> str:
        prefix = f"HTTP {self.status} " if self.status else ""
        return f"{prefix}{self.type}: {self.message}"


def one_or_all(jobs: list[Job]) -> Job | list[Job]:
    """A video's job alone; a batch's jobs as a list, in its order."""
    return jobs[0] if len(jobs) == 1 else jobs


def upload(
    url: str,
    latents: torch.Tensor,
    params: Mapping[str, str],
    *,
    api_key: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> Job | list[Job]:
    """`POST {url}/v1/videos?params` with `latents` as a safetensors body; the job, or
    for a batch (B > 1) the B jobs the server makes, one per video in order."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise InvalidRequestError(f"the server URL must be http:// or https://, got {url!r}")
    body = save_safetensors({"latents": latents.detach().cpu().contiguous()})
    target = f"{url.rstrip('/')}/v1/videos?{urlencode(params)}"
    answer = _json_request(target, api_key, timeout, body)
    if isinstance(answer.get("data"), list):
        jobs = answer["data"]
        if len(jobs) != latents.shape[0] or not all(isinstance(job, dict) for job in jobs):
            raise UploadError(201, "bad_response", f"not {latents.shape[0]} job objects")
        return one_or_all(jobs)
    if "id" not in answer:
        raise UploadError(201, "bad_response", "the answer is not a job object")
    return answer


def get_job(job_url: str, api_key: str | None, timeout: float | None) -> Job:
    """`GET` of a job's own URL: the job object as the server has it now."""
    return _json_request(job_url, api_key, timeout)


def _json_request(
    target: str, api_key: str | None, timeout: float | None, body: bytes | None = None
) -> dict[str, Any]:
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/octet-stream"
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    method = "GET" if body is None else "POST"
    request = urllib.request.Request(target, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise _http_error(error.code, error.read()) from None
    except (OSError, ValueError) as error:  # refused, reset, timed out; an answer not JSON
        raise UploadError(0, "connection_error", f"{method} {target}: {error}") from error
    if not isinstance(answer, dict):
        raise UploadError(200, "bad_response", "the answer is not a JSON object")
    return answer


def _http_error(status: int, data: bytes) -> UploadError:
    try:
        error = json.loads(data).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        return UploadError(status, str(error.get("type", "error")), str(error.get("message")))
    return UploadError(status, "http_error", data[:200].decode("utf-8", "replace").strip())


def session_jobs(session: PushSession, api_key: str | None) -> list[Job]:
    """The job of each video of an open push session, as the server has it now."""
    urls = session.content_urls
    if len(urls) == 1:
        return [session.refresh()]
    # A batch session: each video's job is at its MP4's URL without `/content`.
    return [get_job(url.removesuffix(CONTENT_SUFFIX), api_key, session.timeout) for url in urls]


class LazyPushSession:
    """A push session that opens with its first block, for as many videos as that block
    holds (its first dimension): the wait for the first block to be final does not count
    towards the server's idle timeout, and a pipeline's batch is known by then.

    `open_session(batch)` makes the session; `on_job(job)` is called for each video's job
    once it opens. The session is entered on `stack`, which sends the final mark (or
    cancels the jobs on an error) when it closes.
    """

    def __init__(
        self,
        stack: contextlib.ExitStack,
        open_session: Callable[[int], PushSession],
        on_job: OnJob | None,
        api_key: str | None,
    ) -> None:
        self._stack = stack
        self._open_session = open_session
        self._on_job = on_job
        self._api_key = api_key
        self.session: PushSession | None = None

    def push(self, block: torch.Tensor) -> None:
        if self.session is None:
            self.session = self._stack.enter_context(self._open_session(int(block.shape[0])))
            if self._on_job is not None:
                for job in session_jobs(self.session, self._api_key):
                    self._on_job(job)
        self.session.push(block)

    def jobs(self) -> Job | list[Job]:
        """The job (or a batch's jobs) as the server has it now."""
        if self.session is None:
            raise PipelineError("the pipeline made no frames to push")
        return one_or_all(session_jobs(self.session, self._api_key))


def tensor_inputs(kwargs: Mapping[str, Any]) -> list[str]:
    """The callback's tensor inputs: the caller's, and `latents`."""
    user = kwargs.get("callback_on_step_end")
    names = list(
        getattr(user, "tensor_inputs", None)
        or kwargs.get("callback_on_step_end_tensor_inputs")
        or []
    )
    return names if "latents" in names else [*names, "latents"]


def chained(user: Any, ours: Callable[[Any, int, Any, torch.Tensor], None]) -> StepCallback:
    """The caller's callback first (it may replace the latents), then ours on the
    latents the pipeline goes on with."""

    def callback(pipe: Any, step: int, timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        outputs = user(pipe, step, timestep, kwargs) if user is not None else {}
        outputs = {} if outputs is None else outputs
        ours(pipe, step, timestep, outputs.get("latents", kwargs["latents"]))
        return outputs

    return callback


def with_step_callback(
    kwargs: Mapping[str, Any], ours: Callable[[Any, int, Any, torch.Tensor], None]
) -> dict[str, Any]:
    """The call's arguments with `ours` run at each step after the caller's callback."""
    return {
        **kwargs,
        "callback_on_step_end_tensor_inputs": tensor_inputs(kwargs),
        "callback_on_step_end": chained(kwargs.get("callback_on_step_end"), ours),
    }


def frame_digests(latents: torch.Tensor) -> list[bytes]:
    """Each latent frame's bytes (all videos of a batch), hashed: what a pushed frame is
    checked by at the end."""
    host = latents.detach().to("cpu").contiguous()
    return [
        # As bytes: numpy has no bfloat16.
        hashlib.blake2b(host[:, :, index].contiguous().view(torch.uint8).numpy()).digest()
        for index in range(host.shape[2])
    ]
