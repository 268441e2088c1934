"""A real local Ray cluster per module, and `vaecast serve --ray auto` front ends on it.

The cluster is started with `ray start --head` in a temporary directory, on ports of
its own (other Ray instances may run on this machine), and ended by killing the
processes of that directory and port (never `ray stop`, which would end every Ray
instance of the user). Front ends are real subprocesses on 127.0.0.1; the test
process itself never imports Ray.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

RAY_START_TIMEOUT_S = 120
# Deploying the replicas took 150 s and more on a machine busy with other work.
FRONT_END_START_TIMEOUT_S = 240
SERVING = re.compile(r"vaecast serving .* on (http://\S+)/")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RayCluster:
    address: str
    temp_dir: Path
    port: int

    def env(self) -> dict[str, str]:
        # Token authentication off, explicitly: otherwise Ray turns it on when a token
        # file exists in ~/.ray, which other Ray instances of this user may create.
        return {
            **os.environ,
            "RAY_ADDRESS": self.address,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
        }

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: those naming its directory or port, and theirs."""
        marks = (str(self.temp_dir), f":{self.port}")
        found: set[psutil.Process] = set()
        for process in psutil.process_iter(["cmdline"]):
            command = " ".join(process.info["cmdline"] or [])
            if any(mark in command for mark in marks) and process.pid != os.getpid():
                found.add(process)
                with contextlib.suppress(psutil.Error):
                    found.update(process.children(recursive=True))
        return list(found)

    def stop(self) -> None:
        for process in self.processes():
            with contextlib.suppress(psutil.Error):
                process.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@dataclass
class FrontEnd:
    process: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)

    def kill(self) -> None:
        """As a crash would: SIGKILL, nothing cleaned up."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


def start_front_end(cluster: RayCluster, *options: str) -> FrontEnd:
    """`vaecast serve --ray auto` on a free port of 127.0.0.1, once it serves."""
    command = [
        sys.executable, "-m", "vaecast.cli", "serve", "--ray", "auto",
        "--host", "127.0.0.1", "--port", "0", "--model", "tiny",
        "--replicas", "2", "--replica-cpus", "0.5", "--max-ongoing", "1",
        "--push-idle-timeout", "60", "--shutdown-grace", "2", *options,
    ]  # fmt: skip
    process = subprocess.Popen(
        ["nice", "-n", "5", *command],
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    serving = threading.Event()
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if (match := SERVING.search(line)) and not found:
                found.append(match.group(1))
                serving.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + FRONT_END_START_TIMEOUT_S
    while not serving.wait(0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_front_end(FrontEnd(process, "", lines))
            raise AssertionError("the front end did not start:\n" + "".join(lines[-40:]))
    return FrontEnd(process, found[0], lines)


def stop_front_end(front_end: FrontEnd) -> None:
    process = front_end.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    if process.stdout is not None:
        process.stdout.close()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    if shutil.which("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    temp_dir = Path(tempfile.mkdtemp(prefix="vcr", dir="/tmp"))  # short: socket paths
    port = free_port()
    cluster = RayCluster(f"127.0.0.1:{port}", temp_dir, port)
    ports = {
        "--port": port,
        "--ray-client-server-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--metrics-export-port": free_port(),
        "--runtime-env-agent-port": free_port(),
    }
    command = [
        "ray", "start", "--head", "--node-ip-address", "127.0.0.1",
        "--num-cpus", "2", "--object-store-memory", "200000000",
        "--include-dashboard", "false", "--temp-dir", str(temp_dir),
        *[str(part) for item in ports.items() for part in item],
    ]  # fmt: skip
    started = time.perf_counter()
    for _attempt in range(2):  # a loaded machine can time a first start out
        result = subprocess.run(
            command,
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=RAY_START_TIMEOUT_S,
            check=False,
        )
        if result.returncode == 0:
            break
        cluster.stop()
        temp_dir.mkdir()
    else:
        raise AssertionError(f"ray start failed:\n{result.stdout}\n{result.stderr}")
    print(f"ray cluster up in {time.perf_counter() - started:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def front_ends(ray_cluster: RayCluster) -> Iterator[tuple[FrontEnd, FrontEnd]]:
    """Two front ends on one cluster: the first deploys the replicas, the second joins."""
    first = start_front_end(ray_cluster)
    second = start_front_end(ray_cluster)
    try:
        yield first, second
    finally:
        for name, front_end in (("A", first), ("B", second)):
            stop_front_end(front_end)
            # Shown by pytest when a test of the module failed: what each front end said.
            print(f"--- front end {name}:\n" + "".join(front_end.lines[-60:]))
