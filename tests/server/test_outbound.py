"""Where webhooks may go (`edge.outbound`), and when they are tried again (`messages`)."""

from __future__ import annotations

import pytest

from vaecast.errors import InvalidRequestError
from vaecast.server.edge.outbound import (
    allowed_address,
    check_url_syntax,
    check_webhook_secret,
    check_webhook_url,
)
from vaecast.server.faces.webhooks.messages import retry_delays


@pytest.mark.parametrize(
    "address,public",
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("127.8.9.10", False),
        ("::1", False),
        ("10.0.0.1", False),
        ("172.16.5.4", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # the cloud metadata service
        ("fe80::1%eth0", False),
        ("fc00::1", False),
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped: judged as the IPv4 address
        ("::ffff:8.8.8.8", True),
        ("not an address", False),
    ],
)
def test_only_public_addresses_unless_allowed(address: str, public: bool) -> None:
    assert allowed_address(address, allow_private=False) is public
    if address not in ("0.0.0.0", "224.0.0.1", "not an address"):
        assert allowed_address(address, allow_private=True)


def test_urls_are_checked_in_bounded_time() -> None:
    assert check_webhook_url("https://hooks.example.com/a?b=c", False)
    assert check_webhook_url("http://127.0.0.1:8/hook", allow_private=True)
    for bad in ("x" * 100_000, "https://" + "a" * 3000, "javascript:alert(1)", "", "https://"):
        with pytest.raises(InvalidRequestError):
            check_webhook_url(bad, allow_private=True)
    with pytest.raises(ValueError, match="http:// or https://"):
        check_url_syntax("gopher://example.com/")


def test_secrets_are_whsec_and_base64_of_16_bytes_at_least() -> None:
    assert check_webhook_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    assert check_webhook_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")  # the prefix is optional
    for bad in ("whsec_", "whsec_c2hvcnQ=", "whsec_not base64!", "x" * 7):
        with pytest.raises(ValueError):
            check_webhook_secret(bad)


def test_tries_back_off_fivefold_to_a_ceiling() -> None:
    assert retry_delays(1.0, 300.0, 6) == [1.0, 5.0, 25.0, 125.0, 300.0]
    assert retry_delays(1.0, 300.0, 1) == []
    assert len(retry_delays(0.1, 1.0, 5000)) == 4999 and max(retry_delays(0.1, 1.0, 5000)) == 1.0
