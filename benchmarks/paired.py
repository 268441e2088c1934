"""Paired ratios: vaecast against each other arm on the same load, and when they decide.

A repeat runs vaecast back to back with each other arm and each reference, one pair
at a time (the order of the pairs rotated every repeat, vaecast first in every other
pair), so the two runs of a pair meet the same machine load. Every ratio is computed
within a pair, or within one repeat from its pairs, never from medians of runs that
met different loads; the report gives the median of those per-repeat ratios and their
spread.

The ratios (per repeat):
- `ttff_over_first_chunk`: vaecast's first playable fragment over (first chunk decode
  alone + first chunk encode alone). Each reference is paired with its own vaecast
  run, so the ratio is 1 / (d0 / ttff_d + e0 / ttff_e): vaecast's TTFF / (d0 + e0)
  when the two vaecast runs agree.
- `total_over_bound`: vaecast's last byte over max(decode alone, encode alone), each
  reference against its own vaecast run: min(total_d / decode, total_e / encode).
- `total_over_<arm>`, `ttff_over_<arm>`: vaecast over that arm, within their pair.
- `total_over_best_peer`: vaecast over the fastest other arm: the largest of the
  `total_over_<arm>` of the repeat.

A repeat is `rounds` rounds of those pairs back to back (`repeat_schedule`; 5 in the
README's run, `--rounds`). Each ratio is computed within each round, and the repeat's
ratio is their geometric mean (`total_over_best_peer` from the arms' means). Why: on
this 2-core VM two back-to-back runs of the same 2-s decode differ by up to ~10 %
(its speed moves from second to second; the decode alone had a run-to-run CV of
3-10 % in series of 10-14 runs), so one pair per repeat gave IQRs of +-5-10 % around
ratios whose targets are a few % away; averaging k pairs narrows that noise by
~sqrt(k) and measures the same ratio. The verdict rule below is unchanged.

When a target decides (`verdict`): the median must meet it, and the interquartile
range must not straddle it. With 5 repeats the IQR runs from the 2nd to the 4th
value, so a verdict holds when at least 4 repeats of 5 agree with the median.
Fewer than `MIN_REPEATS` repeats decide nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

VAECAST = "vaecast"
PEER_ARMS = ("decode_then_encode", "preencode", "ffmpeg_pipe")
REFERENCES = ("decode_only", "encode_only")
PEERS = PEER_ARMS + REFERENCES
MIN_REPEATS = 5
# Rounds of pairs in one repeat of `python -m benchmarks` (see the module docstring).
ROUNDS = 5
# A repeat during which other processes used more than this many cores on average
# is flagged as loaded: its ratios still pair like with like, its seconds do not
# describe an idle machine.
LOADED_CORES = 0.25


@dataclass(frozen=True, slots=True)
class Target:
    limit: float
    title: str


TARGETS: dict[str, Target] = {
    "ttff_over_first_chunk": Target(1.25, "TTFF / (first chunk decode + encode)"),
    "total_over_bound": Target(1.10, "total / max(decode alone, encode alone)"),
    "total_over_best_peer": Target(1.00, "total / the best other arm's total"),
}


class Verdict(StrEnum):
    MET = "met"
    NOT_MET = "not met"
    INCONCLUSIVE = "inconclusive"
    TOO_FEW = "too few repeats"


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of per-repeat values, their quartiles and their range."""

    n: int
    median: float
    q1: float
    q3: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        ordered = sorted(values)
        if len(ordered) == 1:
            q1 = q3 = ordered[0]
        else:
            # "inclusive": quartiles interpolated between the values themselves, so
            # with 5 values Q1 and Q3 are the 2nd and the 4th.
            q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        return cls(len(ordered), statistics.median(ordered), q1, q3, ordered[0], ordered[-1])

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def verdict(spread: Spread, limit: float) -> Verdict:
    """Whether per-repeat ratios meet `ratio <= limit`: see the module docstring."""
    if spread.n < MIN_REPEATS:
        return Verdict.TOO_FEW
    if spread.median <= limit and spread.q3 <= limit:
        return Verdict.MET
    if spread.median > limit and spread.q1 > limit:
        return Verdict.NOT_MET
    return Verdict.INCONCLUSIVE


def schedule(repeat: int, peers: Sequence[str] = PEERS) -> list[tuple[str, str]]:
    """The runs of one repeat, pair by pair: (arm, the peer of its pair).

    The pairs' order is rotated by one every repeat, and within each pair vaecast goes
    first every other repeat (peers next to each other in `peers` start on opposite
    sides), so neither position nor the order within a pair favours an arm over the
    repeats. The side is taken from the peer's place in `peers`, not its place after
    the rotation: with two peers the rotation and an alternation by place cancel out,
    and every repeat would run each pair in the same order.
    """
    shift = repeat % len(peers)
    runs = []
    for peer in list(peers[shift:]) + list(peers[:shift]):
        vaecast_first = (repeat + peers.index(peer)) % 2 == 0
        pair = [VAECAST, peer] if vaecast_first else [peer, VAECAST]
        runs += [(arm, peer) for arm in pair]
    return runs


def repeat_schedule(
    repeat: int, rounds: int, peers: Sequence[str] = PEERS
) -> list[tuple[int, str, str]]:
    """The runs of one repeat of `rounds` rounds: (round, arm, the peer of its pair).

    Round r of repeat k runs `schedule(k * rounds + r)`, so the order of the pairs
    moves on from round to round as it does from repeat to repeat.
    """
    return [
        (round_, arm, pair)
        for round_ in range(rounds)
        for arm, pair in schedule(repeat * rounds + round_, peers)
    ]


def repeat_ratios(runs: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The ratios of one repeat from its runs (records with `arm`, `pair` and, when
    the repeat has several rounds, `round`): each ratio's geometric mean over the
    rounds, and the best peer's from the arms' means."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        by_round.setdefault(run.get("round", 0), []).append(run)
    rounds = [round_ratios(by_round[r]) for r in sorted(by_round)]
    names = dict.fromkeys(name for ratios in rounds for name in ratios)
    combined = {
        name: _geometric_mean([ratios[name] for ratios in rounds if name in ratios])
        for name in names
        if name != "total_over_best_peer"
    }
    totals = [combined[f"total_over_{arm}"] for arm in PEER_ARMS if f"total_over_{arm}" in combined]
    if totals:
        combined["total_over_best_peer"] = max(totals)
    return combined


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def round_ratios(runs: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The ratios of one round of pairs from its runs (records with `arm` and `pair`)."""
    mine: dict[str, dict[str, Any]] = {}  # the vaecast run of each pair
    peer: dict[str, dict[str, Any]] = {}
    for run in runs:
        if run["arm"] == VAECAST:
            mine[run["pair"]] = run
        else:
            peer[run["arm"]] = run
    ratios: dict[str, float] = {}
    for arm in PEER_ARMS:
        if arm in peer and arm in mine:
            ratios[f"total_over_{arm}"] = mine[arm]["last_byte_s"] / peer[arm]["last_byte_s"]
            ratios[f"ttff_over_{arm}"] = mine[arm]["ttff_s"] / peer[arm]["ttff_s"]
    totals = [ratios[f"total_over_{arm}"] for arm in PEER_ARMS if f"total_over_{arm}" in ratios]
    if totals:
        ratios["total_over_best_peer"] = max(totals)
    if all(ref in peer and ref in mine for ref in REFERENCES):
        decode, encode = peer["decode_only"]["result"], peer["encode_only"]["result"]
        with_decode, with_encode = mine["decode_only"], mine["encode_only"]
        ratios["ttff_over_first_chunk"] = 1 / (
            decode["chunk_s"][0] / with_decode["ttff_s"]
            + encode["chunk_s"][0] / with_encode["ttff_s"]
        )
        ratios["total_over_bound"] = min(
            with_decode["last_byte_s"] / decode["total_s"],
            with_encode["last_byte_s"] / encode["total_s"],
        )
    return ratios


def per_repeat(runs: Iterable[dict[str, Any]]) -> list[dict[str, float]]:
    """`repeat_ratios` of every repeat, in repeat order."""
    by_repeat: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], []).append(run)
    return [repeat_ratios(by_repeat[repeat]) for repeat in sorted(by_repeat)]


def summarize(ratios: Sequence[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per ratio: its spread over the repeats, and for the targets, the verdict."""
    names = dict.fromkeys(name for repeat in ratios for name in repeat)
    summary: dict[str, dict[str, Any]] = {}
    for name in names:
        spread = Spread.of([repeat[name] for repeat in ratios if name in repeat])
        entry: dict[str, Any] = spread.as_dict()
        target = TARGETS.get(name)
        if target is not None:
            entry |= {
                "target": target.limit,
                "median_meets": spread.median <= target.limit,
                "verdict": verdict(spread, target.limit).value,
            }
        summary[name] = entry
    return summary


def explain(entry: dict[str, Any]) -> str:
    """One line for a target's verdict, with the numbers that decided it."""
    limit, median = entry["target"], entry["median"]
    iqr = f"IQR {entry['q1']:.3f}-{entry['q3']:.3f}"
    match Verdict(entry["verdict"]):
        case Verdict.MET:
            return f"met: median {median:.3f} and {iqr} <= {limit:.2f}"
        case Verdict.NOT_MET:
            return f"not met: median {median:.3f} and {iqr} > {limit:.2f}"
        case Verdict.INCONCLUSIVE:
            side = "meets" if entry["median_meets"] else "misses"
            return f"inconclusive: the median {median:.3f} {side} {limit:.2f}, {iqr} straddles it"
        case Verdict.TOO_FEW:
            return f"undecided: {entry['n']} repeats, {MIN_REPEATS} needed"
