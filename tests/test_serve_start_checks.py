"""`vaecast serve` tries every setting a job depends on before its port opens: a bad
one ends the start with one line naming the option and exit status 2, and no port
was ever listened on. Through the real command, in a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.cli_process import TIMEOUT_S, one_error_line

TINY_WEIGHTS = Path(__file__).parents[1] / "vaecast" / "models" / "weights" / "tiny.safetensors"


def truncated_safetensors(path: Path) -> Path:
    whole = path.with_suffix(".whole")
    save_file({"decoder.1.weight": torch.zeros(64, 16, 3, 3)}, str(whole))
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def serve_on_held_port(*flags: str) -> subprocess.CompletedProcess[str]:
    """Start `vaecast serve` on a port this test listens on itself: a check made after
    the bind would end in 'address already in use', never in its own line."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        command = [sys.executable, "-m", "vaecast", "serve", "--port", str(port)]
        return subprocess.run(
            [*command, "--store", "none", *flags],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )


def bad_settings(tmp_path: Path) -> list[tuple[list[str], str]]:
    """A bad setting of each kind (a missing plugin module: tests/server/test_plugins.py;
    a cut weights file: the test below)."""
    (tmp_path / "a-file").write_text("")
    return [
        (
            ["--model", "nosuch"],
            "unknown model 'nosuch'; this server knows: cogvideox, diffusers,",
        ),
        (
            ["--model", "taehv", "--weights", str(TINY_WEIGHTS)],
            f"--model taehv: {TINY_WEIGHTS} is not a TAEHV decoder: missing keys: decoder.1.weight",
        ),
        (
            ["--model", "linear", "--preview", "linear=nosuch"],
            "preview decoder 'nosuch' is not served here; a preview may be: linear",
        ),
        (
            ["--model", "linear", "--keyframe-interval", "1e12"],
            "--keyframe-interval 1e+12: at 16 fps it may be at most 67108863 seconds",
        ),
        (
            ["--model", "linear", "--spill-dir", str(tmp_path / "a-file")],
            f"--spill-dir {tmp_path / 'a-file'}: is not a folder; give a writable folder",
        ),
        (  # TEST-NET-1 (RFC 5737): an address no machine here has
            ["--model", "linear", "--host", "192.0.2.1"],
            "--host 192.0.2.1: cannot listen on 192.0.2.1 (Cannot assign requested address)",
        ),
    ]


@pytest.mark.slow
def test_each_bad_setting_ends_the_start_before_the_port_opens(tmp_path: Path):
    for flags, says in bad_settings(tmp_path):
        line = one_error_line(serve_on_held_port(*flags))
        assert line.startswith(f"vaecast: error: {says}"), (flags, line)


def test_a_preview_device_this_machine_lacks_is_refused_at_start():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = one_error_line(serve_on_held_port("--model", "linear", "--preview-device", "cuda"))
    assert line.startswith("vaecast serve: error: argument --preview-device: 'cuda': CUDA is not")


@pytest.mark.slow
def test_nothing_ever_listens_on_the_port_of_a_refused_start(tmp_path: Path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cut = truncated_safetensors(tmp_path / "cut.safetensors")
    command = [sys.executable, "-m", "vaecast", "serve", "--port", str(port), "--store", "none"]
    server = subprocess.Popen(
        [*command, "--model", "taehv", "--weights", str(cut)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    tries, answered = 0, 0
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while server.poll() is None and time.monotonic() < deadline:
            with socket.socket() as client:
                answered += client.connect_ex(("127.0.0.1", port)) == 0
            tries += 1
            time.sleep(0.005)
    finally:
        if server.poll() is None:
            server.kill()
        _, stderr = server.communicate(timeout=TIMEOUT_S)
    assert server.returncode == 2, stderr
    assert (answered, "Traceback" in stderr) == (0, False), stderr
    assert tries > 10  # it was polled while the server started (torch's import alone)
    assert stderr.strip().splitlines()[-1] == (
        f"vaecast: error: --model taehv: {cut}: not a readable safetensors file: "
        "Error while deserializing header: incomplete metadata, file not fully covered"
    )


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--decode-slots", "0", "must be a finite number at least 1, got 0"),
        ("--decode-slots", "100000", "must be at most 256, got 100000"),
        ("--max-frames", "0", "must be a finite number at least 1, got 0"),
        ("--max-upload-mb", "-1", "must be a finite number at least 1, got -1"),
        ("--max-pixels", "lots", "not a number: 'lots'"),
        ("--max-queued", "-1", "must be a finite number at least 0, got -1"),
        ("--push-queue-blocks", "0", "must be a finite number at least 1, got 0"),
        ("--reader-timeout", "nan", "must be a finite number more than 0, got nan"),
        ("--header-timeout", "0", "must be a finite number more than 0, got 0"),
        ("--body-timeout", "inf", "must be a finite number more than 0, got inf"),
        ("--push-idle-timeout", "-2", "must be a finite number more than 0, got -2"),
        ("--retention", "-5", "must be a finite number at least 0, got -5"),
        ("--retention-memory-mb", "-1", "must be a finite number at least 0, got -1"),
        ("--spill-threshold-mb", "-1", "must be a finite number at least 0, got -1"),
        ("--shutdown-grace", "nan", "must be a finite number at least 0, got nan"),
    ],
)
def test_a_number_no_job_could_run_with_is_one_usage_line(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
):
    """A server with no decode slot, no frame allowed or a NaN timeout used to start
    and refuse or hang every job (--decode-slots 0 was a traceback)."""
    from vaecast.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["serve", flag, value])
    assert ended.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == [f"vaecast serve: error: argument {flag}: {says}"]
