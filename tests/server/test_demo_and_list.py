"""Demo requests (a scene rendered and encoded here) and the job list."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import decode_mp4, psnr
from tests.helpers.server import StartServer
from vaecast.demo.scenes import render_scene
from vaecast.models.linear import LinearDecoder
from vaecast.models.tiny import TinyDecoder
from vaecast.server.config import Limits
from vaecast.server.intake import uploads

SMALL_DEMO = {"scene": "shapes", "frames": 5, "width": 64, "height": 48, "fps": 8}


def with_tiny() -> dict:
    """Demo latents are tiny's; the default model stays `linear`, as in the other tests."""
    return {"linear": LinearDecoder(), "tiny": TinyDecoder()}


async def test_a_demo_request_streams_the_rendered_scene(start_server: StartServer):
    server = await start_server(decoders=with_tiny())
    async with server.client.post("/v1/videos", json=SMALL_DEMO) as response:
        assert response.status == 201
        job = await response.json()
    assert (job["frames"], job["width"], job["height"], job["fps"]) == (5, 64, 48, 8.0)
    assert job["model"] == "tiny"
    async with server.client.get(job["urls"]["content"]) as response:
        frames = decode_mp4(await response.read())
    assert len(frames) == 5
    assert frames[0].shape == (48, 64, 3)
    # Decoded with the model whose latent space the demo is in, it looks like the scene
    # (with the default `linear` decoder it was noise, ~7 dB).
    scene = render_scene("shapes", 5, 48, 64)[0].permute(1, 2, 3, 0).numpy()
    rendered = np.round(scene.clip(0, 1) * 255).astype(np.uint8)
    assert psnr(np.stack(frames), rendered) > 20


async def test_bad_demo_requests_say_what_is_wrong(start_server: StartServer):
    server = await start_server(limits=Limits(max_frames=9))
    cases = [
        (
            {"scene": "moon"},
            422,
            "unknown scene 'moon'; known scenes: showcase, shapes, "
            "gradient, texture, text, landscape, fade, noise",
        ),
        ({**SMALL_DEMO, "frames": 6}, 422, "frames must be 1 + 4k (1, 5, 9, ..., 81), got 6"),
        (
            {**SMALL_DEMO, "width": 60},
            422,
            "width and height must be positive multiples of 8, got 60x48",
        ),
        ({**SMALL_DEMO, "frames": "5"}, 422, "frames must be an integer, got '5'"),
        (
            {**SMALL_DEMO, "colour": "red"},
            422,
            "unknown field(s) colour; a demo request takes: "
            "fps, frames, height, live, model, preview, scene, seed, sound, webhook_url, width",
        ),
        (
            {**SMALL_DEMO, "frames": 13},
            413,
            "13 frames of 64x48 is over this server's limits (9 frames, 2088960 pixels per frame)",
        ),
        ([1, 2], 422, "a demo request is a JSON object"),
        *(
            (
                body,
                422,
                'a demo request names its scene: "scene" (one of showcase, shapes, gradient, '
                "texture, text, landscape, fade, noise); frames, width, height, seed, fps, "
                'model, sound, live, preview and webhook_url are optional; {"input": "push"} '
                "starts a push session instead",
            )
            for body in ({}, {"frames": 5, "width": 64, "height": 48})
        ),
        ({**SMALL_DEMO, "sound": "yes"}, 422, "sound must be true or false, got 'yes'"),
    ]
    for body, status, message in cases:
        async with server.client.post("/v1/videos", json=body) as response:
            assert response.status == status, body
            assert (await response.json())["error"]["message"] == message
    assert server.manager.jobs == {}  # not one was rendered
    async with server.client.post(
        "/v1/videos", data=b"{nope", headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400
        assert (await response.json())["error"]["message"].startswith(
            "the JSON body cannot be parsed: "
        )


async def test_the_job_list_is_newest_first(start_server: StartServer):
    server = await start_server(decoders=with_tiny())
    ids = []
    for _ in range(3):
        async with server.client.post("/v1/videos", json={**SMALL_DEMO, "frames": 1}) as r:
            ids.append((await r.json())["id"])
    async with server.client.get("/v1/videos?limit=2") as response:
        listing = await response.json()
    assert listing["object"] == "list"
    assert [job["id"] for job in listing["data"]] == ids[::-1][:2]
    async with server.client.get("/v1/videos?limit=0") as response:
        assert response.status == 422


async def test_a_demo_is_heard_where_it_is_seen(start_server: StartServer):
    """The scene's first bounce click lands within one frame of the bounce."""
    import io

    import av
    import numpy as np

    from vaecast.demo.scenes import scene_motions

    demo = {"scene": "shapes", "frames": 33, "width": 128, "height": 96, "fps": 16, "seed": 3}
    server = await start_server(decoders=with_tiny())
    async with server.client.post("/v1/videos/stream", json=demo) as response:
        assert response.headers["Content-Type"].endswith(', mp4a.40.2"')
        data = await response.read()
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    audio = np.concatenate([f.to_ndarray()[0] for f in frames])
    rate = frames[0].sample_rate
    loud = np.abs(audio) > 0.3  # clicks; the tone stays below this
    first_click_frame = np.flatnonzero(loud)[0] / rate * 16
    motions = scene_motions("shapes", 33, 96, 128, seed=3)
    first_hit = min(hit for motion in motions for hit in motion.wall_hits(33))
    assert abs(first_click_frame - first_hit) < 1.0


async def test_a_demo_naming_what_is_not_served_is_404_before_it_is_rendered(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
):
    """A demo's render and encode take seconds (up to 31 s at 81 frames of 832x480):
    what it names is checked first."""
    rendered: list[object] = []

    def render(*args: object) -> None:
        rendered.append(args)
        raise AssertionError("rendered a demo that names what is not served")

    monkeypatch.setattr(uploads, "scene_latents", render)
    server = await start_server(decoders=with_tiny())
    cases = [
        ({**SMALL_DEMO, "model": "nosuch"}, "model 'nosuch' is not served here"),
        ({**SMALL_DEMO, "preview": "nosuch"}, "preview decoder 'nosuch' is not served here"),
        ({**SMALL_DEMO, "live": True, "model": "nosuch"}, "model 'nosuch' is not served here"),
    ]
    for body, says in cases:
        async with server.client.post("/v1/videos", json=body) as response:
            assert response.status == 404, body
            error = (await response.json())["error"]
        assert error["type"] == "model_not_found" and error["message"].startswith(says), error
    assert rendered == []
