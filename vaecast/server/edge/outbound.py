"""Where the server may send requests of its own (webhooks): a client names a URL, so
the URL is hostile until checked.

A webhook target is refused (422 when the job is made) unless it is an `http` or
`https` URL of at most `MAX_URL_CHARS` characters, with a host, no user or password,
and, where the host is an IP address, a public one: loopback, private (RFC 1918, fc00::/7),
link-local (the cloud metadata address 169.254.169.254 among them), multicast, reserved
and unspecified addresses let a client reach what only the server can (SSRF), so they
are refused unless the server allows them (`--webhook-allow-private`). A host name is
checked when a delivery connects: every address it resolves to then is checked the same
way (`allowed_address`), and the connection is made to a checked one, so a name that
points inside, or starts to (DNS rebinding), is refused at that moment.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from urllib.parse import urlsplit

from vaecast.errors import InvalidRequestError

MAX_URL_CHARS = 2048
MIN_SECRET_BYTES = 16
_LOCAL_NAMES = ("localhost", "localhost.", "ip6-localhost", "ip6-loopback")


def allowed_address(address: str, allow_private: bool) -> bool:
    """Whether a request may be sent to this IP address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone: not the address
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow_private:
        return not (ip.is_multicast or ip.is_unspecified)
    return ip.is_global and not ip.is_multicast


def check_webhook_secret(text: str) -> str:
    """A Standard Webhooks secret (`whsec_` and base64 of at least 16 bytes), or
    ValueError saying why not."""
    encoded = text.removeprefix("whsec_")
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ValueError("a webhook secret is 'whsec_' and base64") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"a webhook secret holds {MIN_SECRET_BYTES} bytes at least")
    return text


def check_url_syntax(text: str) -> str:
    """`text` as a webhook URL, whatever its address (that is checked with the server's
    `--webhook-allow-private`), or ValueError saying why not."""
    try:
        return check_webhook_url(text, allow_private=True)
    except InvalidRequestError as error:
        raise ValueError(error.message) from None


def check_webhook_url(text: str, allow_private: bool) -> str:
    """`text` as a webhook target, or InvalidRequestError saying why not."""
    if len(text) > MAX_URL_CHARS:
        raise InvalidRequestError(f"webhook_url is longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:
        raise InvalidRequestError("webhook_url is not a URL") from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidRequestError("webhook_url must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidRequestError("webhook_url must not carry a user name or password")
    del port  # read only to check it: urlsplit raises on one out of range
    if allow_private:
        return text
    if host.lower() in _LOCAL_NAMES:
        raise InvalidRequestError(
            "webhook_url names this machine; the server sends no webhooks to private "
            "addresses unless started with --webhook-allow-private"
        )
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return text  # a name: its addresses are checked as a delivery connects
    if not allowed_address(host, allow_private):
        raise InvalidRequestError(
            f"webhook_url's address {host} is not public (loopback, private, link-local "
            "or reserved); the server sends no webhooks there unless started with "
            "--webhook-allow-private"
        )
    return text
