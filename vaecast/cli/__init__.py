"""The `vaecast` command: `serve` the HTTP API, or `decode` latents to an MP4 file."""

# The console entry point (`vaecast.cli:main`). The parser is `vaecast.cli.parser`'s,
# the commands' runners `vaecast.cli.serve`'s and `vaecast.cli.files`'; the names
# other code imported from here are re-exported.

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Sequence

from vaecast.cli.checks import misspelt_option
from vaecast.cli.decode_options import DEFAULT_MODEL, DEFAULTS
from vaecast.cli.parser import build_parser
from vaecast.errors import VaecastError
from vaecast.log_format import configure_logging

__all__ = ["DEFAULTS", "DEFAULT_MODEL", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a mistake the user can fix is one `vaecast: error:` line and exit
    status 2 (`--debug` shows its traceback instead)."""
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    misspelt = misspelt_option(parser, argv)
    if misspelt is not None:
        print(misspelt, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return int(args.run(args))
    except (VaecastError, OSError) as error:
        if args.debug:
            raise
        print(f"vaecast: error: {_reason(error)}", file=sys.stderr)
        return 2


def _reason(error: VaecastError | OSError) -> str:
    if isinstance(error, VaecastError):
        return error.message
    if error.errno == errno.EADDRINUSE:
        return f"cannot listen: the address is already in use ({error.strerror or error})"
    if error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error)


def _parser() -> argparse.ArgumentParser:
    return build_parser(description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
