"""The server protects itself: an optional API key, a Host check, and an Origin check.

Three threats, three fences, all in one middleware that runs before any handler (and
so before any body is read); what it refuses leaves through `json_errors` as JSON.

**Host check (DNS rebinding).** A web page on `evil.example` can make its own name
resolve to 127.0.0.1 and then read this server's answers as "same-origin": the job
list, the videos. Its requests still carry `Host: evil.example`, so the server only
answers to host names it knows; others get 421. By default those are the loopback
names: `localhost`, `*.localhost` (RFC 6761 reserves them for loopback and browsers
resolve them without DNS, so no page can rebind them), 127.0.0.0/8 and ::1, any port.
`allowed_hosts` adds names (`vaecast.example.com`), subdomain wildcards (`*.lan`),
addresses or networks (`192.168.0.0/16`), or `*` (any host). IP addresses are always
safe to allow: a rebinding page is reached by a name, never by an address, so a
server bound beyond loopback (`for_bind_address`) also answers to any IP address.

**Origin check (cross-site requests).** Uploads are sniffed, not trusted by
Content-Type, so a form or a `text/plain` fetch from any site (a "simple" request,
sent without a CORS preflight) would create jobs. A state-changing request (POST,
PUT, PATCH, DELETE) whose `Origin` is present and is neither this server's own origin
(scheme://host:port as the request's Host says; the scheme from `X-Forwarded-Proto`
when a proxy sets it, which a cross-site page cannot do without a preflight) nor
listed in `cors_origins` is refused 403; so is `Origin: null` (sandboxed frames,
files, redirects). Requests without Origin (curl, Python clients) pass. Listed
origins get CORS headers and their preflights answered; unlisted ones get no CORS
headers, so the browser hides the answers to their GETs from them.

**API key.** With `api_key` set, everything but the page (`/`, `/static/`), `/healthz`,
`/metrics` and the API reference (`/openapi.json`, `/docs`: the API's shape, no data)
(every `/v1` route, and any route added later) needs `Authorization: Bearer KEY`,
compared in constant time; otherwise 401 with `WWW-Authenticate: Bearer`. CORS
preflights need no key (browsers never send one).
The preview page sends the header with fetch(), but EventSource, `<video src>` and
download links cannot send headers, so the key is also taken from the cookie
`vaecast_api_key` (URL-encoded) that the page sets with `SameSite=Strict; Path=/`.
That cookie is safe against other sites because:
- SameSite=Strict: the browser attaches it only to requests that a page of the same
  site starts; a cross-site page's forms, fetches, images and videos go without it.
- A request carrying a foreign `Origin` never authenticates by the cookie, and the
  Origin check refuses its state-changing requests anyway. This matters for pages
  of the *same site* on another port (cookies are not isolated by port): they get
  the cookie attached, but cannot use it to change anything or to read an answer.
What it does not stop: any other server on the same host name (another port) is
sent the cookie and so learns the key; run vaecast on a host name of its own when
other local services are not trusted.
Listed CORS origins authenticate with their own `Authorization` header, and are not
sent `Access-Control-Allow-Credentials`: with it, a listed site could act with the
key a user typed into this server's page, which it was never given.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import hdrs, web

from vaecast.errors import ForbiddenError, MisdirectedRequestError, UnauthorizedError
from vaecast.server.edge.security_config import (
    DEFAULT_PORTS,
    LOOPBACK_HOSTS,
    Origin,
    SecurityConfig,
    check_api_key,
    ip_address_of,
    ip_network_of,
    normalize_host_pattern,
    normalize_origin,
    parse_origin,
)

API_KEY_COOKIE = "vaecast_api_key"
# What a server bound to a loopback address answers to by default (any port).
# Added for a server bound beyond loopback: any IP address (never a rebinding name).
# Routes (aiohttp's canonical paths) served without the key, and the static prefix.
# The API reference (/openapi.json, /docs) is open too: it shows the API's shape, no data.
OPEN_RESOURCES = frozenset({"/", "/healthz", "/metrics", "/openapi.json", "/docs"})
OPEN_PREFIXES = ("/static/", "/docs/")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CORS_ALLOW_METHODS = "GET, HEAD, POST, DELETE, OPTIONS"
CORS_ALLOW_HEADERS = "Authorization, Content-Type, Range, Last-Event-ID, X-Push-Token"
CORS_EXPOSE_HEADERS = "Location, X-Video-Id, Content-Range, Content-Length, ETag, Retry-After"
CORS_MAX_AGE_S = 600
# Host header values whose verdict is remembered: every request of a viewer, a
# playlist poll or a status poll asks again, and parsing one costs ~20 us of the
# loop's time. Bounded, so a client sending many names only evicts older ones.
HOST_VERDICTS_KEPT = 64


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
# An origin as compared: (scheme, host, port), the port made explicit.


class SecurityGuard:
    """The checks of one server: `middleware` (inside `json_errors`, so what it refuses
    is JSON) and `add_cors_headers` (an `on_response_prepare` signal, so every answer
    to a listed origin carries them, errors included)."""

    def __init__(self, config: SecurityConfig) -> None:
        self._key = None if config.api_key is None else check_api_key(config.api_key).encode()
        self._hosts = _HostRule((*LOOPBACK_HOSTS, *(config.allowed_hosts or ())))
        self._host_refusal = functools.lru_cache(maxsize=HOST_VERDICTS_KEPT)(self._refuse_host)
        self._cors = frozenset(parse_origin(normalize_origin(o)) for o in config.cors_origins)

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            self._check_host(request)
            origin = request.headers.get(hdrs.ORIGIN)
            if origin is not None and _is_preflight(request):
                return self._preflight(origin)
            if origin is not None and request.method in STATE_CHANGING:
                self._check_origin(request, origin)
            if self._key is not None and not _is_open(request):
                self._check_key(request, origin)
            return await handler(request)

        self.middleware: Middleware = middleware

    async def add_cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        if not self._cors:
            return
        # The answer depends on Origin whenever origins are listed: caches must know.
        _add_vary(response, hdrs.ORIGIN)
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None and parse_origin(origin) in self._cors:
            response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
            response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = CORS_EXPOSE_HEADERS

    def _check_host(self, request: web.Request) -> None:
        if self._hosts.any_host:
            return
        header = request.headers.get(hdrs.HOST)
        if header is None:
            raise MisdirectedRequestError("the request has no Host header")
        refusal = self._host_refusal(header)
        if refusal is not None:
            raise MisdirectedRequestError(refusal)

    def _refuse_host(self, header: str) -> str | None:
        """Why a Host header is refused; None when it is allowed."""
        name = _split_host(header)[0]
        if name is None:
            return f"the Host header {header!r} is not a host name"
        if not self._hosts.allows(name):
            return (
                f"this server does not answer to the host name {name!r} "
                "(vaecast serve --allowed-host NAME adds one)"
            )
        return None

    def _preflight(self, origin: str) -> web.Response:
        if parse_origin(origin) not in self._cors:
            raise ForbiddenError(_foreign(origin))
        return web.Response(
            status=204,
            headers={
                hdrs.ACCESS_CONTROL_ALLOW_METHODS: CORS_ALLOW_METHODS,
                hdrs.ACCESS_CONTROL_ALLOW_HEADERS: CORS_ALLOW_HEADERS,
                hdrs.ACCESS_CONTROL_MAX_AGE: str(CORS_MAX_AGE_S),
            },
        )

    def _check_origin(self, request: web.Request, origin: str) -> None:
        parsed = parse_origin(origin)
        if parsed is None or (parsed not in self._cors and parsed != _own_origin(request)):
            raise ForbiddenError(_foreign(origin))

    def _check_key(self, request: web.Request, origin: str | None) -> None:
        presented = _presented_key(request, origin)
        if presented is None:
            raise UnauthorizedError(
                "this server needs an API key: send the header 'Authorization: Bearer KEY'"
            )
        assert self._key is not None
        if not hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), self._key):
            raise UnauthorizedError("the API key is not valid")


def _presented_key(request: web.Request, origin: str | None) -> str | None:
    """The key from `Authorization: Bearer`, else from the page's cookie; None if neither."""
    header = request.headers.get(hdrs.AUTHORIZATION)
    if header is not None:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthorizedError("the Authorization header must be 'Bearer KEY'")
        return token.strip()
    cookie = request.cookies.get(API_KEY_COOKIE)
    # The cookie rides along with every same-site request, other ports' pages
    # included: it counts only for this server's own (no Origin, or its own).
    if cookie is None or (origin is not None and parse_origin(origin) != _own_origin(request)):
        return None
    return unquote(cookie)


class _HostRule:
    """Host patterns compiled: exact names, `*.domain` suffixes, IP networks, or any."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        normalized = [normalize_host_pattern(pattern) for pattern in patterns]
        self.any_host = "*" in normalized
        names = [p for p in normalized if p != "*" and ip_network_of(p) is None]
        self.names = frozenset(p for p in names if not p.startswith("*."))
        self.suffixes = tuple(p[1:] for p in names if p.startswith("*."))
        self.networks = tuple(n for n in map(ip_network_of, normalized) if n is not None)

    def allows(self, name: str) -> bool:
        address = ip_address_of(name)
        if address is not None:
            return any(address in network for network in self.networks)
        return name in self.names or name.endswith(self.suffixes)


def _split_host(header: str) -> tuple[str | None, int | None]:
    """(name, port) of a Host header: lower case, IPv6 without brackets, no trailing
    dot; name None if the header is not `name[:port]` or `[ipv6][:port]`."""
    host = header.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        try:
            if not bracket or ipaddress.ip_address(name).version != 6:
                return None, None
        except ValueError:
            return None, None
    else:
        name, colon, rest = host.partition(":")
        rest = colon + rest
    port = None
    if rest:
        if not re.fullmatch(r":[0-9]{1,5}", rest) or int(rest[1:]) > 65535:
            return None, None
        port = int(rest[1:])
    name = name.removesuffix(".")
    return (name or None), port


def _own_origin(request: web.Request) -> Origin | None:
    """This server's origin as the request addressed it: its Host, and the scheme the
    client used (a TLS proxy in front says it in X-Forwarded-Proto)."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    scheme = forwarded if forwarded in DEFAULT_PORTS else request.scheme
    name, port = _split_host(request.headers.get(hdrs.HOST, ""))
    if name is None:
        return None
    return scheme, name, port or DEFAULT_PORTS.get(scheme, 80)


def _is_preflight(request: web.Request) -> bool:
    return (
        request.method == hdrs.METH_OPTIONS
        and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers
    )


def _is_open(request: web.Request) -> bool:
    """Served without the key: judged by the resource the router matched, so a new
    route needs the key unless it is added here, and unknown paths need it too."""
    resource = request.match_info.route.resource
    if resource is None:  # no route matched: 404 or 405 only for those with the key
        return False
    return is_open_resource(resource.canonical)


def is_open_resource(canonical: str) -> bool:
    """Whether the route of this canonical path is served without the key."""
    return canonical in OPEN_RESOURCES or canonical.startswith(OPEN_PREFIXES)


def _foreign(origin: str) -> str:
    if origin == "null":
        return (
            "requests from an opaque origin (Origin: null: a sandboxed frame, a file, "
            "a redirect) are not allowed"
        )
    return (
        f"requests from the origin {origin!r} are not allowed "
        "(vaecast serve --cors-origin ORIGIN allows one)"
    )


def _add_vary(response: web.StreamResponse, name: str) -> None:
    present = [v.strip() for v in response.headers.get(hdrs.VARY, "").split(",") if v.strip()]
    if name.lower() not in (v.lower() for v in present) and "*" not in present:
        response.headers[hdrs.VARY] = ", ".join([*present, name])
