"""The server as a subprocess, watched from outside: /proc, its spill dir, its log."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from chaos.server import ANNOUNCE

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

# Log lines that mean something went wrong inside the server, whatever it answered.
_TROUBLE = re.compile(
    r"Traceback|Error handling request|Task exception was never retrieved|"
    r"Exception in callback|unhandled error|was never awaited|ResourceWarning|"
    r"Task was destroyed|Unclosed|CRITICAL|Unhandled exception"
)


@dataclass(frozen=True, slots=True)
class ProcessStats:
    threads: int
    fds: int
    rss_bytes: int
    spill_files: int


class LogWatch:
    """Copies the server's stderr to a file and tallies the lines that mean trouble,
    keeping the first of each kind with the lines after it (its traceback)."""

    CONTEXT_LINES = 14

    def __init__(self, stream: IO[bytes], path: Path) -> None:
        self.trouble: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._copy, args=(stream, path), name="reliability-log", daemon=True
        )
        self._thread.start()

    def _copy(self, stream: IO[bytes], path: Path) -> None:
        collecting: list[str] | None = None
        with open(path, "ab") as log:
            for line in iter(stream.readline, b""):
                log.write(line)
                text = line.decode(errors="replace").rstrip()[:300]
                if collecting is not None and len(collecting) < self.CONTEXT_LINES:
                    collecting.append(text)
                match = _TROUBLE.search(text)
                if match:
                    with self._lock:
                        self.trouble[match.group(0)] += 1
                        if match.group(0) not in self.examples:
                            collecting = self.examples[match.group(0)] = [text]

    def summary(self) -> dict[str, dict[str, object]]:
        with self._lock:
            return {
                kind: {"lines": count, "first": list(self.examples[kind])}
                for kind, count in self.trouble.items()
            }

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


@dataclass
class ServerUnderTest:
    url: str
    process: subprocess.Popen[bytes]
    spill_dir: Path
    log: LogWatch
    encoder_faults: str
    exit: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stats(self) -> ProcessStats:
        proc = Path(f"/proc/{self.pid}")
        return ProcessStats(
            threads=len(os.listdir(proc / "task")),
            fds=len(os.listdir(proc / "fd")),
            rss_bytes=_status_kib(proc, "VmRSS") * 1024,
            spill_files=len(self.spill_files()),
        )

    def spill_files(self) -> list[str]:
        return sorted(p.name for p in self.spill_dir.iterdir())


def _status_kib(proc: Path, key: str) -> int:
    for line in (proc / "status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@contextlib.contextmanager
def running_server(work_dir: Path, retention_s: float) -> Iterator[ServerUnderTest]:
    """Start `python -m chaos.server`; SIGTERM it at the end and record
    how it exited (`server.exit`)."""
    spill_dir = work_dir / "spill"
    spill_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # OpenMP gives every thread that first runs a parallel torch op its own team of
    # workers, kept while that thread lives: a bounded growth that would read as a
    # thread leak. With one OpenMP thread there are no such workers.
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "chaos.server",
        "--spill-dir",
        str(spill_dir),
        "--retention-s",
        str(retention_s),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env
    )
    assert process.stdout is not None and process.stderr is not None
    log = LogWatch(process.stderr, work_dir / "server.log")
    try:
        line = _announcement(process, process.stdout, work_dir / "server.log")
        url, mode = line.removeprefix(ANNOUNCE).split(" encoder_faults=")
        server = ServerUnderTest(url, process, spill_dir, log, mode)
        yield server
    finally:
        exit_info = _stop(process)
        log.join(STOP_TIMEOUT_S)
        process.stdout.close()
        process.stderr.close()
    exit_info["spill_files_after_exit"] = len(list(spill_dir.iterdir()))
    server.exit = exit_info


def _announcement(process: subprocess.Popen[bytes], stdout: IO[bytes], log: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stdout], [], [], 0.5)
        if ready:
            line = stdout.readline().decode().strip()
            if line.startswith(ANNOUNCE):
                return line
        if process.poll() is not None:
            time.sleep(0.5)  # for the log copier to catch up
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"the reliability server exited with {process.returncode}; its log ends:\n{tail}"
            )
    raise RuntimeError(f"the reliability server did not start in {START_TIMEOUT_S:g} s")


def _stop(process: subprocess.Popen[bytes]) -> dict[str, object]:
    started = time.monotonic()
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(STOP_TIMEOUT_S)
        killed = False
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
        killed = True
    return {"code": code, "seconds": round(time.monotonic() - started, 2), "killed": killed}
