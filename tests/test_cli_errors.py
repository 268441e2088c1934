"""Every mistake a user can make on the command line is one line, a cause, and exit
status 2, through the real `vaecast` command in a subprocess; `--debug` shows the
traceback instead.

Each class of issue 36 has a case: a missing file, an unreadable file, a port in use, a
bad port, a missing output folder, an unwritable output, a device this machine lacks, an
unknown model, weights that do not fit, typo'd flags and conflicting flags (a bad
setting of `serve` is refused before its port opens: tests/test_serve_start_checks.py).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.cli_process import one_error_line, vaecast


@pytest.fixture
def latents(tmp_path: Path) -> Path:
    path = tmp_path / "z.safetensors"
    path.write_bytes(safetensors_bytes(latents=smooth_latents(2)))
    return path


def test_a_missing_input_file(tmp_path: Path):
    line = one_error_line(vaecast("decode", str(tmp_path / "nope.safetensors"), "-o", "x.mp4"))
    assert line == f"vaecast: error: {tmp_path / 'nope.safetensors'}: No such file or directory"


def test_an_output_folder_that_does_not_exist(latents: Path, tmp_path: Path):
    line = one_error_line(
        vaecast("decode", str(latents), "-o", str(tmp_path / "no" / "x.mp4"), "--model", "linear")
    )
    assert line == f"vaecast: error: {tmp_path / 'no'}: -o names a folder that does not exist"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["z.safetensors"]


def test_a_device_this_machine_lacks(latents: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = one_error_line(vaecast("decode", str(latents), "-o", "x.mp4", "--device", "cuda"))
    assert "argument --device: 'cuda': CUDA is not available here" in line
    line = one_error_line(vaecast("serve", "--device", "gpu"))
    assert "argument --device: not a torch device: 'gpu'" in line


def test_a_port_in_use(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        finished = vaecast("serve", "--port", str(port), "--store", "none", "--model", "linear")
    line = one_error_line(finished)
    assert line.startswith("vaecast: error: cannot listen: the address is already in use")


def test_debug_shows_the_traceback(tmp_path: Path):
    finished = vaecast("--debug", "decode", str(tmp_path / "nope.safetensors"), "-o", "x.mp4")
    assert finished.returncode != 0
    assert "Traceback" in finished.stderr and "FileNotFoundError" in finished.stderr


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--qp", "20", "--crf", "23"], "argument --crf: not allowed with argument --qp"),
        (["--keyframe-interval", "nan"], "argument --keyframe-interval: must be a positive"),
        (["--keyframe-interval", "-1"], "argument --keyframe-interval: must be a positive"),
        (["--qp", "99"], "argument --qp: must be in 0..51, got 99"),
        (["--preset", "ultrafsat"], "argument --preset: invalid choice: 'ultrafsat'"),
    ],
)
def test_conflicting_and_out_of_range_encoder_flags(latents: Path, flags: list[str], says: str):
    line = one_error_line(vaecast("decode", str(latents), "-o", "x.mp4", *flags))
    assert says in line, line


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (
            ["decode", "z.safetensors", "--ouput", "x.mp4"],
            "vaecast decode: error: unknown option --ouput; did you mean --output?",
        ),
        (
            ["serve", "--prot", "8000"],
            "vaecast serve: error: unknown option --prot; did you mean --port?",
        ),
        (
            ["serve", "--zzz"],
            "vaecast serve: error: unknown option --zzz (see vaecast serve --help)",
        ),
        (["--verison"], "vaecast: error: unknown option --verison; did you mean --version?"),
    ],
)
def test_a_typo_in_a_flag_names_the_flag_meant(arguments: list[str], says: str):
    assert one_error_line(vaecast(*arguments)) == says


def test_an_abbreviated_flag_still_works(latents: Path, tmp_path: Path):
    finished = vaecast(
        "decode", str(latents), "--out", str(tmp_path / "x.mp4"), "--model", "linear"
    )
    assert finished.returncode == 0, finished.stderr


def test_json_logs_are_one_object_a_line_with_the_job_id(tmp_path: Path):
    import json
    import urllib.request

    from tests.helpers.serve_process import vaecast_serve

    log_path = tmp_path / "serve.log"
    body = safetensors_bytes(latents=smooth_latents(2))
    arguments = ["--log-format", "json", "--log-level", "info", "--store", "none"]
    with vaecast_serve([*arguments, "--model", "linear"], log_path) as url:
        request = urllib.request.Request(f"{url}v1/videos?fps=8", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            job_id = json.load(response)["id"]
        with urllib.request.urlopen(f"{url}v1/videos/{job_id}/content", timeout=30) as response:
            response.read()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert any(line.get("job_id") == job_id and "completed" in line["message"] for line in lines)


def test_every_serve_option_reads_its_environment_variable(monkeypatch: pytest.MonkeyPatch):
    from vaecast.cli.parser import build_parser

    monkeypatch.setenv("VAECAST_MAX_FRAMES", "7")
    monkeypatch.setenv("VAECAST_ALLOWED_HOST", "a.example, b.example")
    monkeypatch.setenv("VAECAST_PREVIEW_DEVICE", "cpu")
    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert (args.max_frames, args.allowed_host) == (7, ["a.example", "b.example"])
    assert parser.parse_args(["serve", "--max-frames", "9"]).max_frames == 9  # a flag wins
    helps = vaecast("serve", "--help").stdout
    for option in ("--port", "--max-frames", "--ice-server", "--store", "--api-key"):
        assert "VAECAST_" + option[2:].upper().replace("-", "_") in helps, option


def test_a_bad_environment_value_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VAECAST_PORT", "eighty")
    line = one_error_line(vaecast("serve"))
    assert line == "vaecast: error: VAECAST_PORT='eighty': not a port number: 'eighty'"


TINY_WEIGHTS = Path(__file__).parents[1] / "vaecast" / "models" / "weights" / "tiny.safetensors"


@pytest.mark.parametrize(
    ("case", "says"),
    [
        # An unreadable input (as root, chmod 000 reads anyway): a folder, or not latents.
        ("input-is-a-folder", "vaecast: error: {tmp}: Is a directory"),
        (
            "input-is-not-latents",
            "vaecast: error: {tmp}/notes.txt: not a latent file: the upload is not a "
            "safetensors or .npy file",
        ),
        # Unwritable output: a folder that is a file, a folder no file can go in, a folder.
        (
            "output-under-a-file",
            "vaecast: error: {tmp}/notes.txt: -o names a folder that is a file",
        ),
        ("output-in-proc", "vaecast: error: -o /proc: cannot write a file there"),
        ("output-is-a-folder", "vaecast: error: {tmp}: -o names a folder, not a file"),
        (
            "unknown-model",
            "vaecast: error: unknown model 'nosuch'; this server knows:",
        ),
        (
            "weights-of-another-model",
            f"vaecast: error: --model taehv: {TINY_WEIGHTS} is not a TAEHV decoder: missing keys:",
        ),
    ],
)
def test_each_class_of_decode_mistake_is_one_line(
    latents: Path, tmp_path: Path, case: str, says: str
):
    notes = tmp_path / "notes.txt"
    notes.write_text("not latents")
    output = str(tmp_path / "x.mp4")
    arguments = {
        "input-is-a-folder": [str(tmp_path), "-o", output],
        "input-is-not-latents": [str(notes), "-o", output],
        "output-under-a-file": [str(latents), "-o", str(notes / "x.mp4")],
        "output-in-proc": [str(latents), "-o", "/proc/x.mp4"],
        "output-is-a-folder": [str(latents), "-o", str(tmp_path)],
        "unknown-model": [str(latents), "-o", output, "--model", "nosuch"],
        "weights-of-another-model": [
            *(str(latents), "-o", output),
            *("--model", "taehv", "--weights", str(TINY_WEIGHTS)),
        ],
    }[case]
    line = one_error_line(vaecast("decode", *arguments))
    assert line.startswith(says.format(tmp=tmp_path)), line
    assert not (tmp_path / "x.mp4").exists()


def test_a_bad_port_is_the_reason_and_where_help_is():
    finished = vaecast("serve", "--port", "70000")
    assert finished.returncode == 2
    assert finished.stderr.splitlines() == [
        "vaecast serve: error: argument --port: a port is 0-65535 (0: any free one), got 70000",
        "(see vaecast serve --help)",
    ]


def test_a_usage_mistake_of_decode_is_two_lines_not_the_synopsis(latents: Path):
    finished = vaecast("decode", str(latents), "-o", "x.mp4", "--fps")
    assert finished.stderr.splitlines() == [
        "vaecast decode: error: argument --fps: expected one argument",
        "(see vaecast decode --help)",
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("-1", "a port is 0-65535 (0: any free one), got -1"),
        ("65536", "a port is 0-65535 (0: any free one), got 65536"),
        ("eighty", "not a port number: 'eighty'"),
        ("8.5", "not a port number: '8.5'"),
    ],
)
def test_what_a_port_may_be(text: str, says: str):
    import argparse

    from vaecast.cli.option_types import port_number

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        port_number(text)
    assert str(refused.value) == says
    assert [port_number(p) for p in ("0", "8000", "65535")] == [0, 8000, 65535]
