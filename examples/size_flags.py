"""The examples' size and step flags, for a real pipeline and for `--tiny-random` alike.

A flag given is passed to whichever pipeline runs; a flag not given takes that
pipeline's own default: the published model's size for a real one, the tiny
components' small one for `--tiny-random` (so that it runs on a CPU in seconds).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

# A pipeline keyword whose flag is not its name.
FLAG_NAMES = {"num_inference_steps": "--steps"}


def add_size_flags(parser: argparse.ArgumentParser, defaults: Mapping[str, int]) -> None:
    """One integer flag per pipeline keyword in `defaults` (keyword -> a real
    pipeline's default)."""
    for keyword, default in defaults.items():
        parser.add_argument(
            FLAG_NAMES.get(keyword, "--" + keyword.replace("_", "-")),
            dest=keyword,
            type=int,
            default=None,
            metavar="N",
            help=f"default {default}; with --tiny-random, the tiny pipeline's own",
        )


def given(args: argparse.Namespace, defaults: Mapping[str, int]) -> dict[str, Any]:
    """The size keywords whose flags were given."""
    return {key: getattr(args, key) for key in defaults if getattr(args, key) is not None}


def chosen(args: argparse.Namespace, defaults: Mapping[str, int]) -> dict[str, Any]:
    """Every size keyword: as given, or its default."""
    return {**defaults, **given(args, defaults)}
