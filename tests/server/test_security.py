"""The server protects itself: API key, Host check (DNS rebinding), Origin check and CORS.

Real HTTP on 127.0.0.1; a forged Host or Origin is what a rebinding or cross-site
page's browser would send.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDictProxy

from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.server import Server, StartServer
from vaecast.cli import main
from vaecast.server.edge.security_config import SecurityConfig, for_bind_address

KEY = "sk-vaecast-test-0123456789"
BEARER = {"Authorization": f"Bearer {KEY}"}
LATENTS = safetensors_bytes(latents=smooth_latents(frames=2))

NO_KEY = "this server needs an API key: send the header 'Authorization: Bearer KEY'"
BAD_KEY = "the API key is not valid"
EXPOSED = "Location, X-Video-Id, Content-Range, Content-Length, ETag, Retry-After"
APP = "https://app.example.com"


def error(error_type: str, message: str) -> dict[str, Any]:
    return {"error": {"type": error_type, "message": message}}


def misdirected(name: str) -> dict[str, Any]:
    return error(
        "misdirected_request",
        f"this server does not answer to the host name {name!r} "
        "(vaecast serve --allowed-host NAME adds one)",
    )


def forbidden(origin: str) -> dict[str, Any]:
    return error(
        "forbidden",
        f"requests from the origin {origin!r} are not allowed "
        "(vaecast serve --cors-origin ORIGIN allows one)",
    )


async def create(server: Server, **headers: str) -> dict[str, Any]:
    async with server.client.post("/v1/videos", data=LATENTS, headers=headers) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def answer(
    server: Server, method: str, path: str, **kwargs: Any
) -> tuple[int, CIMultiDictProxy[str], Any]:
    """(status, headers, JSON body or None) of one request."""
    async with server.client.request(method, path, **kwargs) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, response.headers, body


# ---------------------------------------------------------------- API key


async def test_without_the_key_every_v1_route_answers_401_and_nothing_happens(
    start_server: StartServer,
):
    server = await start_server(security=SecurityConfig(api_key=KEY))
    job = await create(server, **BEARER)
    await server.manager.get(job["id"]).wait()
    video = f"/v1/videos/{job['id']}"
    routes = [
        ("GET", "/v1/videos"),
        ("POST", "/v1/videos"),
        ("GET", video),
        ("GET", f"{video}/content"),
        ("HEAD", f"{video}/content"),
        ("GET", f"{video}/events"),
        ("DELETE", video),
        ("POST", "/v1/videos/stream"),
        ("GET", "/v1/no-such-route"),  # unknown paths too: no probing without the key
    ]
    for method, path in routes:
        body = LATENTS if method == "POST" else None
        async with server.client.request(method, path, data=body) as response:
            assert response.status == 401, (method, path)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            if method != "HEAD":
                assert await response.json() == error("unauthorized", NO_KEY), (method, path)
    assert list(server.manager.jobs) == [job["id"]]
    assert server.manager.get(job["id"]).record.status.value == "completed"


async def test_the_key_works_from_the_header_and_from_the_pages_cookie(
    start_server: StartServer,
):
    server = await start_server(security=SecurityConfig(api_key=KEY))
    job = await create(server, **BEARER)
    await server.manager.get(job["id"]).wait()
    content = f"/v1/videos/{job['id']}/content"
    async with server.client.get(content, headers=BEARER) as response:
        assert response.status == 200
        assert len(await response.read()) == server.manager.get(job["id"]).log.size
    # The page URL-encodes the key into its cookie; EventSource and <video> send it.
    cookie = {"Cookie": "vaecast_api_key=sk-vaecast-test-0123456789"}
    for path in ("/v1/videos", f"/v1/videos/{job['id']}", content):
        async with server.client.get(path, headers=cookie) as response:
            assert response.status == 200, path
    async with server.client.get(f"/v1/videos/{job['id']}/events", headers=cookie) as response:
        assert (response.status, response.content_type) == (200, "text/event-stream")
    async with server.client.post(
        "/v1/videos/stream", data=LATENTS, headers={**cookie, "Origin": server.url}
    ) as response:
        assert response.status == 200
        assert response.headers["X-Video-Id"] in server.manager.jobs
        await response.read()
    # A key with characters a cookie cannot hold, as encodeURIComponent writes it.
    odd = await start_server(security=SecurityConfig(api_key="a+b;c=%"))
    status, _, _ = await answer(
        odd, "GET", "/v1/videos", headers={"Cookie": "vaecast_api_key=a%2Bb%3Bc%3D%25"}
    )
    assert status == 200


async def test_a_wrong_key_is_refused(start_server: StartServer):
    server = await start_server(security=SecurityConfig(api_key=KEY))
    cases = [
        ({"Authorization": "Bearer sk-vaecast-test-0123456788"}, BAD_KEY),
        ({"Authorization": f"Bearer {KEY}x"}, BAD_KEY),
        ({"Authorization": "Bearer kéy"}, BAD_KEY),
        ({"Cookie": "vaecast_api_key=guess"}, BAD_KEY),
        # A header, even a wrong one, wins over a right cookie.
        ({"Authorization": "Bearer guess", "Cookie": f"vaecast_api_key={KEY}"}, BAD_KEY),
        ({"Authorization": f"Basic {KEY}"}, "the Authorization header must be 'Bearer KEY'"),
        ({"Authorization": "Bearer "}, "the Authorization header must be 'Bearer KEY'"),
    ]
    for headers, message in cases:
        status, response_headers, body = await answer(
            server, "POST", "/v1/videos", data=LATENTS, headers=headers
        )
        assert (status, body) == (401, error("unauthorized", message)), headers
        assert response_headers["WWW-Authenticate"] == "Bearer"
    assert server.manager.jobs == {}


async def test_the_page_health_and_metrics_need_no_key(start_server: StartServer):
    server = await start_server(security=SecurityConfig(api_key=KEY))
    for path in ("/", "/static/app.js", "/healthz", "/metrics"):
        async with server.client.get(path) as response:
            assert response.status == 200, path
    status, _, body = await answer(server, "GET", "/v1/no-such-route", headers=BEARER)
    assert status == 404
    assert body["error"]["type"] == "not_found"


async def test_without_a_configured_key_nothing_asks_for_one(start_server: StartServer):
    server = await start_server()
    job = await create(server, Authorization="Bearer anything")
    status, _, _ = await answer(server, "GET", f"/v1/videos/{job['id']}")
    assert status == 200


# ---------------------------------------------------------------- Host


async def test_a_foreign_host_gets_421_before_any_handler_runs(start_server: StartServer):
    server = await start_server()
    rebinding = {"Host": "evil.example:8000"}
    for method, path in [
        ("POST", "/v1/videos"),
        ("POST", "/v1/videos/stream"),
        ("GET", "/v1/videos"),
        ("GET", "/"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
    ]:
        status, _, body = await answer(server, method, path, data=LATENTS, headers=rebinding)
        assert (status, body) == (421, misdirected("evil.example")), (method, path)
    assert server.manager.jobs == {}
    status, _, body = await answer(server, "GET", "/healthz", headers={"Host": "[::1"})
    assert (status, body) == (
        421,
        error("misdirected_request", "the Host header '[::1' is not a host name"),
    )


async def test_loopback_names_and_addresses_are_answered_by_default(start_server: StartServer):
    server = await start_server()
    for host in (
        "localhost:1234",
        "LocalHost",
        "localhost.",
        "app.localhost:8000",
        "127.0.0.5",
        "127.0.0.1:65535",
        "[::1]:8000",
        "[::ffff:127.0.0.1]",
    ):
        status, _, _ = await answer(server, "GET", "/healthz", headers={"Host": host})
        assert status == 200, host
    for host, name in [
        ("localhost.evil.example", "localhost.evil.example"),
        ("evil-localhost", "evil-localhost"),
        ("10.0.0.1:8000", "10.0.0.1"),
        ("[::2]", "::2"),
    ]:
        status, _, body = await answer(server, "GET", "/healthz", headers={"Host": host})
        assert (status, body) == (421, misdirected(name)), host


async def test_host_verdicts_are_remembered_boundedly_and_stay_right(start_server: StartServer):
    from vaecast.server.edge.security import HOST_VERDICTS_KEPT, SecurityGuard

    server = await start_server()
    # Twice the remembered number of names, then names asked before: evicted verdicts
    # are worked out again, kept ones are the same.
    names = [f"evil{i}.example" for i in range(2 * HOST_VERDICTS_KEPT)]
    for name in [*names, names[0], names[-1]]:
        status, _, body = await answer(server, "GET", "/healthz", headers={"Host": name})
        assert (status, body) == (421, misdirected(name)), name
    for host in ("localhost:8000", "127.0.0.1", "localhost:8000"):
        status, _, _ = await answer(server, "GET", "/healthz", headers={"Host": host})
        assert status == 200, host
    # The memo itself: bounded, and a name asked again is answered from it.
    guard = SecurityGuard(SecurityConfig())
    for name in [*names, names[-1]]:
        assert guard._host_refusal(name) is not None
    memo = guard._host_refusal.cache_info()
    assert (memo.currsize, memo.maxsize, memo.hits) == (HOST_VERDICTS_KEPT, HOST_VERDICTS_KEPT, 1)


async def test_allowed_hosts_widen_the_default(start_server: StartServer):
    hosts = ("vaecast.example.com", "*.lan", "192.168.0.0/16", "[fd00::7]")
    server = await start_server(security=SecurityConfig(allowed_hosts=hosts))
    for host in (
        "vaecast.example.com",
        "VAECAST.example.com:443",
        "gpu.lan:8000",
        "a.b.lan",
        "192.168.3.4",
        "[fd00::7]:8000",
        "localhost:8000",
        "127.0.0.1",
    ):
        status, _, _ = await answer(server, "GET", "/healthz", headers={"Host": host})
        assert status == 200, host
    for host in ("lan", "example.com", "10.1.2.3", "evil.example"):
        status, _, _ = await answer(server, "GET", "/healthz", headers={"Host": host})
        assert status == 421, host
    anything = await start_server(security=SecurityConfig(allowed_hosts=("*",)))
    status, _, _ = await answer(anything, "GET", "/healthz", headers={"Host": "evil.example"})
    assert status == 200


def test_a_server_bound_beyond_loopback_answers_to_addresses_and_warns():
    loopback = SecurityConfig()
    assert for_bind_address(loopback, "127.0.0.1") == (loopback, [])
    assert for_bind_address(loopback, "::1") == (loopback, [])
    assert for_bind_address(loopback, "localhost") == (loopback, [])
    config, warnings = for_bind_address(SecurityConfig(), "0.0.0.0")
    assert config == SecurityConfig(allowed_hosts=("0.0.0.0/0", "::/0"))
    assert warnings == [
        "listening on 0.0.0.0, beyond this machine: requests are answered for any IP "
        "address and for localhost; list the host names clients use with --allowed-host",
        "no --api-key: anyone who can reach 0.0.0.0 can decode on this server and read its "
        "videos; set --api-key (or VAECAST_API_KEY) and put a TLS proxy in front "
        "(README: Exposing vaecast beyond localhost)",
    ]
    named = SecurityConfig(api_key=KEY, allowed_hosts=("gpu.lan",))
    assert for_bind_address(named, "10.0.0.2") == (
        SecurityConfig(api_key=KEY, allowed_hosts=("0.0.0.0/0", "::/0", "gpu.lan")),
        [],
    )


# ---------------------------------------------------------------- Origin and CORS


async def test_a_cross_origin_simple_post_is_refused_and_creates_nothing(
    start_server: StartServer,
):
    server = await start_server()
    job = await create(server)
    form_post = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
    for path in ("/v1/videos", "/v1/videos/stream"):
        status, _, body = await answer(server, "POST", path, data=LATENTS, headers=form_post)
        assert (status, body) == (403, forbidden("https://evil.example")), path
    status, _, body = await answer(
        server, "POST", "/v1/videos", data=LATENTS, headers={"Origin": "null"}
    )
    assert (status, body) == (
        403,
        error(
            "forbidden",
            "requests from an opaque origin (Origin: null: a sandboxed frame, a file, "
            "a redirect) are not allowed",
        ),
    )
    # Another port of the same host is another origin.
    other_port = server.url.rsplit(":", 1)[0] + ":1"
    status, _, _ = await answer(
        server, "DELETE", f"/v1/videos/{job['id']}", headers={"Origin": other_port}
    )
    assert status == 403
    assert list(server.manager.jobs) == [job["id"]]
    assert server.manager.get(job["id"]).record.status.value != "cancelled"
    # Reading is not refused (no side effect), but gets no CORS headers: the
    # browser then keeps the answer from the page.
    status, headers, _ = await answer(
        server, "GET", "/v1/videos", headers={"Origin": "https://evil.example"}
    )
    assert status == 200
    assert "Access-Control-Allow-Origin" not in headers


async def test_same_origin_requests_and_clients_without_origin_pass(start_server: StartServer):
    server = await start_server()
    await create(server)  # curl, Python: no Origin
    job = await create(server, Origin=server.url)  # the preview page
    status, _, _ = await answer(
        server, "DELETE", f"/v1/videos/{job['id']}", headers={"Origin": server.url}
    )
    assert status == 200
    # Behind a TLS proxy: the browser's origin is https, the proxy says so.
    proxied = await start_server(security=SecurityConfig(allowed_hosts=("vaecast.example.com",)))
    await create(
        proxied,
        Host="vaecast.example.com",
        Origin="https://vaecast.example.com",
        **{"X-Forwarded-Proto": "https"},
    )
    status, _, body = await answer(
        proxied,
        "POST",
        "/v1/videos",
        data=LATENTS,
        headers={"Host": "vaecast.example.com", "Origin": "https://vaecast.example.com"},
    )
    assert (status, body) == (403, forbidden("https://vaecast.example.com"))


async def test_a_listed_origin_gets_cors_and_its_preflight_needs_no_key(
    start_server: StartServer,
):
    server = await start_server(security=SecurityConfig(api_key=KEY, cors_origins=(f"{APP}/",)))
    preflight = {
        "Origin": APP,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    status, headers, _ = await answer(server, "OPTIONS", "/v1/videos", headers=preflight)
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == APP
    assert headers["Access-Control-Allow-Methods"] == "GET, HEAD, POST, DELETE, OPTIONS"
    assert headers["Access-Control-Allow-Headers"] == (
        "Authorization, Content-Type, Range, Last-Event-ID, X-Push-Token"
    )
    assert headers["Access-Control-Max-Age"] == "600"
    assert headers["Vary"] == "Origin"
    # Cookies are not for other origins: they authenticate with their own header.
    assert "Access-Control-Allow-Credentials" not in headers

    async with server.client.post(
        "/v1/videos", data=LATENTS, headers={"Origin": APP, **BEARER}
    ) as response:
        assert response.status == 201
        assert response.headers["Access-Control-Allow-Origin"] == APP
        assert response.headers["Access-Control-Expose-Headers"] == EXPOSED
        assert response.headers["Vary"] == "Origin"
        assert "Access-Control-Allow-Credentials" not in response.headers
        job = await response.json()
    async with server.client.get(
        f"/v1/videos/{job['id']}/content", headers={"Origin": APP, **BEARER}
    ) as response:
        assert response.status == 200
        assert response.headers["Access-Control-Allow-Origin"] == APP
        await response.read()
    # Errors carry CORS too, so the page of that origin can read why; the cookie
    # of this server's own page does not count for another origin.
    status, headers, body = await answer(
        server,
        "GET",
        "/v1/videos",
        headers={"Origin": APP, "Cookie": f"vaecast_api_key={KEY}"},
    )
    assert (status, body) == (401, error("unauthorized", NO_KEY))
    assert headers["Access-Control-Allow-Origin"] == APP
    # Unlisted: no CORS headers, but Vary all the same (the answer depends on Origin).
    status, headers, _ = await answer(server, "GET", "/healthz", headers={"Origin": "https://x.y"})
    assert status == 200
    assert "Access-Control-Allow-Origin" not in headers
    assert headers["Vary"] == "Origin"


async def test_an_unlisted_preflight_is_refused(start_server: StartServer):
    server = await start_server(security=SecurityConfig(cors_origins=(APP,)))
    for origin in ("https://evil.example", "http://app.example.com", f"{APP}:8443"):
        status, headers, body = await answer(
            server,
            "OPTIONS",
            "/v1/videos",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        )
        assert (status, body) == (403, forbidden(origin)), origin
        assert "Access-Control-Allow-Origin" not in headers
    # Not a preflight (no Access-Control-Request-Method): the route's own answer.
    status, _, _ = await answer(server, "OPTIONS", "/v1/videos")
    assert status == 405


def test_bad_security_settings_are_refused():
    from vaecast.server.edge.security import SecurityGuard

    with pytest.raises(ValueError, match="must be printable ASCII without spaces"):
        SecurityGuard(SecurityConfig(api_key="two words"))
    with pytest.raises(ValueError, match="is not an origin"):
        SecurityGuard(SecurityConfig(cors_origins=("*",)))
    with pytest.raises(ValueError, match="give it without a port"):
        SecurityGuard(SecurityConfig(allowed_hosts=("example.com:80",)))


# ---------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--allowed-host", "example.com:8000"],
            "argument --allowed-host: 'example.com:8000' is not a host name, an IP address "
            "or network, '*.' and a domain, or '*' (give it without a port)",
        ),
        (
            ["--cors-origin", "*"],
            "argument --cors-origin: '*' is not an origin: give scheme://host[:port], "
            "e.g. https://app.example.com",
        ),
        (
            ["--cors-origin", "https://app.example.com/page"],
            "argument --cors-origin: 'https://app.example.com/page' is not an origin",
        ),
        (
            ["--api-key", ""],
            "argument --api-key: the API key (--api-key or VAECAST_API_KEY) must be "
            "printable ASCII without spaces, and not empty",
        ),
    ],
)
def test_bad_security_options_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def urlopen(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> int:
    """The status of one request (errors included)."""
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@contextlib.contextmanager
def serve(tmp_path: Path, *args: str, key: str | None = None) -> Iterator[tuple[str, Path]]:
    """`vaecast serve` in a process of its own: (its URL, its stderr file)."""
    environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
    environ.pop("VAECAST_API_KEY", None)
    if key is not None:
        environ["VAECAST_API_KEY"] = key
    command = [sys.executable, "-m", "vaecast", "serve", "--model", "linear", "--port", "0"]
    log_path = tmp_path / "server.log"
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            [*command, *args], stdout=subprocess.PIPE, stderr=log, text=True, env=environ
        ) as process,
    ):
        try:
            line = process.stdout.readline()  # type: ignore[union-attr]
            assert line.startswith("vaecast serving linear on http://"), log_path.read_text()
            port = line.rsplit(":", 1)[1].strip().rstrip("/")
            yield f"http://127.0.0.1:{port}/", log_path
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()


@pytest.mark.slow
def test_serve_takes_the_key_from_the_environment_and_the_security_options(tmp_path: Path):
    options = ["--allowed-host", "vaecast.test", "--cors-origin", "http://app.test:3000"]
    with serve(tmp_path, *options, key=KEY) as (url, log_path):
        assert urlopen(url + "v1/videos") == 401
        assert urlopen(url + "v1/videos", BEARER) == 200
        assert urlopen(url + "healthz") == 200
        assert urlopen(url + "healthz", {"Host": "vaecast.test:8000"}) == 200
        assert urlopen(url + "healthz", {"Host": "evil.example"}) == 421
        cross = {**BEARER, "Content-Type": "text/plain"}
        assert urlopen(url + "v1/videos", {**cross, "Origin": "http://evil.test"}, LATENTS) == 403
        assert urlopen(url + "v1/videos", {**cross, "Origin": "http://app.test:3000"}, LATENTS) == (
            201
        )
        assert "warning" not in log_path.read_text()


@pytest.mark.slow
def test_serve_beyond_loopback_warns_and_answers_to_addresses(tmp_path: Path):
    with serve(tmp_path, "--host", "0.0.0.0") as (url, log_path):
        assert urlopen(url + "healthz", {"Host": "192.0.2.7:8000"}) == 200
        assert urlopen(url + "healthz", {"Host": "localhost"}) == 200
        assert urlopen(url + "healthz", {"Host": "evil.example"}) == 421
        log = log_path.read_text()
        assert "vaecast: warning: listening on 0.0.0.0, beyond this machine" in log
        assert "vaecast: warning: no --api-key: anyone who can reach 0.0.0.0" in log
