"""The documentation site's pages name only flags and routes that exist: a `vaecast`
command's flag in its parser, an example's or a benchmark's in its own source; an API
path among the routes of the app's router."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from vaecast.cli.parser import build_parser
from vaecast.models.linear import LinearDecoder
from vaecast.server.app import create_app
from vaecast.server.config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
VAECAST_COMMAND = re.compile(r"\bvaecast (?:serve|decode|latents|push)\b[^`\n]*")
# Other programs' flags that the pages show in commands for them (curl, pip, ray...),
# each only inside a fenced block or in a line that names the program.
# An API path as the pages write it: `/v1/videos/{id}/content`, a curl's
# `.../v1/videos/video_.../content?x=1`; a folder (`.../hls/`) ends in a slash.
API_PATH = re.compile(r"/v1/videos[^\s`'\"?#),]*")
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


def app_paths() -> list[str]:
    """The path of each route of the app `vaecast serve` runs (`{video_id}` as aiohttp
    writes a variable)."""
    app = create_app(ServerConfig(default_model="linear"), {"linear": LinearDecoder()})
    return [resource.canonical for resource in app.router.resources()]


def is_routed(path: str, routes: list[str]) -> bool:
    """Whether a route answers `path` (`{id}` or `video_...` for an id) or, for a folder
    (a trailing slash), a path inside it."""
    pattern = re.escape(path)
    for placeholder in ("{id}", "video_..."):
        pattern = pattern.replace(re.escape(placeholder), r"\{[^}]+\}")
    if path.endswith("/"):
        return any(re.match(pattern + ".", route) for route in routes)
    return any(re.fullmatch(pattern, route) for route in routes)


def test_the_pages_name_only_routes_that_exist():
    routes = app_paths()
    named = {path for page in pages() for path in API_PATH.findall(page.read_text())}
    assert "/v1/videos/{id}/whep" in named
    assert sorted(path for path in named if not is_routed(path, routes)) == []


def test_a_made_up_route_is_found():
    routes = app_paths()
    assert is_routed("/v1/videos/video_.../content", routes)
    assert is_routed("/v1/videos/{id}/hls/", routes)
    assert not is_routed("/v1/videos/{id}/thumbnail", routes)
    assert not is_routed("/v1/videos/{id}/nothing/", routes)
