"""Which local addresses aiortc's ICE agent (aioice) gathers host candidates on.

aioice takes every interface's addresses but loopback and offers no option to choose:
its `Connection` calls the module function `aioice.ice.get_host_addresses`. vaecast
replaces that function, once per process, with one that answers what the server was
told to use (`WebRtcSettings.host_addresses`), so a server bound to loopback offers
WebRTC peers loopback only, as its HTTP port is; None restores aioice's own choice.
The setting is the process's: apps in one process (tests) share it.
"""

from __future__ import annotations

from collections.abc import Callable

import aioice.ice

_aioice_choice: Callable[[bool, bool], list[str]] = aioice.ice.get_host_addresses
_chosen: tuple[str, ...] | None = None


def use_host_addresses(addresses: tuple[str, ...] | None) -> None:
    global _chosen
    _chosen = addresses
    aioice.ice.get_host_addresses = _host_addresses


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    if _chosen is None:
        return _aioice_choice(use_ipv4, use_ipv6)
    return [a for a in _chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]
