"""The `vaecast` command as a user runs it: decode to a file, serve over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import av
import pytest
import torch

from tests.helpers import decode_mp4, safetensors_bytes, smooth_latents
from tests.helpers.media import x264_options
from tests.helpers.serve_process import vaecast_serve
from vaecast.cli import main


def write_latents(path: Path, frames: int = 3) -> Path:
    path.write_bytes(safetensors_bytes(metadata={"fps": "8"}, latents=smooth_latents(frames)))
    return path


def test_decode_writes_a_playable_mp4(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    latents = write_latents(tmp_path / "z.safetensors")
    output = tmp_path / "out.mp4"
    assert main(["decode", str(latents), "-o", str(output), "--model", "linear"]) == 0
    frames = decode_mp4(output.read_bytes())
    assert len(frames) == 9
    assert frames[0].shape == (48, 64, 3)
    captured = capsys.readouterr()
    assert "3/3 chunks 9/9 frames" in captured.err
    assert captured.out.strip() == f"wrote {output} (9 frames, 64x48, 8 fps)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4", "z.safetensors"]


@pytest.mark.parametrize("command", ["serve", "decode"])
def test_a_mistyped_preset_is_one_usage_line(command: str, tmp_path: Path):
    arguments = [sys.executable, "-m", "vaecast", command, "--preset", "ultrafsat"]
    if command == "decode":
        arguments += [str(write_latents(tmp_path / "z.safetensors")), "-o", "x.mp4"]
    finished = subprocess.run(arguments, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 2
    reason, pointer = finished.stderr.strip().splitlines()
    assert "invalid choice: 'ultrafsat'" in reason and "ultrafast" in reason, finished.stderr
    assert pointer == f"(see vaecast {command} --help)"


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"vaecast {version('vaecast')}"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_the_files_the_commands_write_take_the_umask(tmp_path: Path, umask: int):
    latents = tmp_path / "z.safetensors"
    output = tmp_path / "out.mp4"
    previous = os.umask(umask)
    try:
        scene = ["--scene", "shapes", "--frames", "5", "--width", "64", "--height", "48"]
        assert main(["latents", *scene, "-o", str(latents)]) == 0
        assert main(["decode", str(latents), "-o", str(output)]) == 0
    finally:
        os.umask(previous)
    for written in (latents, output):
        assert written.stat().st_mode & 0o777 == 0o666 & ~umask, written
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.mp4", "z.safetensors"]


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_the_servers_files_take_the_umask(tmp_path: Path, umask: int):
    """A spill file (mkstemp's would be 0600), a store's video file and its lock."""
    from vaecast.server.stream.segment_file import SegmentFile
    from vaecast.store.owners import OwnerLease

    previous = os.umask(umask)
    try:
        spill = SegmentFile.spill(tmp_path)
        stored = SegmentFile(tmp_path / "video.mp4", temporary=False)
        stored.write(b"data", 0)
        lease = OwnerLease(tmp_path / "store")
    finally:
        os.umask(previous)
    files = [spill.path, stored.path, *(tmp_path / "store" / "owners").iterdir()]
    try:
        assert len(files) == 3
        for written in files:
            assert written.stat().st_mode & 0o777 == 0o666 & ~umask, written
    finally:
        spill.close()
        stored.close()
        lease.release()
    assert not spill.path.exists()


def test_decode_takes_the_encoder_quality(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    latents = write_latents(tmp_path / "z.safetensors")
    command = ["decode", str(latents), "--model", "linear", "-o"]
    assert main([*command, str(tmp_path / "default.mp4")]) == 0
    default = x264_options((tmp_path / "default.mp4").read_bytes())
    assert " rc=cqp " in default and " qp=21 " in default
    assert main([*command, str(tmp_path / "qp.mp4"), "--qp", "30"]) == 0
    assert " qp=30 " in x264_options((tmp_path / "qp.mp4").read_bytes())
    assert main([*command, str(tmp_path / "crf.mp4"), "--crf", "18"]) == 0
    assert " crf=18.0 " in x264_options((tmp_path / "crf.mp4").read_bytes())
    capsys.readouterr()
    for option, value, reason in [
        ("--qp", "52", "must be in 0..51, got 52"),
        ("--crf", "-1", "must be in 0..51, got -1"),
        ("--qp", "9" * 5000, "not an integer: '9999"),
    ]:
        with pytest.raises(SystemExit) as exited:
            main([*command, str(tmp_path / "bad.mp4"), option, value])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {option}: {reason}" in err and len(err) < 2000
    assert not (tmp_path / "bad.mp4").exists()


def test_decode_keeps_the_soundtrack_the_server_would_mux(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    rate = 16000
    audio = torch.sin(torch.linspace(0, 2000, rate * 9 // 8)).unsqueeze(0) * 0.5  # 9 frames
    path = tmp_path / "z.safetensors"
    path.write_bytes(
        safetensors_bytes(
            metadata={"fps": "8", "audio_sample_rate": str(rate)},
            latents=smooth_latents(3),
            audio=audio,
        )
    )
    output = tmp_path / "out.mp4"
    assert main(["decode", str(path), "-o", str(output), "--model", "linear"]) == 0
    with av.open(str(output)) as container:
        (stream,) = container.streams.audio
        assert (stream.codec_context.name, stream.sample_rate, stream.channels) == ("aac", rate, 1)
        heard = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(heard - audio.shape[1]) <= 1024  # within one AAC frame of the video's length
    assert capsys.readouterr().out.strip() == (
        f"wrote {output} (9 frames, 64x48, 8 fps, 1 audio channel(s))"
    )


def test_decode_needs_no_web_server_packages(tmp_path: Path):
    # `vaecast decode` runs the same pipeline as the server, without aiohttp.
    latents = write_latents(tmp_path / "z.safetensors")
    script = (
        "import sys\n"
        "from vaecast.cli import main\n"
        f"assert main(['decode', {str(latents)!r}, '-o', {str(tmp_path / 'o.mp4')!r},"
        " '--model', 'linear']) == 0\n"
        "assert 'aiohttp' not in sys.modules, 'aiohttp was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)


def test_decode_of_bad_latents_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(safetensors_bytes(z=smooth_latents(2)))
    assert main(["decode", str(bad), "-o", str(tmp_path / "out.mp4"), "--model", "linear"]) == 2
    assert "no tensor named 'latents'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


def test_a_failed_decode_leaves_no_file_under_the_output_name(
    tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]
):
    calls = []

    def failing_encode(self, frames):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk on fire (simulated)")
        return original(self, frames)

    from vaecast.codecs.stream import VideoStreamEncoder

    original = VideoStreamEncoder.encode_chunk
    monkeypatch.setattr(VideoStreamEncoder, "encode_chunk", failing_encode)
    output = tmp_path / "out.mp4"
    output.write_bytes(b"the previous, good file")
    latents = write_latents(tmp_path / "z.safetensors")
    assert main(["decode", str(latents), "-o", str(output), "--model", "linear"]) == 2
    assert "vaecast: error: the encoder failed: disk on fire (simulated)" in capsys.readouterr().err
    assert output.read_bytes() == b"the previous, good file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4", "z.safetensors"]


@pytest.mark.slow
def test_serve_answers_on_a_free_port_and_stops_on_sigterm(tmp_path: Path):
    log_path = tmp_path / "server.log"
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            [sys.executable, "-m", "vaecast", "serve", "--model", "linear", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        ) as process,
    ):
        try:
            line = process.stdout.readline()  # type: ignore[union-attr]
            assert line.startswith("vaecast serving linear on http://127.0.0.1:"), line
            url = line.split(" on ")[1].strip()
            request = urllib.request.Request(
                url + "v1/videos/stream",
                data=safetensors_bytes(latents=smooth_latents(2)),
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.headers["Content-Type"].startswith("video/mp4")
                assert len(decode_mp4(response.read())) == 5
            with urllib.request.urlopen(url + "healthz", timeout=10) as response:
                assert b'"status": "ok"' in response.read()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
    assert "status=completed" in log_path.read_text()


def test_latents_from_a_scene_and_from_a_video_decode_with_tiny(tmp_path: Path):
    scene = tmp_path / "scene.safetensors"
    args = ["--frames", "5", "--width", "64", "--height", "48", "--fps", "12"]
    assert main(["latents", "--scene", "shapes", *args, "-o", str(scene)]) == 0
    video = tmp_path / "scene.mp4"
    assert main(["decode", str(scene), "-o", str(video)]) == 0  # default model: tiny
    frames = decode_mp4(video.read_bytes())
    assert (len(frames), frames[0].shape) == (5, (48, 64, 3))
    again = tmp_path / "again.safetensors"
    assert main(["latents", "--video", str(video), "-o", str(again)]) == 0
    from safetensors import safe_open

    with safe_open(str(again), "pt") as handle:
        assert handle.get_tensor("latents").shape == (1, 16, 2, 6, 8)
        assert handle.metadata()["fps"] == "12"


def test_latents_refuses_an_unknown_scene(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["latents", "--scene", "moon", "-o", str(tmp_path / "z.safetensors")]) == 2
    assert "unknown scene 'moon'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_decode_with_user_supplied_taehv_weights(tmp_path: Path):
    from safetensors.torch import save_file

    from vaecast.models.taehv import TAEHVConfig, TAEHVNet

    weights = tmp_path / "taew2_1_small.safetensors"
    save_file(TAEHVNet(TAEHVConfig(widths=(8, 8, 4, 4))).state_dict(), weights)
    latents = write_latents(tmp_path / "z.safetensors", frames=2)
    output = tmp_path / "out.mp4"
    command = ["decode", str(latents), "-o", str(output), "--model", "taehv"]
    assert main([*command, "--weights", str(weights)]) == 0
    assert len(decode_mp4(output.read_bytes())) == 5


def test_a_model_that_needs_weights_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    latents = write_latents(tmp_path / "z.safetensors")
    command = ["decode", str(latents), "-o", str(tmp_path / "out.mp4")]
    assert main([*command, "--model", "taehv"]) == 2
    assert "the taehv decoder needs a weights file" in capsys.readouterr().err
    assert main([*command, "--model", "linear", "--weights", str(latents)]) == 2
    assert "model 'linear' takes no --weights" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["decode", "serve"])
def test_weights_for_a_model_that_is_not_served_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
):
    arguments = ["--model", "linear", "--weights", "taehv=taew2_1.safetensors"]
    if command == "decode":
        latents = write_latents(tmp_path / "z.safetensors")
        arguments = [str(latents), "-o", str(tmp_path / "out.mp4"), *arguments]
    else:
        arguments = [*arguments, "--port", "0"]  # refused before anything binds
    assert main([command, *arguments]) == 2
    assert capsys.readouterr().err == (
        "vaecast: error: --weights taehv=taew2_1.safetensors: model 'taehv' is not served "
        "here (served: linear)\n"
    )


def test_serve_refuses_weights_for_a_model_that_takes_none(capsys: pytest.CaptureFixture[str]):
    command = ["serve", "--model", "tiny", "--model", "linear", "--port", "0"]
    assert main([*command, "--weights", "linear=w.safetensors"]) == 2
    assert "model 'linear' takes no --weights" in capsys.readouterr().err
    # A bare PATH is the first model's, and only a known model's name counts as MODEL=.
    assert main([*command[:2], *command[4:], "--weights", "a=b.safetensors"]) == 2
    assert "model 'linear' takes no --weights" in capsys.readouterr().err


def test_a_path_with_an_equals_sign_is_a_path(tmp_path: Path):
    from safetensors.torch import save_file

    from vaecast.models.taehv import TAEHVConfig, TAEHVNet

    weights = tmp_path / "run=1.safetensors"
    save_file(TAEHVNet(TAEHVConfig(widths=(8, 8, 4, 4))).state_dict(), weights)
    latents = write_latents(tmp_path / "z.safetensors", frames=2)
    output = tmp_path / "out.mp4"
    command = ["decode", str(latents), "-o", str(output), "--model", "taehv"]
    assert main([*command, "--weights", str(weights)]) == 0
    assert len(decode_mp4(output.read_bytes())) == 5


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--store-max-gb", "nan"),
        ("--store-max-gb", "inf"),
        ("--store-max-gb", "0"),
        ("--min-body-rate", "-5"),
        ("--body-rate-grace", "nan"),
        ("--max-pending", "0"),
        ("--push-first-block-timeout", "-1"),
    ],
)
def test_store_and_admission_numbers_out_of_range_are_one_usage_line(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", option, value])
    assert exit_info.value.code == 2
    error, pointer = capsys.readouterr().err.strip().splitlines()
    assert error.startswith(f"vaecast serve: error: argument {option}: must be a finite number")
    assert pointer == "(see vaecast serve --help)"


@pytest.mark.parametrize(
    ("preview", "error"),
    [
        ("tiny", "--preview 'tiny': give MODEL=DECODER, e.g. wan2.1=taehv"),
        ("wan2.1=taehv", "--preview 'wan2.1=taehv': model 'wan2.1' is not served (--model tiny)"),
        (
            "tiny=taehv",
            "preview decoder 'taehv' is not served here; a preview may be: linear, tiny "
            "(a --model of the server, or linear)",
        ),
    ],
)
def test_a_preview_the_server_cannot_make_is_one_line_before_the_port_opens(
    preview: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--preview", preview, "--port", "0", "--store", "none"]) == 2
    assert capsys.readouterr().err == f"vaecast: error: {error}\n"


def test_serve_with_a_default_preview_on_a_preview_device(tmp_path: Path) -> None:
    arguments = ["--preview", "tiny=linear", "--preview-device", "cpu", "--store", "none"]
    with vaecast_serve(arguments, tmp_path / "serve.log") as url:
        body = write_latents(tmp_path / "z.safetensors", frames=2).read_bytes()
        request = urllib.request.Request(f"{url}v1/videos", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            job = json.loads(response.read())
    assert job["variants"]["preview"]["decoder"] == "linear"
