"""Webhooks: each job's start and end POSTed to a real receiver on 127.0.0.1, signed in
the Standard Webhooks format (verified here with the `standardwebhooks` library),
retried, ordered, bounded, refused where they could reach inside, and owed across a
restart."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from tests.helpers import FailingDecoder, safetensors_bytes, smooth_latents, until
from tests.helpers.contract import Contract, validate
from tests.helpers.server import Server, StartServer
from tests.helpers.webhook_receiver import SECRET, Receiver, receiving
from tests.server.test_partial import cancelled_halfway
from tests.server.test_store import stored_server
from vaecast.client import AsyncClient, Client
from vaecast.server.config import WebhookSettings
from vaecast.server.contract import openapi_document
from vaecast.server.faces.webhooks.sender import CheckedResolver

LATENTS = smooth_latents(frames=4)  # linear: 13 frames
QUICK = WebhookSettings(secret=SECRET, allow_private=True, first_retry_s=0.05, timeout_s=5.0)


async def upload(server: Server, **query: str) -> tuple[int, dict]:
    body = safetensors_bytes(latents=LATENTS)
    async with server.client.post("/v1/videos", data=body, params=query) as response:
        return response.status, await response.json()


def verified(receiver: Receiver, kind: str) -> list[dict]:
    """Every `kind` message received, each verified as a Standard Webhooks receiver does."""
    return [Webhook(SECRET).verify(r.body, r.headers) for r in receiver.of(kind)]


async def test_a_jobs_start_and_end_are_signed_job_objects(start_server: StartServer):
    with receiving() as receiver:
        server = await start_server(webhooks=QUICK)
        status, job = await upload(server, webhook_url=receiver.url)
        assert (status, job["webhook_url"]) == (201, receiver.url)
        await until(lambda: len(receiver.received) == 2)
        assert receiver.types() == ["video.started", "video.completed"]
        [started], [completed] = (
            verified(receiver, "video.started"),
            verified(receiver, "video.completed"),
        )
        assert started["data"]["id"] == completed["data"]["id"] == job["id"]
        assert completed["data"]["status"] == "completed" and completed["data"]["frames"] == 13
        assert completed["data"]["urls"]["content"] == f"/v1/videos/{job['id']}/content"
        headers = receiver.of("video.completed")[0].headers
        assert headers["webhook-id"] == f"msg_{job['id']}_completed"
        assert headers["Content-Type"] == "application/json"
        # A tampered body fails verification: the signature covers it.
        tampered = receiver.of("video.completed")[0].body.replace(b"completed", b"failed", 1)
        with pytest.raises(Exception, match="signature"):
            Webhook(SECRET).verify(tampered, headers)
        # Received is not yet answered: the tally counts once the answer is in.
        await until(lambda: server.face("webhooks").health()["delivered"] == 2)
        async with server.client.get("/healthz") as response:
            health = (await response.json())["webhooks"]
        assert (health["delivered"], health["given_up"], health["pending"]) == (2, 0, 0)
        # As the OpenAPI document states them: its `webhooks`, and /healthz.
        contract = Contract(openapi_document(server.app))
        message = contract.document["webhooks"]["video.completed"]["post"]["requestBody"]
        for body in (started, completed):
            validate(body, contract.rooted(message["content"]["application/json"]["schema"]))
        async with server.client.get("/healthz") as response:
            contract.check("GET", "/healthz", response, await response.read())


async def test_a_receiver_that_fails_twice_gets_the_third_try(start_server: StartServer):
    with receiving(lambda kind, tries: 500 if tries <= 2 else 200) as receiver:
        server = await start_server(webhooks=QUICK)
        _, job = await upload(server, webhook_url=receiver.url)
        await until(lambda: [r.status for r in receiver.of("video.completed")] == [500, 500, 200])
        starts = receiver.of("video.started")
        assert [r.status for r in starts] == [500, 500, 200]
        assert {r.headers["webhook-id"] for r in starts} == {f"msg_{job['id']}_started"}
        # In order: the end waited for the start to be taken.
        assert receiver.types() == ["video.started"] * 3 + ["video.completed"] * 3
        await until(lambda: server.face("webhooks").health()["delivered"] == 2)
        async with server.client.get("/healthz") as response:
            health = (await response.json())["webhooks"]
        assert (health["delivered"], health["failed_tries"]) == (2, 4)


async def test_tries_are_bounded_and_a_slow_receiver_holds_back_nothing(
    start_server: StartServer,
):
    settings = replace(QUICK, attempts=2, timeout_s=0.3)
    with receiving(delay_s=3.0) as receiver:
        server = await start_server(webhooks=settings)
        _, job = await upload(server, webhook_url=receiver.url)
        async with server.client.get(f"/v1/videos/{job['id']}/content") as response:
            assert response.status == 200 and len(await response.read()) > 0  # not held
        await until(lambda: len(receiver.of("video.completed")) == 2, timeout_s=30)
        await until(lambda: server.face("webhooks").health()["given_up"] == 2, timeout_s=30)
        assert server.face("webhooks").health()["failed_tries"] == 4


async def test_a_cancelled_job_and_the_servers_default_url(start_server: StartServer):
    with receiving() as receiver:
        server = await start_server(webhooks=replace(QUICK, default_url=receiver.url))
        cancelled = await cancelled_halfway(server)  # a push session, no webhook_url of its own
        await until(lambda: len(receiver.of("video.cancelled")) == 1)
        [end] = verified(receiver, "video.cancelled")
        assert (end["data"]["id"], end["data"]["partial"]) == (cancelled["id"], True)
        assert end["data"]["webhook_url"] == receiver.url  # the default, kept as its own


async def test_a_failed_job_is_sent_as_failed(start_server: StartServer):
    decoder = FailingDecoder(fail_at=1)
    with receiving() as receiver:
        server = await start_server(decoders={"linear": decoder}, webhooks=QUICK)
        _, job = await upload(server, webhook_url=receiver.url)
        await until(lambda: len(receiver.of("video.failed")) == 1)
        [end] = verified(receiver, "video.failed")
        assert (end["data"]["id"], end["data"]["status"]) == (job["id"], "failed")
        assert receiver.types() == ["video.started", "video.failed"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://[::1]:9/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://10.1.2.3/hook",
        "http://[::ffff:192.168.0.1]/hook",
        "http://0.0.0.0/hook",
    ],
)
async def test_a_private_target_is_refused_unless_allowed(start_server: StartServer, url: str):
    server = await start_server(webhooks=replace(QUICK, allow_private=False))
    status, body = await upload(server, webhook_url=url)
    assert status == 422 and "--webhook-allow-private" in body["error"]["message"]


@pytest.mark.parametrize(
    "url,message",
    [
        ("ftp://example.com/hook", "http:// or https://"),
        ("http:///hook", "with a host"),
        ("http://user:pw@example.com/", "user name or password"),
        ("http://example.com:99999/", "not a URL"),
    ],
)
async def test_a_bad_url_is_refused(start_server: StartServer, url: str, message: str):
    server = await start_server(webhooks=QUICK)
    status, body = await upload(server, webhook_url=url)
    assert status == 422 and message in body["error"]["message"]


async def test_without_a_secret_a_webhook_url_is_refused(start_server: StartServer):
    server = await start_server()
    status, body = await upload(server, webhook_url="https://example.com/hook")
    assert status == 422 and "--webhook-secret" in body["error"]["message"]
    async with server.client.post(
        "/v1/videos", json={"input": "push", "webhook_url": "https://example.com/h"}
    ) as response:
        assert response.status == 422
    # In the query of a JSON request too: refused, never ignored.
    for body in ({"input": "push"}, {"scene": "shapes", "frames": 17}):
        async with server.client.post(
            "/v1/videos", json=body, params={"webhook_url": "https://example.com/h"}
        ) as response:
            assert response.status == 422, body


async def test_a_name_that_resolves_inside_is_refused_as_a_delivery_connects(
    start_server: StartServer,
):
    with pytest.raises(OSError, match="no public address"):
        await CheckedResolver(allow_private=False).resolve("localhost", 80)
    assert await CheckedResolver(allow_private=True).resolve("localhost", 80)
    with receiving() as receiver:
        # A default the CLI would refuse, set past it: each try is refused as it connects.
        port = receiver.url.split(":")[2].split("/")[0]
        settings = replace(
            QUICK, allow_private=False, attempts=2, default_url=f"http://localhost.:{port}/"
        )
        server = await start_server(webhooks=settings)
        await upload(server)
        face = server.face("webhooks")
        await until(lambda: face.health()["given_up"] == 2)
        assert receiver.received == []


async def test_a_new_default_url_sends_nothing_about_older_jobs(tmp_path: Path):
    store = tmp_path / "store"
    async with stored_server(store) as server:  # no webhooks at all
        _, job = await upload(server)
        await until(lambda: server.manager.get(job["id"]).record.is_final)
    with receiving() as receiver:
        settings = replace(QUICK, default_url=receiver.url)
        async with stored_server(store, webhooks=settings) as server:
            _, newer = await upload(server)
            await until(lambda: len(receiver.of("video.completed")) == 1)
            await asyncio.sleep(0.2)
        assert {r.json["data"]["id"] for r in receiver.received} == {newer["id"]}


async def test_an_end_not_delivered_before_a_restart_is_delivered_after_it(tmp_path: Path):
    store = tmp_path / "store"
    slow = replace(QUICK, first_retry_s=60.0)  # the second try would come after the stop
    ends = {"status": 503}
    with receiving(lambda kind, tries: 200 if kind == "video.started" else ends["status"]) as (
        receiver
    ):
        async with stored_server(store, webhooks=slow) as server:
            _, job = await upload(server, webhook_url=receiver.url)
            await until(lambda: len(receiver.of("video.completed")) == 1)
        ends["status"] = 200
        async with stored_server(store, webhooks=slow) as server:
            await until(lambda: len(receiver.of("video.completed")) == 2)
            first, second = receiver.of("video.completed")
            assert first.headers["webhook-id"] == second.headers["webhook-id"]
            [_, end] = verified(receiver, "video.completed")
            assert end["data"]["id"] == job["id"] and end["data"]["status"] == "completed"
            assert len(receiver.of("video.started")) == 1  # delivered before: not again
        async with stored_server(store, webhooks=slow) as server:  # owed no more
            await asyncio.sleep(0.3)
            assert server.face("webhooks").health() == {
                "pending": 0,
                "delivered": 0,
                "given_up": 0,
                "failed_tries": 0,
            }
        assert len(receiver.received) == 3


async def test_the_client_names_a_webhook_for_uploads_and_push_sessions(
    start_server: StartServer,
):
    with receiving() as receiver:
        server = await start_server(webhooks=QUICK)
        client = Client(server.url)
        body = safetensors_bytes(latents=LATENTS)
        job = await asyncio.to_thread(client.upload, body, webhook_url=receiver.url)
        async with AsyncClient(server.url) as async_client:
            async with async_client.push(fps=8, webhook_url=receiver.url) as session:
                await session.push(LATENTS)
            pushed = await async_client.wait(session.id)
        await until(lambda: len(receiver.of("video.completed")) == 2)
        ids = {message["data"]["id"] for message in verified(receiver, "video.completed")}
        assert ids == {job["id"], pushed["id"]} and pushed["webhook_url"] == receiver.url
