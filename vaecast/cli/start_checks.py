"""Settings that `vaecast serve` opens or tries once at start, before its port opens.

argparse checks each value alone (a preset's name, a number's range); what only the
library that uses a setting can judge is tried here with the real thing: the encoder
settings open a real libx264 context, the spill folder takes a real file. A setting
that would fail every job then ends the start with one line naming the option, its
value and what went wrong, instead of a server whose `/healthz` says ready. (The
models and their weights are loaded before the port opens too, `vaecast.cli.serve`;
`load_decoder` names the option of a model that fails.)
"""

from __future__ import annotations

import math
import socket
import tempfile
from fractions import Fraction
from pathlib import Path

import av

from vaecast.codecs.h264 import EncoderSettings, H264Encoder
from vaecast.errors import InvalidRequestError

# The smallest frame x264 opens for (two macroblocks a side): the check's cost is the
# open, not the frame size.
_CHECK_FRAME_PX = 32
_MAX_C_INT = 2**31 - 1


def check_listen_address(host: str) -> None:
    """`--host` is bound for a moment (on a free port), before anything loads: a name
    that does not resolve, or an address this machine does not have, is one line now
    rather than after the models have loaded. (A port in use is found by the real bind,
    which says so in its own line.)"""
    try:
        found = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise InvalidRequestError(f"--host {host[:200]}: not an address here ({reason})") from None
    for family, kind, protocol, _, address in found:
        with socket.socket(family, kind, protocol) as probe:
            try:
                probe.bind(address)
            except OSError as error:
                raise InvalidRequestError(
                    f"--host {host[:200]}: cannot listen on {address[0]} ({error.strerror})"
                ) from None


def check_encoder(settings: EncoderSettings, fps: Fraction) -> None:
    """Open and close one libx264 encoder with `settings` at `fps`, as every job's is."""
    try:
        H264Encoder(_CHECK_FRAME_PX, _CHECK_FRAME_PX, fps, settings).close()
    except OverflowError:
        # x264's GOP size, twice the interval in frames, is a C int.
        longest_s = (_MAX_C_INT // 2) / fps
        raise InvalidRequestError(
            f"--keyframe-interval {settings.keyframe_interval_s:g}: at {fps} fps it may be "
            f"at most {math.floor(longest_s)} seconds"
        ) from None
    except (ValueError, av.FFmpegError) as error:
        rate_control, quality = settings.rate_control
        given = (
            f"--preset {settings.preset} --{rate_control} {quality} "
            f"--keyframe-interval {settings.keyframe_interval_s:g} --fps {fps}"
        )
        raise InvalidRequestError(
            f"{given}: libx264 does not open with these settings ({error})"
        ) from None


def check_writable_folder(option: str, folder: str | None) -> None:
    """`option`'s folder exists and takes a new file (None: the default, $TMPDIR).

    Tried with a real file rather than `os.access`: as root, `access` says yes to
    folders that refuse every file (/proc, a read-only mount)."""
    if folder is None:
        return
    if not Path(folder).is_dir():
        problem = "does not exist" if not Path(folder).exists() else "is not a folder"
        raise InvalidRequestError(f"{option} {folder}: {problem}; give a writable folder")
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".vaecast-check-"):
            pass
    except OSError as error:
        raise InvalidRequestError(
            f"{option} {folder}: cannot write a file there ({error.strerror or error})"
        ) from None
