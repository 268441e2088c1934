"""The OpenAPI 3.1 document of an app, made from its router and its handlers' operations.

`openapi_document(app)` walks `app.router`: every route is documented by the
`Operation` its handler carries (vaecast.server.contract.spec), and a route without
one is an error, so the document cannot lack a route nor list one the app lacks.
HEAD routes (aiohttp adds one per GET) are their GET without bodies. The edge's
refusals are added from the route itself: 400 everywhere (the HTTP parser), 421
everywhere (the Host check), 401 where the API key applies
(vaecast.server.edge.security decides which routes), 403 on state-changing methods
(the Origin check), 500 everywhere. Pure: no I/O.
Routes marked `not_a_route` (a handler that only refuses the methods a path lacks)
are left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import msgspec
from aiohttp import web

from vaecast.errors import (
    ForbiddenError,
    MalformedRequestError,
    MisdirectedRequestError,
    StoreUnavailableError,
    UnauthorizedError,
)
from vaecast.server.contract import models as m
from vaecast.server.contract.models import ErrorBody, JobEvent
from vaecast.server.contract.spec import (
    NOT_A_ROUTE,
    ErrorType,
    Header,
    Operation,
    Reply,
    Schema,
    operation_of,
    refusal_of,
)
from vaecast.server.edge.security import (
    API_KEY_COOKIE,
    STATE_CHANGING,
    is_open_resource,
)
from vaecast.version import VERSION

OPENAPI_VERSION = "3.1.0"
REF = "#/components/schemas/{name}"
INTERNAL = ErrorType(500, "internal_error")
# Headers that an error of a status carries, whichever operation answers it.
ERROR_HEADERS = {
    401: {"WWW-Authenticate": Header("`Bearer`: the scheme the API key is sent in", required=True)},
    405: {"Allow": Header("the methods the route takes", required=True)},
    416: {"Content-Range": Header("`bytes */N`: the finished file's length")},
    429: {
        "Retry-After": Header(
            "seconds to wait before trying again",
            {"type": "string", "pattern": "^[0-9]+$"},
            required=True,
        )
    },
}
TAGS = (
    ("videos", "Jobs: create, list, read, cancel, delete"),
    ("content", "A job's MP4 and events, progressive while it decodes"),
    ("push", "Push sessions: latents (or frames) in while a generator makes them"),
    ("hls", "LL-HLS playlists and media, the segment log's own bytes"),
    ("webrtc", "WHEP playback of a running job"),
    ("server", "The page, health, metrics, and this document"),
)
SECURITY_SCHEMES = {
    "apiKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "`vaecast serve --api-key KEY` (or VAECAST_API_KEY): every route "
        "but the page, /static, /healthz, /metrics, /openapi.json and /docs then needs "
        "`Authorization: Bearer KEY` (401 otherwise). A server without a key needs none.",
    },
    "apiKeyCookie": {
        "type": "apiKey",
        "in": "cookie",
        "name": API_KEY_COOKIE,
        "description": "The same key, URL-encoded, as the preview page sets it "
        "(SameSite=Strict) for EventSource and <video>, which cannot send headers; "
        "it counts only without a foreign Origin.",
    },
    "pushToken": {
        "type": "apiKey",
        "in": "header",
        "name": "X-Push-Token",
        "description": "A push session's secret, answered once by the POST that created it "
        "(401 without it, 403 for another session's).",
    },
}


class MissingOperation(LookupError):
    """A route whose handler says nothing of what it serves."""


class _Schemas:
    """Struct types met while building, made into components at the end."""

    def __init__(self) -> None:
        self.types: dict[str, type] = {}

    def of(self, schema: Schema) -> dict[str, Any]:
        """The schema with each Struct type in it (at any depth) a `$ref` to its component."""
        return self._walk(schema)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, type):
            self.types[value.__name__] = value
            return {"$ref": REF.format(name=value.__name__)}
        if isinstance(value, Mapping):
            return {key: self._walk(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(item) for item in value]
        return value

    def components(self) -> dict[str, Any]:
        """The components met, and the job events (each `data:` of an event stream)."""
        types = [self.types[name] for name in sorted(self.types)]
        schemas, components = msgspec.json.schema_components([*types, JobEvent], ref_template=REF)
        return {**components, "JobEvent": schemas[-1]}


def openapi_document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`'s routes; MissingOperation for an undocumented one."""
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = defaultdict(dict)
    ids: dict[str, int] = defaultdict(int)
    routes = list(app.router.routes())
    for route in routes:
        name = getattr(route.handler, "__name__", "handler")
        ids[f"{route.method}_{name}"] += 1
    for route in routes:
        resource = route.resource
        assert resource is not None
        path = resource.canonical
        spec = operation_of(route.handler)
        if spec is NOT_A_ROUTE:
            continue
        if spec is None:
            raise MissingOperation(
                f"{route.method} {path}: its handler has no @operation (vaecast.server.contract)"
            )
        name = getattr(route.handler, "__name__", "handler")
        operation_id = f"{route.method.lower()}_{name}"
        if ids[f"{route.method}_{name}"] > 1:  # one closure for several paths (HLS renditions)
            operation_id = f"{route.method.lower()}_{_slug(path)}"
        paths[path][route.method.lower()] = _operation(
            spec, route.method, path, operation_id, schemas
        )
    _link_created_video(paths)
    webhooks = _webhooks(schemas)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "vaecast",
            "version": VERSION,
            "summary": "A video VAE's chunked decode, streamed as it decodes",
            "description": "Jobs decode latents to H.264 chunk by chunk; every viewer gets "
            "each fragment the moment it exists: progressive fragmented MP4, LL-HLS, WHEP. "
            'Errors are JSON: `{"error": {"type", "message"}}`.',
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "servers": [{"url": "/", "description": "this server"}],
        "tags": [{"name": name, "description": text} for name, text in TAGS],
        "paths": dict(sorted(paths.items())),
        "webhooks": webhooks,
        "components": {
            "schemas": schemas.components(),
            "securitySchemes": SECURITY_SCHEMES,
        },
    }


WEBHOOK_EVENTS = {
    "video.started": "a job's decode began",
    "video.completed": "a job's video is whole",
    "video.failed": "a job failed (`data.error` says why; `data.partial`: its video so far kept)",
    "video.cancelled": "a job was cancelled (`data.partial`: its video so far kept)",
}
_WEBHOOK_HEADERS = (
    ("webhook-id", "the message's id: the same for every try, before and after a restart"),
    ("webhook-timestamp", "Unix time of this try, seconds"),
    ("webhook-signature", "`v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`"),
)


def _webhooks(schemas: _Schemas) -> dict[str, Any]:
    """What a server with `--webhook-secret` POSTs to a job's `webhook_url` (Standard
    Webhooks): one entry per message type."""
    body = {"application/json": {"schema": schemas.of(m.WebhookMessage)}}
    parameters = [
        {"name": name, "in": "header", "required": True, "description": text,
         "schema": {"type": "string"}}
        for name, text in _WEBHOOK_HEADERS
    ]  # fmt: skip
    return {
        name: {
            "post": {
                "summary": summary,
                "description": "Signed with the server's --webhook-secret; tried until a "
                "2xx, six times at most (1, 5, 25, 125, 300 s apart).",
                "operationId": f"webhook_{name.replace('.', '_')}",
                "parameters": parameters,
                "requestBody": {"required": True, "content": body},
                "responses": {"2XX": {"description": "taken; any other answer is tried again"}},
            }
        }
        for name, summary in WEBHOOK_EVENTS.items()
    }


VIDEO_PATH = "/v1/videos/{video_id}"
VIDEO_ID_FROM_ANSWER = "$response.body#/id"
# Routes only some videos have: a preview's and a live rendition's (a video made with
# a preview) and a push session's blocks (a video created with `input: push`); 404
# for the others.
OF_SOME_VIDEOS = ("/preview/", "/live/", "/latents")


def _link_created_video(paths: dict[str, dict[str, Any]]) -> None:
    """OpenAPI links from a created video (`POST /v1/videos`' 201) to what every video
    has: each operation on its path or below it that needs no other path parameter, but
    those of OF_SOME_VIDEOS."""
    created = paths.get("/v1/videos", {}).get("post", {}).get("responses", {}).get("201")
    if created is None:
        return
    links = {}
    for path, methods in sorted(paths.items()):
        if not (path == VIDEO_PATH or path.startswith(VIDEO_PATH + "/")):
            continue
        if any(part in path for part in OF_SOME_VIDEOS) or path.count("{") > 1:
            continue
        for operation in methods.values():
            operation_id = operation["operationId"]
            links[operation_id] = {
                "operationId": operation_id,
                "parameters": {"path.video_id": VIDEO_ID_FROM_ANSWER},
            }
    created["links"] = links


def _operation(
    spec: Operation, method: str, path: str, operation_id: str, schemas: _Schemas
) -> dict[str, Any]:
    head = method == "HEAD"
    keyed = not is_open_resource(path)
    # 400 everywhere too: the HTTP parser refuses a head it cannot read (a header over
    # 8190 bytes) before any route (vaecast.server.edge.parser_errors answers it).
    refusals = [*spec.errors, refusal_of(MalformedRequestError)]
    refusals += [refusal_of(MisdirectedRequestError), INTERNAL]
    if path.startswith("/v1/"):  # every API answer waits for the store (vaecast.store.store)
        refusals.append(refusal_of(StoreUnavailableError))
    if keyed:
        refusals.append(refusal_of(UnauthorizedError))
    if method in STATE_CHANGING:
        refusals.append(refusal_of(ForbiddenError))
    responses: dict[str, Any] = {}
    for reply in spec.replies:
        responses[str(reply.status)] = _reply(reply, head, schemas)
    for status, types in sorted(_by_status(refusals).items()):
        responses.setdefault(str(status), _error_reply(status, types, head, schemas))
    result: dict[str, Any] = {
        "operationId": operation_id,
        "summary": spec.summary + (" (headers only)" if head else ""),
        "tags": [spec.tag],
        "responses": dict(sorted(responses.items())),
    }
    if spec.description:
        result["description"] = spec.description
    if spec.params:
        result["parameters"] = [
            {
                "name": param.name,
                "in": param.where,
                "required": param.required or param.where == "path",
                "description": param.description,
                "schema": schemas.of(param.schema),
            }
            for param in spec.params
        ]
    if spec.body is not None and not head:
        result["requestBody"] = {
            "required": spec.body_required,
            "content": {media: {"schema": schemas.of(s)} for media, s in spec.body.items()},
        }
    result["security"] = _security(keyed, spec.extra_security)
    return result


def _security(keyed: bool, extra: tuple[str, ...]) -> list[dict[str, list[str]]]:
    """The alternatives: the key (a header or the page's cookie) when the server has one,
    or nothing when it has none; a push token on top where the operation needs one."""
    needs = {name: [] for name in extra}
    if not keyed:
        return [needs] if needs else []
    return [{"apiKey": [], **needs}, {"apiKeyCookie": [], **needs}, needs]


def _reply(reply: Reply, head: bool, schemas: _Schemas) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": reply.description}
    if reply.headers:
        answer["headers"] = _headers(reply.headers)
    if reply.content and not head:
        answer["content"] = {
            media: {"schema": schemas.of(schema)} for media, schema in reply.content.items()
        }
    return answer


def _error_reply(status: int, types: list[str], head: bool, schemas: _Schemas) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": f"{HTTPStatus(status).phrase}: {', '.join(types)}"}
    if status in ERROR_HEADERS:
        answer["headers"] = _headers(ERROR_HEADERS[status])
    if not head:
        narrowed = {
            "type": "object",
            "properties": {"error": {"type": "object", "properties": {"type": {"enum": types}}}},
        }
        schema = {"allOf": [schemas.of(ErrorBody), narrowed]}
        answer["content"] = {"application/json": {"schema": schema}}
    return answer


def _by_status(refusals: list[Any]) -> dict[int, list[str]]:
    grouped: dict[int, list[str]] = defaultdict(list)
    for refusal in map(refusal_of, refusals):
        if refusal.type not in grouped[refusal.status]:
            grouped[refusal.status].append(refusal.type)
    return {status: sorted(types) for status, types in grouped.items()}


def _headers(headers: Mapping[str, Header]) -> dict[str, Any]:
    return {
        name: {
            "description": header.description,
            "schema": dict(header.schema),
            **({"required": True} if header.required else {}),
        }
        for name, header in headers.items()
    }


def _slug(path: str) -> str:
    kept = "".join(c if c.isalnum() else "_" for c in path.strip("/"))
    return "_".join(part for part in kept.split("_") if part)
