"""Joining a Ray cluster: `vaecast serve --ray local | auto | ray://HOST:PORT`.

Ray is imported here, and only when a server is started with `--ray`: without it,
nothing in vaecast imports Ray. An unreachable cluster is a `ClusterUnavailableError`
with the address in its message, which `vaecast serve` prints as one line.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from vaecast.cluster.records import NAMESPACE
from vaecast.errors import ClusterUnavailableError, InvalidRequestError

ADDRESS_FORMS = "local, auto or ray://HOST:PORT"
DEFAULT_TOKEN_FILE = Path.home() / ".ray" / "auth_token"
# Ray Client retries an unreachable server three times, waiting up to 30 s each by
# default: at start-up a wrong address should fail within seconds.
CLIENT_TIMEOUTS_S = {
    "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "2",
    "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "2",
}


def check_address(address: str) -> str:
    if address in ("local", "auto") or (address.startswith("ray://") and len(address) > 6):
        return address
    raise InvalidRequestError(f"--ray {address!r}: give {ADDRESS_FORMS}")


def connect(address: str) -> None:
    """Join the cluster at `address` (see ADDRESS_FORMS), in Ray namespace NAMESPACE.

    `local` starts a Ray instance inside this process, with this machine's CPUs and
    no dashboard; `auto` joins the cluster this machine is part of (after `ray start`).
    """
    check_address(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address != "local" and "RAY_AUTH_MODE" not in os.environ and DEFAULT_TOKEN_FILE.exists():
        # As `ray start` decides for the cluster: a token file there turns token
        # authentication on, and a client must then present the token too. Ray reads
        # the mode when it is imported, so this comes first.
        os.environ["RAY_AUTH_MODE"] = "token"
    if address.startswith("ray://"):
        for name, value in CLIENT_TIMEOUTS_S.items():
            os.environ.setdefault(name, value)
    try:
        import ray
    except ImportError:
        raise ClusterUnavailableError("--ray needs Ray Serve: pip install 'vaecast[ray]'") from None
    options: dict[str, object] = {
        "namespace": NAMESPACE,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if address == "local":
        options["include_dashboard"] = False
    try:
        with warnings.catch_warnings():  # Ray Client warns, then raises: the error says it
            warnings.simplefilter("ignore")
            ray.init(address=address, **options)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ClusterUnavailableError(
            f"cannot reach the Ray cluster at {address}: {first_line}"
        ) from None
