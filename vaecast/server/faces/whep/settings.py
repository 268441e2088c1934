"""WebRTC settings: ICE servers, host addresses, viewer limits and timeouts. No I/O."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

ICE_SCHEMES = ("stun", "stuns", "turn", "turns")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ANY_ADDRESS = frozenset({"0.0.0.0", "::", ""})


@dataclass(frozen=True, slots=True)
class IceServer:
    url: str  # stun:host:port, turn:host:port?transport=udp
    username: str | None = None
    credential: str | None = None


@dataclass(frozen=True, slots=True)
class WebRtcSettings:
    # STUN/TURN servers offered to aiortc's ICE agent and, as WHEP's Link headers, to
    # the client. TURN relays are the operator's to run: vaecast ships none.
    ice_servers: tuple[IceServer, ...] = ()
    # The addresses host candidates are gathered on; None: every interface's. The CLI
    # derives it from --host, so a loopback server offers only loopback candidates.
    host_addresses: tuple[str, ...] | None = ("127.0.0.1",)
    max_viewers: int = 32
    # A peer must complete ICE and DTLS within this long of its offer, and a connected
    # peer that sends no RTCP receiver report for this long has gone: either is closed.
    connect_timeout_s: float = 10.0
    peer_timeout_s: float = 10.0


def parse_ice_server(text: str) -> IceServer:
    """`stun:host[:port]`, or `turn[s]:USER:PASSWORD@host[:port][?transport=tcp]`;
    raises ValueError with the reason."""
    scheme, _, rest = text.partition(":")
    if scheme not in ICE_SCHEMES or not rest:
        raise ValueError(f"an ICE server is a {'/'.join(ICE_SCHEMES)}: URL, got {text!r}")
    userinfo, at, address = rest.rpartition("@")
    if not at:
        if scheme.startswith("turn"):
            raise ValueError("a TURN server needs credentials: turn:USER:PASSWORD@host:port")
        return IceServer(text)
    username, colon, credential = userinfo.partition(":")
    if not colon or not username:
        raise ValueError("TURN credentials are written USER:PASSWORD@ before the host")
    return IceServer(f"{scheme}:{address}", username, credential)


def host_addresses_for(bind_host: str) -> tuple[str, ...] | None:
    """The ICE host addresses that match an HTTP bind address: loopback for loopback,
    that address for one address, every interface's (None) for the any-address or a
    name."""
    if bind_host in LOOPBACK_NAMES:
        return ("127.0.0.1",)
    if bind_host in ANY_ADDRESS:
        return None
    try:
        return (str(ipaddress.ip_address(bind_host)),)
    except ValueError:
        return None
