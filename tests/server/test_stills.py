"""A job's thumbnail and spritesheet (`?variant=thumbnail|spritesheet` of its /content):
real images from its first fragment on, growing with it, final and cached once it is
complete, the same after a restart."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.helpers import smooth_latents, until
from tests.helpers.server import Server, StartServer
from tests.server.test_partial import cancelled_halfway
from tests.server.test_push import create_session, push
from tests.server.test_store import stored_server
from vaecast.server.faces.progressive.face import ProgressiveFace
from vaecast.server.faces.stills import routes

FPS = 8
LATENTS = smooth_latents(frames=9)  # linear: 1 + 4 * 8 = 33 frames, 48x64
WIDTH, HEIGHT = 64, 48


async def still(server: Server, job: dict[str, Any], variant: str, **query: str) -> Any:
    """(status, body, headers) of one of the job's stills."""
    url = job["urls"][variant]
    headers = {"If-None-Match": query.pop("etag")} if "etag" in query else {}
    async with server.client.get(url, params=query, headers=headers) as response:
        return response.status, await response.read(), response.headers


def image(body: bytes) -> Image.Image:
    return Image.open(io.BytesIO(body))


def layout(headers: Any) -> dict[str, str]:
    return dict(part.split("=") for part in headers["X-Spritesheet"].split("; "))


async def pushed(server: Server, session: dict[str, Any], latent_frames: slice, frames: int):
    status, _ = await push(server, session, LATENTS[:, :, latent_frames])
    assert status == 202
    job = server.manager.get(session["id"])
    await until(lambda: job.record.frames_done == frames)


async def test_stills_grow_with_the_job_and_come_back_the_same_after_a_restart(tmp_path: Path):
    store = tmp_path / "store"
    async with stored_server(store) as server:
        session = await create_session(server, fps=FPS)
        assert session["urls"]["thumbnail"].endswith("/content?variant=thumbnail")
        # Asked for before the first fragment: answered once it exists.
        early = asyncio.create_task(still(server, session, "thumbnail"))
        await pushed(server, session, slice(0, 2), 5)  # 1 + 4 frames
        status, _, headers = await early  # of the first fragment's frame
        assert (status, headers["Content-Type"]) == (200, "image/webp")
        assert headers["X-Still-Frame"] == "0"
        status, body, headers = await still(server, session, "thumbnail")  # of 5 frames
        assert (status, headers["X-Still-Frame"]) == (200, "2")
        assert headers["Cache-Control"] == "no-cache"
        assert image(body).format == "WEBP" and image(body).size == (WIDTH, HEIGHT)
        running_etag = headers["ETag"]
        status, _, again = await still(server, session, "thumbnail", etag=running_etag)
        assert (status, again["ETag"]) == (304, running_etag)

        status, body, headers = await still(server, session, "spritesheet")
        assert (status, headers["Content-Type"]) == (200, "image/jpeg")
        grid = layout(headers)
        assert (grid["columns"], grid["rows"], grid["covered"]) == ("4", "2", "5")
        assert image(body).format == "JPEG" and image(body).size == (4 * WIDTH, 2 * HEIGHT)

        await pushed(server, session, slice(2, 5), 17)  # the spritesheet grows
        status, body, headers = await still(server, session, "spritesheet")
        grid = layout(headers)
        assert (grid["rows"], grid["covered"]) == ("4", "17")
        assert image(body).size == (4 * WIDTH, 4 * HEIGHT)
        status, _, headers = await still(server, session, "thumbnail", etag=running_etag)
        assert (status, headers["X-Still-Frame"]) == (200, "8")  # a new image, a new tag

        status, _ = await push(server, session, LATENTS[:, :, 5:], final=True)
        assert status == 202
        job = server.manager.get(session["id"])
        await until(lambda: job.final.log.complete)
        finals = {}
        for variant, query in (("thumbnail", {}), ("thumbnail", {"format": "jpeg"})):
            status, body, headers = await still(server, session, variant, **query)
            assert (status, headers["X-Still-Frame"]) == (200, "16")  # 33 frames
            assert headers["Cache-Control"] == "private, max-age=3600"
            finals[variant, query.get("format")] = (body, headers["ETag"])
        assert image(finals["thumbnail", "jpeg"][0]).format == "JPEG"
        status, body, headers = await still(server, session, "spritesheet")
        assert layout(headers)["covered"] == "33" and image(body).size == (4 * WIDTH, 4 * HEIGHT)
        finals["spritesheet", None] = (body, headers["ETag"])

    async with stored_server(store) as server:  # restored from the store: the same stills
        for (variant, image_format), (body, etag) in finals.items():
            query = {} if image_format is None else {"format": image_format}
            status, again, headers = await still(server, session, variant, **query)
            assert (status, headers["ETag"], again == body) == (200, etag, True)
            status, _, _ = await still(server, session, variant, etag=etag, **query)
            assert status == 304


async def test_a_still_is_made_once_per_fragment_however_many_ask(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
):
    made = []
    make = routes._make
    monkeypatch.setattr(routes, "_make", lambda *args: made.append(args[0]) or make(*args))
    server = await start_server()
    session = await create_session(server, fps=FPS)
    await pushed(server, session, slice(0, 3), 9)
    answers = await asyncio.gather(*(still(server, session, "thumbnail") for _ in range(8)))
    assert {(status, headers["ETag"]) for status, _, headers in answers} == {
        (200, answers[0][2]["ETag"])
    }
    assert made == ["thumbnail.webp"]
    await still(server, session, "thumbnail", format="jpeg")
    await still(server, session, "thumbnail")
    assert made == ["thumbnail.webp", "thumbnail.jpeg"]


async def test_a_partial_has_stills_and_a_broken_job_none(start_server: StartServer):
    server = await start_server()
    cancelled = await cancelled_halfway(server)  # 17 frames kept
    status, body, headers = await still(server, cancelled, "thumbnail")
    assert (status, headers["X-Video-Partial"], headers["X-Still-Frame"]) == (200, "true", "8")
    assert image(body).size == (WIDTH, HEIGHT)

    dropped = await cancelled_halfway(server, "?keep=false")
    status, body, _ = await still(server, dropped, "spritesheet")
    assert status == 409 and b"cancelled" in body

    session = await create_session(server, fps=FPS)  # waiting for a first fragment...
    waiting = asyncio.create_task(still(server, session, "thumbnail"))
    await asyncio.sleep(0.2)
    async with server.client.delete(session["urls"]["self"]):
        pass
    status, body, _ = await waiting  # ...that never comes
    assert status == 409 and b"cancelled" in body


@pytest.mark.parametrize(
    "variant,query,message",
    [
        ("thumbnail", {"format": "png"}, "format must be one of webp, jpeg"),
        ("thumbnail", {"format": "x" * 2_000}, "format must be one of"),
        ("spritesheet", {"format": "webp"}, "a spritesheet is a JPEG"),
    ],
)
async def test_bad_still_requests_are_refused(
    start_server: StartServer, variant: str, query: dict[str, str], message: str
):
    server = await start_server()
    session = await create_session(server, fps=FPS)
    await pushed(server, session, slice(0, 1), 1)
    status, body, _ = await still(server, session, variant, **query)
    assert status == 422 and message in body.decode()
    assert len(body) < 400


async def test_a_query_too_long_for_the_server_is_refused_first(start_server: StartServer):
    server = await start_server()
    session = await create_session(server, fps=FPS)
    status, body, _ = await still(server, session, "thumbnail", format="x" * 10_000)
    assert status == 400 and len(body) < 400


async def test_without_the_stills_face_a_still_is_no_variant(start_server: StartServer):
    server = await start_server(faces=(ProgressiveFace(),))
    session = await create_session(server, fps=FPS)
    await pushed(server, session, slice(0, 1), 1)
    status, body, _ = await still(server, session, "thumbnail")
    assert status == 422 and b"thumbnail" in body  # as any variant no face serves
