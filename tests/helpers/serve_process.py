"""`vaecast serve` as a user starts it: a real process on a free port of 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

START_TIMEOUT_S = 120.0


@contextlib.contextmanager
def vaecast_serve(
    arguments: list[str], log_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """Run `vaecast serve --port 0 ARGUMENTS`; yields its base URL ("http://127.0.0.1:N/")
    once it announces it, and stops it (SIGTERM, then SIGKILL) on exit. Its stderr
    goes to `log_path`, quoted in the failure when it never comes up."""
    with vaecast_serve_process(arguments, log_path, env) as (url, _):
        yield url


@contextlib.contextmanager
def vaecast_serve_process(
    arguments: list[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    own_group: bool = False,
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`vaecast_serve`, yielding its process too (to signal it, or find its children).
    `own_group`: in a process group of its own, which a test may signal as a terminal's
    Ctrl-C or a service manager's stop signals every process of the server."""
    command = [sys.executable, "-m", "vaecast", "serve", "--port", "0", *arguments]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=environment,
            process_group=0 if own_group else None,
        ) as process,
    ):
        try:
            line = _announcement(process)
            if " on http://" not in line:
                raise AssertionError(
                    f"vaecast serve did not start ({line!r}): {log_path.read_text()[-3000:]}"
                )
            yield line.split(" on ")[1].strip(), process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()


def _announcement(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    # readline returns "" if the process exits first; the timeout bounds a hang.
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=START_TIMEOUT_S):
            return f"no line within {START_TIMEOUT_S} s"
    return process.stdout.readline()
