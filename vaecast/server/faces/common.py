"""What every face does with a request for a job's rendition: find the one it names,
refuse it when it broke, wait for its first bytes, end a response whose client may
have gone."""

from __future__ import annotations

import contextlib

from aiohttp import web

from vaecast.errors import JobStateError, VaecastError
from vaecast.job.record import FINAL, PREVIEW
from vaecast.server.stream.job import Job, JobStatus, Rendition


def rendition_of(request: web.Request, job: Job) -> Rendition:
    """The rendition `?variant=` names: the final (the video) by default."""
    return job.rendition(request.query.get("variant", FINAL))


def refuse_if_broken(job: Job, rendition: Rendition | None = None) -> None:
    """Refuse a request for the content of a job (or a rendition of it) that failed or
    was cancelled (409, naming the error), or whose bytes are gone. A final kept as a
    partial file (`Job.end_keeping_partial`) is served as any finished file."""
    rendition = rendition or job.final
    status, error = job.status_of(rendition), job.error_of(rendition)
    kept = rendition.variant == FINAL and job.record.partial and rendition.log.complete
    if status in (JobStatus.FAILED, JobStatus.CANCELLED) and not kept:
        assert error is not None
        what = f"video {job.id}" if rendition.variant == FINAL else f"the preview of {job.id}"
        raise JobStateError(f"{what} has no content: {status.value}: {error.message}")
    if rendition.log.error is not None:  # its bytes are gone (evicted, shut down)
        raise rendition.log.error.detached()


async def wait_for_init(job: Job, rendition: Rendition | None = None) -> None:
    """Until the job's init segment exists. A job that fails without one is refused as
    any request for a failed job's content (409 naming its error), not with its error's
    own status: a push session's producer that timed out (408) is no fault of its
    viewer. A cancelled job's error stays as it is (503 for a shutdown: try elsewhere)."""
    rendition = rendition or job.final
    try:
        await rendition.log.wait_for_init()
    except VaecastError:
        if job.record.status is JobStatus.FAILED or rendition.variant == PREVIEW:
            refuse_if_broken(job, rendition)
        raise


async def end_response(response: web.StreamResponse) -> None:
    """Write the end of a response whose client may already have gone (and that is fine)."""
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
