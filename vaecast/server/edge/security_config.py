"""What the server's security options mean, as values: no HTTP here.

The options (`--api-key`, `--allowed-host`, `--cors-origin`) are parsed and checked
with these functions, and the server's guard (vaecast.server.edge.security, which says
what each fence is for) compiles the resulting `SecurityConfig`. Kept apart from the
guard so that commands which never serve (`vaecast decode`) need no aiohttp.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

API_KEY_ENV = "VAECAST_API_KEY"


LOOPBACK_HOSTS = ("localhost", "*.localhost", "127.0.0.0/8", "::1/128")


ANY_ADDRESS = ("0.0.0.0/0", "::/0")


DEFAULT_PORTS = {"http": 80, "https": 443}


_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


_KEY = re.compile(r"[\x21-\x7e]+")  # visible ASCII: sendable in a header and a cookie


Origin = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """What the server demands of a request (see the module docstring)."""

    # None: no key needed.
    api_key: str | None = None
    # Host names, `*.domain` wildcards, IP addresses or networks, or "*", answered to
    # on top of LOOPBACK_HOSTS; None (or empty): LOOPBACK_HOSTS alone.
    allowed_hosts: tuple[str, ...] | None = None
    # Origins (scheme://host[:port]) whose pages may call the API: CORS.
    cors_origins: tuple[str, ...] = ()


def check_api_key(key: str) -> str:
    """`key` if it can be an API key; ValueError says why not."""
    if not _KEY.fullmatch(key):
        raise ValueError(
            f"the API key (--api-key or {API_KEY_ENV}) must be printable ASCII "
            "without spaces, and not empty"
        )
    return key


def normalize_host_pattern(text: str) -> str:
    """An allowed-host pattern in the form it is compared in; ValueError if it is none."""
    pattern = text.strip().lower()
    if pattern == "*":
        return pattern
    try:
        if "/" in pattern:
            return str(ipaddress.ip_network(pattern))
        return str(ipaddress.ip_address(pattern.removeprefix("[").removesuffix("]")))
    except ValueError:
        pass
    name = pattern.removeprefix("*.").removesuffix(".")
    if not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"{text!r} is not a host name, an IP address or network, '*.' and a domain, "
            "or '*' (give it without a port)"
        )
    return pattern.removesuffix(".")


def normalize_origin(text: str) -> str:
    """An origin as browsers write it (`https://app.example.com`); ValueError if it is none."""
    origin = parse_origin(text.strip().removesuffix("/"))
    if origin is None:
        raise ValueError(
            f"{text!r} is not an origin: give scheme://host[:port], e.g. https://app.example.com"
        )
    scheme, host, port = origin
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" if DEFAULT_PORTS[scheme] == port else f"{scheme}://{shown}:{port}"


def for_bind_address(config: SecurityConfig, bind_host: str) -> tuple[SecurityConfig, list[str]]:
    """The config a server listening on `bind_host` runs with, and warnings for its operator.

    On a loopback address: `config` as it is. Beyond loopback, any IP address is
    answered to as well (rebinding needs a name), so the server is reachable by
    address without any option; names must be listed with --allowed-host.
    """
    if is_loopback_bind(bind_host):
        return config, []
    where = bind_host or "all interfaces"
    warnings = []
    if not config.allowed_hosts:
        warnings.append(
            f"listening on {where}, beyond this machine: requests are answered for any IP "
            "address and for localhost; list the host names clients use with --allowed-host"
        )
    if config.api_key is None:
        warnings.append(
            f"no --api-key: anyone who can reach {where} can decode on this server and read "
            f"its videos; set --api-key (or {API_KEY_ENV}) and put a TLS proxy in front "
            "(README: Exposing vaecast beyond localhost)"
        )
    hosts = (*ANY_ADDRESS, *(config.allowed_hosts or ()))
    return replace(config, allowed_hosts=hosts), warnings


def ip_network_of(pattern: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if pattern == "*" or pattern.startswith("*."):
        return None
    try:
        return ipaddress.ip_network(pattern)
    except ValueError:
        return None


def ip_address_of(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None
    # ::ffff:127.0.0.1 is 127.0.0.1 spoken over IPv6.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_origin(text: str) -> Origin | None:
    """(scheme, host, port) of a serialized http(s) origin; None for `null` or anything else."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if (
        parts.scheme not in DEFAULT_PORTS
        or not parts.hostname
        or parts.path
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
    ):
        return None
    return parts.scheme, parts.hostname.removesuffix("."), port or DEFAULT_PORTS[parts.scheme]


def is_loopback_bind(host: str) -> bool:
    name = host.strip().lower().removeprefix("[").removesuffix("]").removesuffix(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    address = ip_address_of(name)
    return address is not None and address.is_loopback
