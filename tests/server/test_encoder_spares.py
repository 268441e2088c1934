"""The server opens the next job's encoder between jobs (vaecast.pipeline.encoder_spares)."""

from __future__ import annotations

from tests.helpers import safetensors_bytes, smooth_latents, until
from tests.helpers.server import StartServer


async def test_the_server_opens_the_next_jobs_encoder_between_jobs(start_server: StartServer):
    server = await start_server()
    spares = server.manager.spare_encoders
    latents = smooth_latents(frames=5)
    bodies = []
    for _ in range(3):
        async with server.client.post(
            "/v1/videos/stream?fps=24", data=safetensors_bytes(latents=latents)
        ) as response:
            assert response.status == 200
            bodies.append(await response.read())
        await until(lambda: spares.spare_key is not None)
    # The first job opened its own; the other two got the one opened after the job before.
    assert spares.handed_out == 2
    assert bodies[0] == bodies[1] == bodies[2]
    # A job of another size opens its own; the spare then follows that size.
    other = smooth_latents(frames=5, height=8, width=10)
    async with server.client.post(
        "/v1/videos/stream?fps=24", data=safetensors_bytes(latents=other)
    ) as response:
        assert response.status == 200
        await response.read()
    await until(lambda: spares.spare_key is not None and spares.spare_key[:2] == (80, 64))
    assert spares.handed_out == 2
