"""`python -m chaos [--scale full|ci] [--json PATH] [--seed N]`

Runs the reliability suite against fresh server subprocesses, prints the Markdown
table (category | tried | passed | found), every finding and the figures of the
store and admission categories, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from chaos import report, suite

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "reliability.json"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos")
    parser.add_argument("--scale", choices=sorted(suite.SCALES), default="full")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--seed", type=int, default=suite.DEFAULT_SEED)
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the server logs, spill dir and stores here (default: a temp dir)",
    )
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    with tempfile.TemporaryDirectory(prefix="vaecast-reliability-") as temp:
        work = args.work_dir or Path(temp)
        result = suite.run(suite.SCALES[args.scale], work, args.seed, say)
        log_tail = (work / "server.log").read_text(errors="replace")[-4000:]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    payload = result.to_json()
    payload["summary"] = report.summary(result)
    payload["server_log_tail"] = log_tail
    args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print()
    print(report.table(result))
    print()
    print(report.details(result))
    print(f"\n{json.dumps(report.summary(result))}\nwritten: {args.json}")
    failed = sum(
        c.tried - c.passed + (len(c.findings) - (c.tried - c.passed)) for c in result.categories
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
