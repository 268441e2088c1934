"""A face is registered, not wired in: the config's list is what an app serves.

A face of the tests' own (`fragments_face/`, one folder) is served by adding one entry
to the config: its route answers over real HTTP, /openapi.json documents it, its hook
saw every rendition made (the log's segments), /healthz shows it, and it starts and
closes with the app. A server without a face has none of its routes, and the core
runs the same without it.
"""

from __future__ import annotations

from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.server import Server, StartServer
from tests.server.fragments_face import FragmentsFace
from vaecast.server.contract.document import openapi_document
from vaecast.server.faces.hls.face import HlsFace
from vaecast.server.faces.progressive.face import ProgressiveFace
from vaecast.server.faces.standard import standard_faces


async def finished_job(server: Server) -> dict:
    body = safetensors_bytes(None, latents=smooth_latents(frames=4))
    async with server.client.post("/v1/videos", data=body) as response:
        assert response.status == 201, await response.text()
        job = await response.json()
    async with server.client.get(job["urls"]["content"]) as response:  # to its end
        assert response.status == 200
        await response.read()
    async with server.client.get(job["urls"]["self"]) as response:
        return await response.json()


async def test_a_face_of_ones_own_is_one_entry_in_the_config(start_server: StartServer) -> None:
    server = await start_server(faces=(*standard_faces(), FragmentsFace()))
    face = server.face("fragments")
    assert face.started
    job = await finished_job(server)
    async with server.client.get(f"/v1/videos/{job['id']}/fragments") as response:
        assert response.status == 200, await response.text()
        fragments = await response.json()
    # Its own view of the core: one entry per fragment, the first a keyframe.
    assert len(fragments) == job["chunks"]["done"] >= 2
    assert fragments[0]["keyframe"] is True
    assert sum(f["duration_s"] for f in fragments) > 0
    # Its hook saw the rendition made, and its listener the init segment and each fragment.
    (counter,) = face.counters
    assert counter.segments == len(fragments) + 1
    assert counter.closed_once
    async with server.client.get("/healthz") as response:
        health = await response.json()
    assert health["fragments"] == {"renditions": 1, "segments": len(fragments) + 1}
    # The document is made from the router: the face's route is in it, as the others.
    paths = openapi_document(server.app)["paths"]
    assert "/v1/videos/{video_id}/fragments" in paths
    async with server.client.get(f"/v1/videos/{job['id']}/fragments?variant=x") as response:
        assert response.status == 422  # the core's refusal, through the face's route
        assert (await response.json())["error"]["type"] == "invalid_request"
    await server.runner.cleanup()
    assert face.closed


async def test_an_app_serves_only_the_faces_its_config_lists(start_server: StartServer) -> None:
    server = await start_server(faces=(ProgressiveFace(),))
    job = await finished_job(server)  # the core and the progressive face, as ever
    for path in ("playlist.m3u8", "master.m3u8", "fragments"):
        async with server.client.get(f"/v1/videos/{job['id']}/{path}") as response:
            assert response.status == 404, path
    async with server.client.post(f"/v1/videos/{job['id']}/whep", data=b"v=0") as response:
        assert response.status in (404, 405)
    paths = openapi_document(server.app)["paths"]
    assert "/v1/videos/{video_id}/content" in paths
    assert not [path for path in paths if path.endswith((".m3u8", "/whep"))]
    async with server.client.get("/healthz") as response:
        assert "webrtc" not in await response.json()  # WHEP's part of it is WHEP's


async def test_the_standard_faces_are_the_default(start_server: StartServer) -> None:
    server = await start_server()
    assert [face.name for face in server.app_faces()] == [
        "progressive",
        "hls",
        "webrtc",
        "stills",
        "webhooks",
    ]
    assert [spec.name for spec in standard_faces()] == [
        "progressive",
        "hls",
        "webrtc",
        "stills",
        "webhooks",
    ]
    server = await start_server(faces=(HlsFace(), ProgressiveFace()))
    assert [face.name for face in server.app_faces()] == ["hls", "progressive"]


def test_vaecast_embed_offers_every_name_it_lists() -> None:
    """The public door a face of one's own (and the benchmarks) use is whole."""
    import vaecast.embed

    assert [name for name in vaecast.embed.__all__ if not hasattr(vaecast.embed, name)] == []
    assert {"Face", "FaceSpec", "Rendition", "Attachment", "operation", "MANAGER"} <= set(
        vaecast.embed.__all__
    )
