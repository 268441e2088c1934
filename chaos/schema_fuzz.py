"""Schemathesis against a real `vaecast serve`, from the server's own /openapi.json.

`run(scale, work_dir, seed)` starts `vaecast serve` (linear and tiny models, small
limits, 127.0.0.1, a store in `work_dir`), gives it jobs to find (a finished job with
a preview, a failed-looking id that never existed is Schemathesis's own), and runs
`st run` over every operation of the document: its examples, coverage (boundary and
negative values of every parameter), fuzzing and stateful (links) phases. The CI
scale checks the contract's core: no 5xx, every answer's status declared, every body
valid against its schema, and no answer slower than `max_response_s`. The full scale
runs every check Schemathesis has (`--checks all`): also that a valid request is
never refused and an invalid one never accepted, that `Allow` and the declared headers
and content types hold. The video ids Schemathesis
tries are mostly real ones (a dictionary: the seeded jobs), so the content, events,
HLS and WHEP routes are reached beyond their 404.

What it cannot generate stays hand-written elsewhere in this package: bombs and valid
files that look like something else (`hostile`, `valid`), slow and vanishing clients
(`lockout`, `disconnects`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.files import small_latents
from chaos.process import REPO
from chaos.vaecast_serve import HOST, final_job, session, vaecast_serve

CHECKS = ("not_a_server_error", "status_code_conformance", "response_schema_conformance")
DELETE_JOB = "delete_delete_video"  # its operationId
HOOKS = "chaos.schema_fuzz_hooks"
# Small limits: a generated request that is accepted decodes in well under a second.
SERVE_OPTIONS = (
    "--model", "linear", "--model", "tiny",
    "--max-upload-mb", "1", "--max-frames", "33", "--max-pixels", "16384",
    "--max-queued", "4", "--retention", "3600",
    # A push session Schemathesis opens and never feeds ends (and its event stream
    # with it) well within the response-time bound.
    "--push-first-block-timeout", "2", "--push-idle-timeout", "2",
    "--body-timeout", "5",
)  # fmt: skip
SEEDED_JOB_TIMEOUT_S = 60.0
SCHEMATHESIS_AGENT = 'agent="schemathesis/'
ACCESS = re.compile(r"status=(?P<status>[0-9]{3}) .*duration_s=(?P<seconds>[0-9.]+)")
DEFAULT_SEED = 20261206
DEFAULT_JSON = REPO / "benchmarks" / "results" / "schema_fuzz.json"


@dataclass(frozen=True)
class FuzzScale:
    max_examples: int  # per operation and phase
    max_response_s: float
    # Schemathesis's checks: the CI run keeps the contract's three; the long run takes
    # them all (also valid requests refused, invalid ones accepted, `Allow`, headers).
    checks: tuple[str, ...]
    # A bound on each `st run`, a safety net: a run ends after its examples (Schemathesis's
    # own max-time would instead repeat the fuzzing until the time is spent).
    max_time_s: int


SCALES = {
    "ci": FuzzScale(max_examples=25, max_response_s=10.0, checks=CHECKS, max_time_s=240),
    "full": FuzzScale(max_examples=400, max_response_s=10.0, checks=("all",), max_time_s=1800),
}


@dataclass
class FuzzResult:
    """What `st run` reported: its figures, and every failure and error it found."""

    report: dict[str, Any]
    seconds: float
    output_tail: str
    server_trouble: list[str]
    answers: dict[str, Any]

    @property
    def examples(self) -> int:
        return int(self.report["test_cases"]["generated"])

    @property
    def failures(self) -> list[Any]:
        return list(self.report["failures"])

    @property
    def errors(self) -> list[Any]:
        return list(self.report["errors"])

    def figures(self) -> dict[str, Any]:
        cases = self.report["test_cases"]
        return {
            "schemathesis": self.report["schemathesis_version"],
            "seed": self.report["seed"],
            "operations_tested": self.report["operations"]["tested"],
            "operations_total": self.report["operations"]["total"],
            "examples": cases["generated"],
            "with_failures": cases["with_failures"],
            "unique_failures": cases["unique_failures"],
            "errored": cases["errored"],
            "seconds": round(self.seconds, 1),
            "phases": {name: phase["status"] for name, phase in self.report["phases"].items()},
            "server_log_trouble": len(self.server_trouble),
            "answers": self.answers,
        }


def run(scale: FuzzScale, work_dir: Path, seed: int) -> FuzzResult:
    options = [*SERVE_OPTIONS, "--port", "0", "--host", HOST, "--store", str(work_dir / "store")]
    with vaecast_serve(options, work_dir, "schema-fuzz-server.log") as served:
        video_ids = asyncio.run(_seed_jobs(served.url))
        started = time.monotonic()
        # Every operation but the DELETE of a job, then that one: deleting the seeded
        # jobs first would leave every other route their 410.
        reports, outputs = [], []
        for deleting in (False, True):
            config = _write_config(work_dir, seed, scale, video_ids, deleting)
            output, report = _schemathesis(served.url, config, scale, work_dir, deleting)
            reports.append(report)
            outputs.append(output)
        seconds = time.monotonic() - started
        trouble = served.trouble()
        answers = _answers(served.log_lines())
    return FuzzResult(_merged(reports), seconds, "\n".join(outputs)[-8000:], trouble, answers)


def _answers(log_lines: list[str]) -> dict[str, Any]:
    """What the server answered Schemathesis, from its access log: counts by status, and
    the slowest answer (the time to its headers, as aiohttp logs it)."""
    statuses: Counter[str] = Counter()
    slowest = 0.0
    for line in log_lines:
        if "aiohttp.access" in line and SCHEMATHESIS_AGENT in line:
            found = ACCESS.search(line)
            if found is not None:
                statuses[found["status"]] += 1
                slowest = max(slowest, float(found["seconds"]))
    return {
        "requests": sum(statuses.values()),
        "by_status": dict(sorted(statuses.items())),
        "slowest_s": round(slowest, 3),
    }


def _merged(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report of the runs: their counts added, their failures and errors listed."""
    first, *rest = reports
    merged = json.loads(json.dumps(first))
    for report in rest:
        for key in ("generated", "with_failures", "unique_failures", "errored"):
            merged["test_cases"][key] += report["test_cases"][key]
        merged["operations"]["tested"] += report["operations"]["tested"]
        merged["failures"] += report["failures"]
        merged["errors"] += report["errors"]
    return merged


async def _seed_jobs(url: str) -> list[str]:
    """Finished jobs for the generated requests to find: one with a preview (both
    renditions, the master playlist), one without."""
    ids = []
    async with session(url) as client:
        for query in ("?preview=linear", ""):
            body = small_latents(frames=3, height=4, width=4)
            async with client.post(f"/v1/videos{query}", data=body) as response:
                answer = await response.json()
                if response.status != 201:
                    raise RuntimeError(f"seeding a job was refused: {answer}")
            status, job = await final_job(client, answer["id"], SEEDED_JOB_TIMEOUT_S)
            if job.get("status") != "completed":
                raise RuntimeError(f"the seeded job did not complete: {status} {job}")
            ids.append(answer["id"])
    return ids


# What a schema-valid request may still get (`--checks all`'s positive_data_acceptance;
# see `_write_config`), and what an invalid one may (negative_data_rejection).
VALID_REFUSED = ("2xx", "3xx", "401", "403", "404", "409", "410", "413", "415", "422", "429", "5xx")
INVALID_REFUSED = (  # 410 too: a request for a video that is gone is refused, whatever else
    *("400", "401", "403", "404", "405", "406", "409", "410"),
    *("413", "415", "422", "428", "429", "5xx"),
)


def _toml_list(statuses: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{status}"' for status in statuses) + "]"


def _write_config(
    work_dir: Path, seed: int, scale: FuzzScale, video_ids: list[str], deleting: bool
) -> Path:
    """schemathesis.toml: real ids most of the time, small part numbers most of the time;
    the DELETE of a job alone (`deleting`), or everything but it."""
    ids = ", ".join(json.dumps(video_id) for video_id in video_ids)
    text = f"""
seed = {seed}
workers = 1
request-timeout = {scale.max_response_s + 20}
max-stream-events = 50

[generation]
max-examples = {scale.max_examples}
database = "none"

# `--checks all`: a schema-valid request may still be refused for what no schema can
# say: the video is gone (410), over this server's limits (413), not a safetensors or
# .npy file (415), a tensor, a push field or an SDP offer that means nothing here
# (422). And a refusal over a limit is a refusal of invalid data too (413).
[checks.positive_data_acceptance]
expected-statuses = {_toml_list(VALID_REFUSED)}

[checks.negative_data_rejection]
expected-statuses = {_toml_list(INVALID_REFUSED)}

# The document's links say what a created video has: every route of a video but those
# only some videos have (a preview's, a push session's blocks). Schemathesis's own
# dependency analysis would link every route under a video, and take the 404 of a
# preview route of a video made without one for a video that was lost.
[phases.stateful]
enabled = {"false" if deleting else "true"}  # the DELETE alone has no links to follow

[phases.stateful.inference]
algorithms = ["location-headers"]

[dictionaries.videos]
values = [{ids}]

[dictionaries.parts]
values = [0, 1, 2]

[parameters.video_id]
dictionary = "videos"
probability = 0.8

[parameters.number]
dictionary = "parts"
probability = 0.6

"""
    # LL-HLS: a blocking reload more than two segments past the playlist's last is a 400
    # (RFC 8216bis 6.2.5.2), and a multipart part with no name is malformed (RFC 7578 4.2).
    text += f"""
[[operations]]
include-path-regex = "playlist\\\\.m3u8$"
checks.positive_data_acceptance.expected-statuses = {_toml_list(("400", *VALID_REFUSED))}

[[operations]]
include-path-regex = "^/v1/videos(/stream)?$"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = {_toml_list(("400", *VALID_REFUSED))}
"""
    if not deleting:  # the other run's
        text += f"""
[[operations]]
include-operation-id = "{DELETE_JOB}"
enabled = false
"""
    path = work_dir / f"schemathesis{'-deleting' if deleting else ''}.toml"
    path.write_text(text.lstrip())
    return path


def _schemathesis(
    url: str, config: Path, scale: FuzzScale, work_dir: Path, deleting: bool
) -> tuple[str, dict[str, Any]]:
    report_path = work_dir / f"schemathesis-report{'-deleting' if deleting else ''}.json"
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",  # `st`, from this Python
        "--config-file",
        str(config),
        "run",
        f"{url}/openapi.json",
        "--checks",
        ",".join(scale.checks),
        "--max-response-time",
        str(scale.max_response_s),
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report_path),
        *(["--include-operation-id", DELETE_JOB] if deleting else []),
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": HOOKS,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        command,
        cwd=work_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=scale.max_time_s,
        check=False,
    )
    output = done.stdout + done.stderr
    # Its own words, failures and errors in full (the JSON report counts them).
    (work_dir / report_path.with_suffix(".txt").name).write_text(output)
    if not report_path.exists():
        raise RuntimeError(
            f"schemathesis wrote no report (exit {done.returncode}): {output[-3000:]}"
        )
    return output, json.loads(report_path.read_text())


def main(argv: list[str] | None = None) -> int:
    """`python -m chaos.schema_fuzz [--scale full|ci] [--seed N] [--json PATH]`"""
    parser = argparse.ArgumentParser(prog="python -m chaos.schema_fuzz")
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--work-dir", type=Path, help="keep the logs and reports here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vaecast-schema-fuzz-") as temp:
        work = args.work_dir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(SCALES[args.scale], work, args.seed)
    figures = {
        "scale": args.scale,
        **result.figures(),
        "failures": result.failures,
        "errors": result.errors,
        "server_log_trouble": result.server_trouble,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(result.output_tail[-3000:])
    print(f"\n{json.dumps(result.figures())}\nwritten: {args.json}")
    return 1 if result.failures or result.errors or result.server_trouble else 0


if __name__ == "__main__":
    raise SystemExit(main())
