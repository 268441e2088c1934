"""What the command line checks beyond what argparse does: typos and the environment.

- `misspelt_option`: a mistyped `--option` named, with the closest one the command has.
  argparse reports a typo as whatever it then misses (`--ouput x.mp4`: "the following
  arguments are required: -o/--output") or with the top-level usage; Python 3.14's
  `suggest_on_error` does this.
- `defaults_from_environment`: `VAECAST_<OPTION>` for every option of a command.

argparse keeps no public list of a parser's options: both read `_actions`, only read.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Sequence

from vaecast.errors import InvalidRequestError

ENV_PREFIX = "VAECAST_"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def environment_name(action: argparse.Action) -> str:
    return ENV_PREFIX + action.dest.upper()


def defaults_from_environment(parser: argparse.ArgumentParser) -> None:
    """Every option of `parser` also reads `VAECAST_<OPTION>` (`--max-frames`:
    `VAECAST_MAX_FRAMES`), which a flag given overrides; `--help` names each variable.

    A value is checked as the flag's would be: a bad one is one usage line naming the
    variable. A repeatable option takes a comma-separated list; a switch 1/0,
    true/false, yes/no, on/off.
    """
    for action in parser._actions:  # argparse keeps no public list of its options
        if (
            not action.option_strings
            or action.dest in ("help",)
            or action.default is (argparse.SUPPRESS)
        ):
            continue
        name = environment_name(action)
        if name not in (action.help or ""):
            note = f"env {name}"
            action.help = f"{action.help} ({note})" if action.help else f"({note})"
        text = os.environ.get(name)
        if text is None:
            continue
        try:
            action.default = _from_environment(action, text)
        except (argparse.ArgumentTypeError, ValueError) as error:
            # Said when the command runs, not when another command's parser is built.
            problem = f"{name}={text[:60]!r}: {error}"
            parser.set_defaults(run=lambda _args, problem=problem: _refuse(problem))


def _refuse(problem: str) -> int:
    raise InvalidRequestError(problem)


def _from_environment(action: argparse.Action, text: str) -> object:
    if isinstance(action, argparse._StoreTrueAction):
        if text.strip().lower() not in _TRUE | _FALSE:
            raise ValueError("a switch is 1 or 0 (true/false, yes/no, on/off)")
        return text.strip().lower() in _TRUE
    convert = action.type or str
    if convert in (int, float):
        number = convert
        kind = "an integer" if number is int else "a number"

        def convert(text: str) -> object:
            try:
                return number(text)
            except ValueError:
                raise ValueError(f"not {kind}") from None

    if isinstance(action, argparse._AppendAction):
        return [convert(part.strip()) for part in text.split(",") if part.strip()]
    value = convert(text)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"not one of {', '.join(map(str, action.choices))}")
    return value


def misspelt_option(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The message for the first `--option` in `argv` that its command does not have,
    with the closest one it has; None if every option is one (or an abbreviation).

    argparse itself reports a typo as whatever it then misses: `--ouput x.mp4` as "the
    following arguments are required: -o/--output", and a subcommand's unknown option
    with the top-level usage. (Python 3.14's `suggest_on_error` does this; argparse
    keeps its actions in `_actions`, read here only.)
    """
    commands = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands = action.choices
    command_parser, command = parser, "vaecast"
    for token in argv:
        if token == "--":
            return None
        if command_parser is parser and token in commands:
            command_parser, command = commands[token], f"vaecast {token}"
            continue
        if not token.startswith("--") or token == "--":
            continue
        name = token.split("=", 1)[0]
        known = [o for a in command_parser._actions for o in a.option_strings if o.startswith("--")]
        if name in known or sum(o.startswith(name) for o in known) == 1:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f" (see {command} --help)"
        return f"{command}: error: unknown option {name[:60]}{hint}"
    return None
