"""What each route of `vaecast.server.api.routes` promises: the records its handlers
carry (`@operation`, vaecast.server.contract.spec), which /openapi.json is made of.

Kept beside the routes rather than above each handler so that routes.py stays one
screen of HTTP plumbing; each record names the refusals the handler (and what it
calls) really raises, by their vaecast.errors class, and the headers it really sends.
"""

from __future__ import annotations

from vaecast.errors import (
    InvalidRequestError,
    JobStateError,
    NotFoundError,
)
from vaecast.server.contract import models as m
from vaecast.server.contract.shared import (
    CACHE_CONTROL,
    JOB_LOOKUP_ERRORS,
    JSON,
    LAST_EVENT_ID,
    LOCATION,
    SSE,
    UPLOAD_BODY,
    UPLOAD_ERRORS,
    UPLOAD_PARAMS,
    VARIANT,
    VIDEO_ID,
)
from vaecast.server.contract.spec import Header, Param, Reply, operation
from vaecast.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

LIST_DEFAULT = 20
LIST_MAX = 100
TEXT = {"type": "string"}
# One event of an event stream, as OpenAPI 3.2 (`itemSchema`) and Schemathesis read a
# 3.1 stream's schema: its fields, `data` the JSON of a JobEvent (`state`'s, a JobObject).
EVENT_STREAM = {
    "type": "object",
    "required": ["event", "id", "data"],
    "properties": {
        "event": {"enum": m.event_names()},
        "id": {"type": "string", "pattern": "^-?[0-9]+$"},
        "retry": {"type": "integer", "minimum": 0},
        "data": {"type": "string", "contentMediaType": JSON},
    },
    "oneOf": [
        {
            "properties": {
                "event": {"const": "state"},
                "data": {"contentSchema": m.JobObject},
            }
        },
        {
            "properties": {
                "event": {"not": {"const": "state"}},
                "data": {"contentSchema": {"$ref": "#/components/schemas/JobEvent"}},
            }
        },
    ],
}

INDEX = operation(
    "The preview page", tag="server", replies=(Reply(200, "the page", {"text/html": TEXT}),)
)
STATIC_ASSET = operation(
    "A file of the preview page",
    tag="server",
    params=(Param("name", "path", {"type": "string", "maxLength": 200}, "the file", True),),
    replies=(Reply(200, "the file", {"text/javascript": TEXT, "text/css": TEXT}),),
    errors=(NotFoundError,),
)
LIST_VIDEOS = operation(
    "List jobs",
    tag="videos",
    params=(
        Param(
            "limit",
            "query",
            {"type": "integer", "minimum": 1, "maximum": LIST_MAX, "default": LIST_DEFAULT},
            "how many, most recent first",
        ),
    ),
    replies=(Reply(200, "the jobs, most recent first", {JSON: m.JobList}),),
    errors=(InvalidRequestError,),
)
CREATE_VIDEO = operation(
    "Create a job: latents, a demo scene, or a push session",
    tag="videos",
    description="A latent file (raw body or multipart), a demo request, or a push session "
    '(`{"input": "push"}`, answered with its push URL and token). A file holding B videos, '
    "or a push batch (`batch` > 1), makes B jobs: a list.",
    params=UPLOAD_PARAMS,
    body=UPLOAD_BODY,
    replies=(
        Reply(
            201,
            "the job, or the jobs of a batch",
            {JSON: {"anyOf": [m.JobObject, m.JobList]}},
            {"Location": LOCATION},
        ),
    ),
    errors=UPLOAD_ERRORS,
)
GET_VIDEO = operation(
    "A job",
    tag="videos",
    params=(VIDEO_ID,),
    replies=(Reply(200, "the job object", {JSON: m.JobObject}),),
    errors=JOB_LOOKUP_ERRORS,
)
DELETE_VIDEO = operation(
    "Cancel a running job, delete a finished one, or stop one rendition",
    tag="videos",
    description="A cancelled job keeps what it made so far as a playable file at its "
    "`content` (`partial` in the job object) unless `keep=false`; a second DELETE "
    "deletes that file.",
    params=(
        VIDEO_ID,
        Param("variant", "query", VARIANT.schema, "stop only this rendition"),
        Param(
            "keep",
            "query",
            {"type": "string", "enum": ["true", "false"]},
            "a cancel keeps the video made so far (true, the default) or drops it",
        ),
    ),
    replies=(
        Reply(200, "the job, or its deletion", {JSON: {"anyOf": [m.JobObject, m.DeletedVideo]}}),
    ),
    errors=(*JOB_LOOKUP_ERRORS, InvalidRequestError, JobStateError),
)
GET_EVENTS = operation(
    "A job's server-sent events",
    tag="content",
    description="`retry:`, then `state` (the job object), then the job's events as they "
    "happen: each `data:` is one JobEvent, its SSE `event` the payload's `event` field, "
    "its `id` the event's index (Last-Event-ID resumes after it). Comments keep an "
    "idle stream alive.",
    params=(VIDEO_ID, LAST_EVENT_ID),
    replies=(
        Reply(
            200,
            "the stream, until the job ends",
            {SSE: EVENT_STREAM},
            {"Cache-Control": CACHE_CONTROL},
        ),
        Reply(204, "a resume after the job's last event: nothing more will come"),
    ),
    errors=JOB_LOOKUP_ERRORS,
)
HEALTHZ = operation(
    "Liveness and readiness",
    tag="server",
    replies=(
        Reply(200, "alive and taking jobs", {JSON: m.Health}),
        Reply(503, "alive, draining for shutdown: takes no new jobs", {JSON: m.Health}),
    ),
)
METRICS = operation(
    "Prometheus metrics",
    tag="server",
    replies=(
        Reply(
            200,
            "the text exposition format",
            {METRICS_CONTENT_TYPE.split(";")[0]: TEXT},
            {"Content-Type": Header("`" + METRICS_CONTENT_TYPE + "`")},
        ),
    ),
)
