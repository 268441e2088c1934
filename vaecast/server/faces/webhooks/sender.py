"""One try of one webhook: a POST, bounded in time, to an address that is checked as
the connection is made.

The session's resolver (`CheckedResolver`) resolves the target's host and keeps only
the addresses `edge.outbound.allowed_address` allows, so a host name that points at
a private address (or starts to, between two tries) is refused at that moment, and
the connection goes to an address that was checked. Redirects are not followed (the
place they point to would not be), and a 3xx counts as a failed try, as any answer
but a 2xx does. Only the status is read of the answer: a receiver cannot make the
server read an endless body.
"""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from vaecast.server.edge.outbound import allowed_address
from vaecast.server.faces.webhooks.messages import Message


class CheckedResolver(AbstractResolver):
    """The default resolver, less the addresses a webhook may not be sent to."""

    def __init__(self, allow_private: bool) -> None:
        self._resolver = DefaultResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        allowed = [r for r in results if allowed_address(r["host"], self._allow_private)]
        if not allowed:
            raise OSError(
                f"{host} resolves to no public address (start the server with "
                "--webhook-allow-private to allow private ones)"
            )
        return allowed

    async def close(self) -> None:
        await self._resolver.close()


class WebhookSender:
    def __init__(self, timeout_s: float, allow_private: bool, senders: int) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._allow_private = allow_private
        self._senders = senders
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=CheckedResolver(self._allow_private), limit=self._senders
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, headers={"User-Agent": "vaecast"}
            )
        return self._session

    async def send(self, message: Message, headers: dict[str, Any]) -> str | None:
        """Try once: None when the receiver took it (2xx), else why not."""
        try:
            async with self._client().post(
                message.url, data=message.body, headers=headers, allow_redirects=False
            ) as response:
                if 200 <= response.status < 300:
                    return None
                return f"HTTP {response.status}"
        except TimeoutError:
            return f"no answer within {self._timeout.total:g} s"
        except (aiohttp.ClientError, OSError) as error:
            return f"{type(error).__name__}: {error}"[:300]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
