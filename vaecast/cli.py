"""The `vaecast` command: `serve` the HTTP API, or `decode` latents to an MP4 file."""

# The console entry point (`vaecast.cli:main`). The parser is `vaecast.cli_parser`'s,
# the commands' runners `vaecast.cli_serve`'s and `vaecast.cli_files`'; the names
# other code imported from here are re-exported.

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from vaecast.cli_decode_options import DEFAULT_MODEL, DEFAULTS
from vaecast.cli_parser import build_parser
from vaecast.errors import VaecastError

__all__ = ["DEFAULTS", "DEFAULT_MODEL", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.run(args))
    except VaecastError as error:
        print(f"vaecast: error: {error.message}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    return build_parser(description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
