"""Which local addresses aiortc's ICE agent (aioice) gathers host candidates on.

aioice takes every interface's addresses but loopback and offers no option to choose:
its `Connection` calls the module function `aioice.ice.get_host_addresses`. vaecast
replaces that function, once per process, with one that answers what the server was
told to use (`WebRtcSettings.host_addresses`), so a server bound to loopback offers
WebRTC peers loopback only, as its HTTP port is; None restores aioice's own choice.
The setting is the process's: apps in one process (tests) share it.

`use_host_addresses` also drops aioice's mDNS state (the socket that resolves a
browser's `.local` candidates, and the lock around it) when it is another event
loop's: aioice keeps it per thread, not per loop, so in a process that runs loops one
after another (tests, a restarted app) a later loop would wait on a dead loop's lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aioice.ice

_aioice_choice: Callable[[bool, bool], list[str]] = aioice.ice.get_host_addresses
_chosen: tuple[str, ...] | None = None


def use_host_addresses(addresses: tuple[str, ...] | None) -> None:
    """Called by each app as it starts, on its event loop."""
    global _chosen
    _chosen = addresses
    aioice.ice.get_host_addresses = _host_addresses
    _forget_other_loops_mdns()


def _forget_other_loops_mdns() -> None:
    state = aioice.ice._mdns  # a threading.local: lock, protocol, subscribers
    loop = asyncio.get_running_loop()
    protocol = getattr(state, "protocol", None)
    transport = getattr(protocol, "transport", None)
    mine = transport is not None and getattr(transport, "_loop", loop) is loop
    if hasattr(state, "lock") and not mine:
        for name in ("lock", "protocol", "subscribers"):
            if hasattr(state, name):
                delattr(state, name)


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    if _chosen is None:
        return _aioice_choice(use_ipv4, use_ipv6)
    return [a for a in _chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]
