"""The OpenAPI document: valid 3.1, one operation per route of the real router, and the
real answers of a real server (over HTTP) are what it says, status and schema."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openapi_spec_validator import OpenAPIV30SpecValidator, OpenAPIV31SpecValidator

from tests.helpers import FailingDecoder, GatedDecoder, safetensors_bytes, smooth_latents
from tests.helpers.contract import Contract, sse_events, validate
from tests.helpers.server import TEST_CONFIG, Server, StartServer
from tests.helpers.whep import WhepViewer
from vaecast.models.linear import LinearDecoder
from vaecast.server.app import create_app, default_app
from vaecast.server.config import Limits
from vaecast.server.contract import openapi_document
from vaecast.server.contract.spec import NOT_A_ROUTE, operation_of
from vaecast.server.contract.swagger_view import swagger_ui_view
from vaecast.server.edge.security_config import SecurityConfig
from vaecast.server.faces.standard import standard_faces
from vaecast.server.faces.whep.settings import WebRtcSettings
from vaecast.version import VERSION

LATENTS = smooth_latents(frames=6, height=6, width=8)
MISSING_ID = "video_" + "0" * 24
VIDEO = "/v1/videos/{video_id}"
KEY = "sk-vaecast-test-0123456789"


def routes_of(app: web.Application) -> set[tuple[str, str]]:
    """Every route, less the handlers that only refuse methods a path lacks."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if operation_of(route.handler) is not NOT_A_ROUTE
    }


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item}


def test_the_document_is_valid_openapi_31_of_this_version() -> None:
    document = openapi_document(default_app())
    OpenAPIV31SpecValidator(document).validate()
    assert document["openapi"] == "3.1.0"
    assert document["info"]["version"] == VERSION
    # The view /docs renders is valid 3.0 (what its Swagger UI reads).
    OpenAPIV30SpecValidator(swagger_ui_view(document)).validate()


@pytest.mark.parametrize(
    "make_app",
    [
        pytest.param(default_app, id="default"),
        pytest.param(
            lambda: create_app(
                replace(TEST_CONFIG, previews=(("gated", "linear"),), default_model="gated"),
                {"gated": GatedDecoder(), "linear": LinearDecoder()},
            ),
            id="preview",
        ),
    ],
)
def test_every_route_is_documented_and_every_documented_route_exists(make_app) -> None:
    app = make_app()
    document = openapi_document(app)
    routes, described = routes_of(app), documented(document)
    assert routes - described == set(), "routes the document lacks"
    assert described - routes == set(), "documented routes the router lacks"
    for method, path in described:
        operation = document["paths"][path][method.lower()]
        assert "500" in operation["responses"] and "421" in operation["responses"]


async def test_real_answers_are_what_the_document_says(start_server: StartServer) -> None:
    gated = GatedDecoder(hold_at=1)
    server = await start_server(
        decoders={
            "gated": gated,
            "failing": FailingDecoder(fail_at=1),
            "failing_at_once": FailingDecoder(fail_at=0),
            "linear": LinearDecoder(),
        },
        default_model="linear",
        limits=Limits(max_upload_bytes=200_000),
    )
    async with server.client.get("/openapi.json") as response:
        document = await response.json()
    assert document == openapi_document(server.app)
    contract = Contract(document)

    async def call(method: str, route: str, url: str, **kwargs: Any) -> tuple[int, Any]:
        async with server.client.request(method, url, **kwargs) as response:
            body = await response.read()
            return response.status, contract.check(method, route, response, body)

    # A job with a preview, held at its final's chunk 1: queued or in progress.
    form = aiohttp.FormData()
    form.add_field("file", safetensors_bytes(latents=LATENTS), filename="z.safetensors")
    form.add_field("model", "gated")
    form.add_field("preview", "linear")
    status, job = await call("POST", "/v1/videos", "/v1/videos", data=form)
    assert status == 201 and job["status"] in ("queued", "in_progress") and "variants" in job
    job_id = job["id"]
    url = f"/v1/videos/{job_id}"
    events = asyncio.create_task(_events(server, contract, url))
    await asyncio.to_thread(gated.holding.wait, 30)
    status, running = await call("GET", VIDEO, url)
    assert running["status"] == "in_progress"
    gated.gate.set()
    names = await events
    assert names[0] == "state" and names[-1] == "done" and "chunk" in names
    assert {"preview_done", "final_done"} <= set(names)
    status, finished = await call("GET", VIDEO, url)
    assert finished["status"] == "completed" and finished["progress"] == 100

    # Its MP4: whole, a range, the ETag, a range past its end; its playlists and media.
    content = f"{VIDEO}/content"
    async with server.client.get(f"{url}/content") as response:
        etag = response.headers["ETag"]
    for headers, expected in (
        ({}, 200),
        ({"Range": "bytes=0-9"}, 206),
        ({"If-None-Match": etag}, 304),
        ({"Range": "bytes=99999999-"}, 416),
    ):
        assert (await call("GET", content, f"{url}/content", headers=headers))[0] == expected
    assert (await call("HEAD", content, f"{url}/content"))[0] == 200
    for route in (
        "/playlist.m3u8",
        "/preview/playlist.m3u8",
        "/master.m3u8",
        "/hls/init.mp4",
        "/hls/part/0.m4s",
        "/preview/hls/part/0.m4s",
        "/hls/segment/0.m4s",
    ):
        concrete = route.replace("{number}", "0")
        template = route.replace("/0.m4s", "/{number}.m4s")
        assert (await call("GET", VIDEO + template, url + concrete))[0] == 200
    async with server.client.get(f"{url}/playlist.m3u8") as response:
        assert response.content_type == "application/vnd.apple.mpegurl"
        assert (await response.text()).startswith("#EXTM3U")
    # Once over, no WHEP: 409; an unknown session: 404.
    offer = {"data": "v=0\r\n", "headers": {"Content-Type": "application/sdp"}}
    assert (await call("POST", f"{VIDEO}/whep", f"{url}/whep", **offer))[0] == 409
    assert (await call("DELETE", f"{VIDEO}/whep/{{session}}", f"{url}/whep/nope"))[0] == 404

    # A job that fails after its first chunk: its object, and its video so far kept.
    body = safetensors_bytes(latents=LATENTS)
    status, failing = await call("POST", "/v1/videos", "/v1/videos?model=failing", data=body)
    failed = await _ended(server, contract, failing["id"])
    assert failed["status"] == "failed" and failed["error"]["type"] == "decode_failed"
    assert failed["partial"] is True
    failed_url = f"/v1/videos/{failing['id']}"
    async with server.client.get(f"{failed_url}/content") as response:
        contract.check("GET", content, response, await response.read())
        assert (response.status, response.headers["X-Video-Partial"]) == (200, "true")
    # One that fails before any: its content refused.
    query = "/v1/videos?model=failing_at_once"
    status, failing = await call("POST", "/v1/videos", query, data=body)
    failed = await _ended(server, contract, failing["id"])
    assert failed["status"] == "failed" and failed["partial"] is False
    assert (await call("GET", content, f"/v1/videos/{failing['id']}/content"))[0] == 409

    # A push session: created with its token, blocks, the end, and its refusals.
    status, session = await call("POST", "/v1/videos", "/v1/videos", json={"input": "push"})
    assert status == 201 and session["input"] == "push"
    push_url, token = session["push"]["url"], session["push"]["token"]
    latents = f"{VIDEO}/latents"
    block = {"data": safetensors_bytes(latents=LATENTS[:, :, :2].contiguous())}
    assert (await call("POST", latents, push_url, **block))[0] == 401
    keyed = {"X-Push-Token": token, "X-Push-Seq": "0"}
    assert (await call("POST", latents, push_url, headers=keyed, **block))[0] == 202
    assert (await call("POST", latents, push_url, headers=keyed, **block))[0] == 202  # a retry
    gap = {**keyed, "X-Push-Seq": "5"}
    assert (await call("POST", latents, push_url, headers=gap, **block))[0] == 409
    end = {**keyed, "X-Push-Seq": "1"}
    assert (await call("POST", latents, f"{push_url}?final=1", headers=end))[0] == 202
    assert (await _ended(server, contract, session["id"]))["status"] == "completed"

    # One request, one MP4 as it is encoded.
    status, _ = await call("POST", "/v1/videos/stream", "/v1/videos/stream", data=body)
    assert status == 200

    # Refusals, each with its JSON type.
    for method, route, concrete, kwargs, expected in (
        ("GET", VIDEO, f"/v1/videos/{MISSING_ID}", {}, 404),
        ("GET", "/v1/videos", "/v1/videos?limit=0", {}, 422),
        ("POST", "/v1/videos", "/v1/videos", {"data": b"{", "headers": _json()}, 400),
        ("POST", "/v1/videos", "/v1/videos", {"data": b"\x00" * 64}, 415),
        ("POST", "/v1/videos", "/v1/videos", {"data": b"\x00" * 300_000}, 413),
        ("POST", "/v1/videos", "/v1/videos", {"json": {"scene": "nope"}}, 422),
        ("DELETE", VIDEO, f"{url}?variant=preview", {}, 409),
        ("DELETE", VIDEO, url, {}, 200),
        ("GET", VIDEO, url, {}, 410),
        ("GET", "/static/{name}", "/static/nope.js", {}, 404),
    ):
        assert (await call(method, route, concrete, **kwargs))[0] == expected, concrete

    # Not the video "stream": any method but POST is a 405 that says so (not documented,
    # as a method a path lacks is not).
    for method in ("GET", "HEAD", "OPTIONS", "DELETE"):
        async with server.client.request(method, "/v1/videos/stream") as response:
            assert (response.status, response.headers["Allow"]) == (405, "POST"), method

    # The server's own routes.
    status, health = await call("GET", "/healthz", "/healthz")
    assert status == 200 and health["version"] == VERSION
    status, listed = await call("GET", "/v1/videos", "/v1/videos?limit=5")
    assert status == 200 and listed["data"]
    for route in ("/metrics", "/", "/docs", "/docs/openapi-3.0.json", "/openapi.json"):
        assert (await call("GET", route, route))[0] == 200
    statuses = {status for _, _, status in contract.checked}
    assert {200, 201, 202, 206, 304, 400, 401, 404, 409, 410, 413, 415, 416, 422} <= statuses


def _json() -> dict[str, str]:
    return {"Content-Type": "application/json"}


async def _ended(server: Server, contract: Contract, job_id: str) -> dict[str, Any]:
    for _ in range(1500):
        async with server.client.get(f"/v1/videos/{job_id}") as response:
            job = contract.check("GET", VIDEO, response, await response.read())
        if job["status"] not in ("queued", "in_progress"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"video {job_id} did not end")


async def _events(server: Server, contract: Contract, url: str) -> list[str]:
    """The event stream from now to the job's end: each event valid against the stream's
    schema, its data against the schema its `contentSchema` names; their names."""
    route = f"{VIDEO}/events"
    async with server.client.get(f"{url}/events") as response:
        contract.check("GET", route, response, b"")
        text = (await response.read()).decode()
    stream_schema = contract.schema("GET", route, 200, "text/event-stream")
    names = []
    for event in sse_events(text):
        validate(event, stream_schema)
        data = json.loads(event["data"])
        validate(data, contract.component("JobObject" if event["event"] == "state" else "JobEvent"))
        assert event["event"] == "state" or data["event"] == event["event"]
        names.append(event["event"])
    return names


async def test_the_edges_refusals_are_what_the_document_says(start_server: StartServer) -> None:
    """The API key's 401, the Host check's 421, the Origin check's 403, and a full
    queue's 429 with its Retry-After; the reference stays open without the key."""
    gated = GatedDecoder(hold_at=1)
    server = await start_server(
        decoders={"linear": gated},
        max_queued_jobs=0,
        security=SecurityConfig(api_key=KEY),
    )
    contract = Contract(openapi_document(server.app))

    async def call(method: str, route: str, **kwargs: Any) -> aiohttp.ClientResponse:
        async with server.client.request(method, route, **kwargs) as response:
            contract.check(method, route, response, await response.read())
            return response

    assert (await call("GET", "/v1/videos")).status == 401
    assert (await call("GET", "/openapi.json")).status == 200
    assert (await call("GET", "/docs")).status == 200
    keyed = {"Authorization": f"Bearer {KEY}"}
    misdirected = {**keyed, "Host": "evil.example"}
    assert (await call("GET", "/healthz", headers=misdirected)).status == 421
    foreign = {**keyed, "Origin": "https://evil.example"}
    body = {"data": safetensors_bytes(latents=LATENTS)}
    assert (await call("POST", "/v1/videos", headers=foreign, **body)).status == 403
    assert (await call("POST", "/v1/videos", headers=keyed, **body)).status == 201
    await asyncio.to_thread(gated.holding.wait, 30)
    busy = await call("POST", "/v1/videos", headers=keyed, **body)
    assert busy.status == 429 and int(busy.headers["Retry-After"]) >= 1
    gated.gate.set()


async def test_the_reference_page_and_its_files_are_served_from_here(
    start_server: StartServer,
) -> None:
    server = await start_server()
    async with server.client.get("/docs") as response:
        page = await response.text()
        policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "http" not in page  # every file is this server's, by a relative URL
    names = re.findall(r'(?:src|href)="docs/assets/([^"]+)"', page)
    assert {"swagger-ui-bundle.js", "swagger-ui.css", "vaecast-docs.js"} <= set(names)
    for name in names:
        async with server.client.get(f"/docs/assets/{name}") as response:
            assert response.status == 200, name
            assert len(await response.read()) > 100
    async with server.client.get("/docs/assets/index.html") as response:
        assert response.status == 404
        assert (await response.json())["error"]["type"] == "not_found"
    async with server.client.get("/docs/openapi-3.0.json") as response:
        view = await response.json()
    assert view["openapi"].startswith("3.0") and view["paths"].keys() == (
        openapi_document(server.app)["paths"].keys()
    )


async def test_whep_answers_are_what_the_document_says(start_server: StartServer) -> None:
    """A live push session watched over WHEP by a real aiortc peer: the SDP answer with its
    Location, the viewer limit's 429, the session's DELETE and its second 404."""
    server = await start_server(
        faces=standard_faces(webrtc=replace(WebRtcSettings(), max_viewers=1))
    )
    contract = Contract(openapi_document(server.app))
    async with server.client.post("/v1/videos", json={"input": "push"}) as response:
        session = await response.json()
    whep = f"/v1/videos/{session['id']}/whep"
    viewer, response, answer = await WhepViewer.connect(server.client, whep, audio=False)
    try:
        contract.check("POST", f"{VIDEO}/whep", response, answer.encode())
        assert response.status == 201 and response.content_type == "application/sdp"
        assert answer.startswith("v=0") and viewer.location.startswith(f"{whep}/")
        other, busy, body = await WhepViewer.connect(server.client, whep, audio=False)
        await other.close()
        contract.check("POST", f"{VIDEO}/whep", busy, body.encode())
        assert busy.status == 429
    finally:
        await viewer.pc.close()
    for expected in (200, 404):
        async with server.client.delete(viewer.location) as response:
            contract.check("DELETE", f"{VIDEO}/whep/{{session}}", response, await response.read())
            assert response.status == expected


async def test_every_link_from_a_created_video_finds_it(start_server: StartServer) -> None:
    """The document links a created video (`POST /v1/videos`' 201) to what every video
    has, with its id from the answer: each of those routes finds a video made without a
    preview (a 404 there is a broken link). The routes only some videos have (a
    preview's, a push session's blocks) are not linked."""
    server = await start_server()
    document = openapi_document(server.app)
    links = document["paths"]["/v1/videos"]["post"]["responses"]["201"]["links"]
    operations = {
        operation["operationId"]: (method.upper(), path)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    }
    assert {"get_get_video", "get_get_content", "get_get_events", "post_post_whep"} <= set(links)
    linked = [operations[link["operationId"]] for link in links.values()]
    of_some = ("/preview/", "/live/")
    assert not [p for _, p in linked if any(s in p for s in of_some) or p.endswith("/latents")]
    async with server.client.post("/v1/videos", data=safetensors_bytes(latents=LATENTS)) as r:
        video = await r.json()
    await asyncio.wait_for(server.manager.get(video["id"]).wait(), 30)
    for method, path in linked:
        if method != "DELETE":
            url = path.replace("{video_id}", video["id"])
            async with server.client.request(method, url) as response:
                assert response.status != 404, (method, url, await response.text())
