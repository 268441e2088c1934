"""vaecast.pipeline.heap: freed decode-sized blocks stay mapped for the next chunk (glibc only).

Each case runs in a fresh interpreter, so this process's malloc is left as it is and
glibc's adaptive thresholds start from their defaults.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import textwrap
from collections.abc import Coroutine
from typing import Any

import pytest

# A decode-sized block: past glibc's default mmap threshold (128 KiB), under the
# 32 MiB that vaecast.pipeline.heap sets.
BLOCK_MIB = 24

PROBE = textwrap.dedent(
    f"""
    import ctypes, ctypes.util, json, sys
    from vaecast.pipeline.heap import retain_decode_heap

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    applied = retain_decode_heap() if sys.argv[1] == "retain" else None
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    size = {BLOCK_MIB} * 2**20
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)  # touch every page: it counts in RSS now
    touched = rss_mib()
    libc.free(block)
    print(json.dumps({{"applied": applied, "given_back_mib": touched - rss_mib()}}))
    """
)


def _probe(mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _is_glibc() -> bool:
    path = ctypes.util.find_library("c")
    return path is not None and hasattr(ctypes.CDLL(path), "gnu_get_libc_version")


@pytest.mark.skipif(not _is_glibc(), reason="the settings are glibc's")
def test_a_freed_decode_sized_block_stays_mapped_only_with_the_settings() -> None:
    default = _probe("default")
    retained = _probe("retain")
    # glibc's default: the block was its own mapping, unmapped by free().
    assert default["given_back_mib"] > BLOCK_MIB * 0.9, default
    # With the settings it came from the heap and stays there for the next chunk.
    assert retained["applied"] is True
    assert retained["given_back_mib"] < 1, retained


ARENAS_PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util, sys, threading
    from vaecast.pipeline.heap import retain_decode_heap

    if sys.argv[1] == "retain":
        retain_decode_heap()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    all_in = threading.Barrier(7)

    def allocate():
        block = libc.malloc(1 << 20)  # while every other thread holds one too
        all_in.wait()
        libc.free(block)

    threads = [threading.Thread(target=allocate) for _ in range(6)]
    for thread in threads:
        thread.start()
    all_in.wait()
    for thread in threads:
        thread.join()
    libc.malloc_stats()  # to stderr: one "Arena N:" block per arena
    """
)


def _arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ARENAS_PROBE, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(not _is_glibc(), reason="the settings are glibc's")
def test_threads_share_one_arena_with_the_settings() -> None:
    # Six threads allocating at once: glibc's default gives most of them an arena each
    # (up to 8 per core), each keeping its own peak mapped; the settings cap the
    # process at two arenas (the main one and one more), which the threads share.
    assert _arenas("default") > 2
    assert _arenas("retain") == 2


def test_vaecast_serve_applies_the_settings_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the models load in threads: set after threads had allocated, the settings
    left a worker thread's decode 1.11x the main thread's (applied first: 1.00x)."""
    import vaecast.cli.serve as serve_command
    from vaecast.cli import main

    calls: list[str] = []
    monkeypatch.setattr(serve_command, "retain_decode_heap", lambda: calls.append("heap"))

    def run_loop(coroutine: Coroutine[Any, Any, Any]) -> None:
        coroutine.close()  # the models would load in here, in threads
        calls.append("loop")

    monkeypatch.setattr(serve_command, "run_loop", run_loop)
    assert main(["serve", "--model", "linear"]) == 0
    assert calls == ["heap", "loop"]
