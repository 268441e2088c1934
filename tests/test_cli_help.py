"""`vaecast --help` and each command's `--help`, as the real CLI prints them, show
every option's default."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from vaecast.cli.help import shown_default
from vaecast.cli.parser import build_parser

COMMANDS = ("", "serve", "latents", "decode", "push")
# Wide enough that argparse wraps no default across lines.
COLUMNS = "200"


def option_helps(text: str) -> dict[str, str]:
    """Each option's help in argparse's `--help` output, keyed by its last flag, its
    wrapped lines joined: an entry starts at '  -', goes on at a deeper indent."""
    helps: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("  -"):
            invocation, _, first = line.strip().partition("  ")
            flags = [word.rstrip(",") for word in invocation.split() if word.startswith("-")]
            current = flags[-1]
            helps[current] = first.strip()
        elif current is not None and line.startswith("    "):
            helps[current] = f"{helps[current]} {line.strip()}".strip()
        else:
            current = None
    return helps


def parsers() -> dict[str, argparse.ArgumentParser]:
    top = build_parser()
    found = {"": top}
    for action in top._actions:  # argparse keeps no public list of its commands
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def options_with_a_default(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user may leave out, switches aside (off unless given)."""
    required_groups = {
        id(action)
        for group in parser._mutually_exclusive_groups
        if group.required
        for action in group._group_actions
    }
    return [
        action
        for action in parser._actions
        if action.option_strings
        and action.nargs != 0
        and not action.required
        and id(action) not in required_groups
        and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
    ]


def printed_help(command: str) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("VAECAST_")}
    arguments = [sys.executable, "-m", "vaecast", *([command] if command else []), "--help"]
    finished = subprocess.run(
        arguments,
        capture_output=True,
        text=True,
        timeout=60,
        env={**environment, "COLUMNS": COLUMNS},
    )
    assert finished.returncode == 0, finished.stderr
    return finished.stdout


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("VAECAST_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_shows_its_default(
    command: str, clean_environment: None, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("COLUMNS", COLUMNS)
    parser = parsers()[command]
    # The real CLI once (its largest help, every VAECAST_ note in it); argparse prints
    # the others' format_help() as it is.
    helps = option_helps(printed_help(command) if command == "serve" else parser.format_help())
    options = options_with_a_default(parser)
    assert options
    for action in options:
        flag = action.option_strings[-1]
        assert flag in helps, f"{command or 'vaecast'} --help lacks {flag}"
        text = helps[flag]
        assert re.search(r"\bdefault\b", text), f"{flag}: {text!r} says no default"
        value = shown_default(action)
        if value is not None:
            assert value in text, f"{flag}: {text!r} does not show its default {value!r}"


def test_the_option_parser_reads_help_as_argparse_prints_it():
    text = (
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  -o OUTPUT, --output OUTPUT\n"
        "                        where the file goes (default:\n"
        "                        out.mp4)\n"
        "\n"
        "across machines (Ray Serve):\n"
        "  decode on a Ray Serve deployment\n"
        "\n"
        "  --ray ADDRESS         local or auto (default: none)\n"
    )
    assert option_helps(text) == {
        "--help": "show this help message and exit",
        "--output": "where the file goes (default: out.mp4)",
        "--ray": "local or auto (default: none)",
    }


def test_a_default_goes_before_the_environment_note():
    parser = argparse.ArgumentParser(prog="x", formatter_class=build_parser().formatter_class)
    parser.add_argument("--port", type=int, default=8000, help="0 picks one (env VAECAST_PORT)")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds")
    parser.add_argument("--key", default=None, help="the key (default $VAECAST_API_KEY)")
    parser.add_argument("--origin", action="append", default=[], help="repeatable")
    helps = option_helps(parser.format_help())
    assert helps["--port"] == "0 picks one (default: 8000) (env VAECAST_PORT)"
    assert helps["--grace"] == "seconds (default: 60)"
    assert helps["--key"] == "the key (default $VAECAST_API_KEY)"
    assert helps["--origin"] == "repeatable (default: none)"


# What `--help`, `--version` and a usage mistake must not import: each takes seconds
# on a busy machine (torch alone 2-11 s), and none is needed to print a line.
HEAVY_PACKAGES = ("torch", "diffusers", "aiortc", "transformers", "av", "numpy", "aiohttp", "ray")
PROBE = """
import contextlib, io, json, sys
from vaecast.cli import main
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_help_version_and_usage_mistakes_import_no_model_encoder_or_server():
    argvs = [
        ["--version"],
        *[[*([command] if command else []), "--help"] for command in COMMANDS],
        ["serve", "--port", "99999"],
        ["decode", "--no-such-option"],
    ]
    finished = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 0, finished.stderr
    imported = set(json.loads(finished.stdout))
    assert "vaecast" in imported
    assert imported.isdisjoint(HEAVY_PACKAGES), sorted(imported & set(HEAVY_PACKAGES))
