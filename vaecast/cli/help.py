"""How the command talks back: `--help` with each option's default (as the CLI
reference shows it), and a usage mistake as its reason alone.

Apart from the parser (`vaecast.cli.parser`) because the documentation's CLI reference
(docs/hooks/cli_reference.py) shows defaults the same way.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

# A help text that says its default already ("(default 1)", "; default $VAECAST_API_KEY"),
# where the value may be a secret read from the environment or not a value at all.
_DEFAULT_SAID = re.compile(r"(?:^|[(;,] ?)default\b")
# What `vaecast.cli.checks.defaults_from_environment` appends: the default goes before it.
_ENV_NOTE = re.compile(r" ?\(env [A-Z0-9_]+\)$")


class ReasonOnly(argparse.ArgumentParser):
    """A parser whose usage mistakes are the reason and a pointer at `--help`.

    argparse prints the command's whole synopsis before the reason (27 lines for
    `vaecast serve`), which buries the one line that matters. `error` is argparse's
    documented hook for this; subcommands' parsers are made of the same class.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{help_pointer(self.prog)}\n")


def help_pointer(command: str) -> str:
    """The line under an error: where the options are listed."""
    return f"(see {command} --help)"


def print_usage_error(command: str, message: str) -> None:
    """A usage mistake found outside argparse, said as `ReasonOnly` says its own."""
    print(f"{command}: error: {message}\n{help_pointer(command)}", file=sys.stderr)


class DefaultsShown(argparse.HelpFormatter):
    """`--help` with every option's default: appended where its own text does not say it
    (argparse's ArgumentDefaultsHelpFormatter, without "None" and "[]", and floats as
    60 rather than 60.0)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = shown_default(action)
        if shown is None or _DEFAULT_SAID.search(text):
            return action.help
        note = _ENV_NOTE.search(text)
        head, tail = (text[: note.start()], note.group()) if note else (text, "")
        said = "(default: " + shown.replace("%", "%%") + ")"
        return " ".join(part for part in (head, said, tail.strip()) if part)


def shown_default(action: argparse.Action) -> str | None:
    """An option's default as `--help` and the CLI reference show it; None for one that
    has none to show (a positional, a switch, a default of None or SUPPRESS)."""
    default = action.default
    if (
        not action.option_strings
        or action.nargs == 0
        or default is None
        or default is argparse.SUPPRESS
    ):
        return None
    if isinstance(default, list | tuple):
        return ", ".join(map(str, default)) or "none"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)
