"""MkDocs hook: the CLI reference page, rendered from the `vaecast` argparse parser at
build time, so every option, default and environment variable is the code's own.

`render_cli_reference(parser)` is pure (a parser in, Markdown out); `on_files` adds the
page as `reference/cli.md`. The parser is built with no `VAECAST_*` variable set: a
default read from the builder's environment (an API key above all) never reaches the site.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

PAGE = "reference/cli.md"
ENV_PREFIX = "VAECAST_"


def render_cli_reference(parser: argparse.ArgumentParser) -> str:
    from vaecast.cli.checks import environment_name
    from vaecast.cli.help import shown_default

    lines = [
        "# CLI reference",
        "",
        "Generated from the `vaecast` command's own parser when the site is built; "
        "`vaecast COMMAND --help` prints the same options and defaults.",
        "",
    ]
    for name, command, summary in _commands(parser):
        lines += [f"## `{name}`", ""]
        if summary:
            lines += [_sentence(summary), ""]
        lines += ["```text", command.format_usage().strip(), "```", ""]
        positionals = [
            action
            for action in command._actions
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
        ]
        options = [a for a in command._actions if a.option_strings and a.dest != "help"]
        if positionals:
            lines += ["| argument | what it is |", "| --- | --- |"]
            for action in positionals:
                lines.append(f"| `{action.metavar or action.dest}` | {_cell(_help(action))} |")
            lines.append("")
        if options:
            lines += [
                "| option | default | environment | what it sets |",
                "| --- | --- | --- | --- |",
            ]
            for action in options:
                default = shown_default(action)
                env = environment_name(action)
                env_cell = f"`{env}`" if env in (action.help or "") else ""
                lines.append(
                    f"| `{_invocation(action)}` | {f'`{default}`' if default else ''} "
                    f"| {env_cell} | {_cell(_help(action, strip=env))} |"
                )
            lines.append("")
    return "\n".join(lines)


def _commands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    """The top-level parser, then each subcommand (argparse keeps them in `_actions`)."""
    yield parser.prog, parser, parser.description
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, command in action.choices.items():
                yield command.prog, command, helps.get(name)


def _invocation(action: argparse.Action) -> str:
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flags
    if action.metavar is not None:
        metavar = action.metavar
    elif action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.dest.upper()
    return f"{flags} {metavar}"


def _help(action: argparse.Action, strip: str | None = None) -> str:
    """The help text with argparse's %-expansion, less the environment note."""
    text = action.help or ""
    if strip is not None:
        text = text.replace(f"(env {strip})", "").strip()
    params: dict[str, Any] = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return text % params if "%" in text else text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _sentence(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def cli_reference() -> str:
    with _clean_environment():
        import vaecast.cli
        from vaecast.cli.parser import build_parser

        return render_cli_reference(build_parser(description=vaecast.cli.__doc__))


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=cli_reference()))
    return files
