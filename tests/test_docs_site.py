"""The documentation site's pages name only flags that exist: a `vaecast` command's
in its parser, an example's or a benchmark's in its own source."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from vaecast.cli_parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
VAECAST_COMMAND = re.compile(r"\bvaecast (?:serve|decode|latents|push)\b[^`\n]*")
# Other programs' flags that the pages show in commands for them (curl, pip, ray...),
# each only inside a fenced block or in a line that names the program.
OTHER_PROGRAMS = re.compile(r"\b(?:curl|pip|ray start|ffplay|docker|kubectl|mkdocs)\b")


def vaecast_flags() -> set[str]:
    top = build_parser()
    parsers = [top]
    for action in top._actions:  # argparse keeps no public list of its commands
        if isinstance(action, argparse._SubParsersAction):
            parsers += action.choices.values()
    return {
        flag for parser in parsers for action in parser._actions for flag in action.option_strings
    }


def script_flags() -> set[str]:
    """Flags that the examples and benchmarks define (their own argparse, as literals)."""
    sources = [*ROOT.glob("examples/*.py"), *ROOT.glob("benchmarks/**/*.py")]
    return {
        match.group(1)
        for path in sources
        for match in re.finditer(r"[\"'](--[a-z][a-z0-9-]*)[\"']", path.read_text())
    }


def pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md") if "hooks" not in path.parts)


def named_flags(text: str) -> tuple[set[str], set[str]]:
    """(flags on `vaecast ...` command lines, flags in inline code elsewhere)."""
    commands: set[str] = set()
    for line in VAECAST_COMMAND.findall(text):
        commands |= set(FLAG.findall(line))
    prose = FENCE.sub("", text)
    inline: set[str] = set()
    for code in INLINE_CODE.findall(prose):
        if VAECAST_COMMAND.search(code) or OTHER_PROGRAMS.search(code):
            continue
        inline |= set(FLAG.findall(code))
    return commands, inline


def test_the_pages_name_only_flags_that_exist():
    known, scripts = vaecast_flags(), script_flags()
    assert pages()
    wrong = []
    for page in pages():
        commands, inline = named_flags(page.read_text())
        wrong += [f"{page.name}: vaecast {flag}" for flag in sorted(commands - known)]
        wrong += [f"{page.name}: {flag}" for flag in sorted(inline - known - scripts)]
    assert wrong == []


def test_a_made_up_flag_is_found():
    text = (
        "Run `vaecast serve --no-such-flag` or set `--max-frmes`.\n"
        "```sh\ncurl --no-buffer http://x\nvaecast decode z -o v.mp4 --speed 2\n```\n"
    )
    commands, inline = named_flags(text)
    assert commands == {"--no-such-flag", "--speed"}
    assert inline == {"--max-frmes"}
    assert {"--no-such-flag", "--speed", "--max-frmes"}.isdisjoint(vaecast_flags())
