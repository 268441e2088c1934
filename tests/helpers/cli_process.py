"""The `vaecast` command as a user runs it, in a subprocess, and what its errors must be."""

from __future__ import annotations

import subprocess
import sys

TIMEOUT_S = 120


def vaecast(*arguments: str) -> subprocess.CompletedProcess[str]:
    """`vaecast ARGUMENTS` with this checkout's code (`python -m vaecast`)."""
    return subprocess.run(
        [sys.executable, "-m", "vaecast", *arguments],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def one_error_line(finished: subprocess.CompletedProcess[str]) -> str:
    """The one `error:` line of a command that ended with status 2, with no traceback
    and no synopsis."""
    assert finished.returncode == 2, finished
    assert "Traceback" not in finished.stderr, finished.stderr
    assert "usage:" not in finished.stderr, finished.stderr
    errors = [line for line in finished.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, finished.stderr
    return errors[0]
