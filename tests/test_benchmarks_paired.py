"""The benchmark's arithmetic: paired ratios, their spread, when they decide, the load,
and where a run's time went.

Pure functions on made-up runs, so every number below is worked out by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import first_fragment, load
from benchmarks.arms import total_stages, ttff_stages
from benchmarks.before_after import vaecast_against_first
from benchmarks.paired import (
    MIN_REPEATS,
    PEERS,
    VAECAST,
    Spread,
    Verdict,
    explain,
    per_repeat,
    repeat_ratios,
    repeat_schedule,
    schedule,
    summarize,
    verdict,
)


def test_spread_of_five_repeats_takes_the_2nd_and_4th_as_quartiles() -> None:
    spread = Spread.of([1.3, 0.9, 1.1, 1.0, 2.0])
    assert (spread.n, spread.median, spread.q1, spread.q3) == (5, 1.1, 1.0, 1.3)
    assert (spread.low, spread.high) == (0.9, 2.0)


def test_spread_of_one_value() -> None:
    assert Spread.of([1.5]) == Spread(1, 1.5, 1.5, 1.5, 1.5, 1.5)
    with pytest.raises(ValueError):
        Spread.of([])


@pytest.mark.parametrize(
    ("values", "limit", "expected"),
    [
        ([0.90, 0.92, 0.95, 0.97, 1.30], 1.00, Verdict.MET),  # one outlier does not decide
        ([1.00, 1.00, 1.00, 1.00, 1.00], 1.00, Verdict.MET),  # the limit itself meets it
        ([0.50, 1.10, 1.20, 1.30, 1.40], 1.00, Verdict.NOT_MET),
        ([0.90, 0.95, 1.00, 1.02, 1.20], 1.00, Verdict.INCONCLUSIVE),  # median meets, Q3 not
        ([0.90, 0.99, 1.01, 1.05, 1.20], 1.00, Verdict.INCONCLUSIVE),  # median misses, Q1 not
        ([0.90, 0.92, 0.95, 0.97], 1.00, Verdict.TOO_FEW),
    ],
)
def test_verdict(values: list[float], limit: float, expected: Verdict) -> None:
    assert verdict(Spread.of(values), limit) is expected


def test_schedule_pairs_vaecast_with_every_peer_once_per_repeat() -> None:
    firsts: dict[str, int] = dict.fromkeys(PEERS, 0)
    openers = []
    for repeat in range(2 * len(PEERS)):
        runs = schedule(repeat)
        assert len(runs) == 2 * len(PEERS)
        pairs = [runs[i : i + 2] for i in range(0, len(runs), 2)]
        assert sorted(peer for (_, peer), _ in pairs) == sorted(PEERS)
        for (first, peer), (second, same_peer) in pairs:
            assert peer == same_peer and {first, second} == {VAECAST, peer}
            firsts[peer] += first == VAECAST
        openers.append(pairs[0][0][1])
    # Over 2 x 5 repeats: each peer opens the repeat twice, and meets vaecast first
    # as often as second.
    assert sorted(openers) == sorted(PEERS * 2)
    assert firsts == dict.fromkeys(PEERS, len(PEERS))


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_each_pair_alternates_which_arm_goes_first_for_any_number_of_peers(count: int) -> None:
    peers = [f"peer{i}" for i in range(count)]
    for peer in peers:
        openers = []
        for repeat in range(4):
            runs = schedule(repeat, peers)
            pair = next(runs[i : i + 2] for i in range(0, len(runs), 2) if runs[i][1] == peer)
            openers.append(pair[0][0])
        # vaecast, the peer, vaecast, the peer (or the reverse).
        assert openers[0] != openers[1] and openers[:2] == openers[2:], (peer, openers)


def test_a_repeat_of_rounds_runs_each_pair_once_per_round_in_moving_orders() -> None:
    runs = repeat_schedule(1, rounds=3)
    assert len(runs) == 3 * 2 * len(PEERS)
    for round_ in range(3):
        mine = [(arm, pair) for r, arm, pair in runs if r == round_]
        assert mine == schedule(3 + round_)
    assert len({tuple(schedule(3 + r)) for r in range(3)}) == 3
    assert repeat_schedule(0, rounds=1) == [(0, arm, pair) for arm, pair in schedule(0)]


def _repeat(repeat: int = 0, scale: float = 1.0, round_: int = 0) -> list[dict[str, Any]]:
    """vaecast paired with each peer; `scale` slows the whole repeat (machine load)."""
    runs: list[dict[str, Any]] = []

    def arm(name: str, pair: str, ttff: float, last: float) -> None:
        runs.append(
            {
                "arm": name,
                "pair": pair,
                "repeat": repeat,
                "round": round_,
                "ttff_s": ttff * scale,
                "last_byte_s": last * scale,
            }
        )

    arm(VAECAST, "decode_then_encode", 0.1, 2.0)
    arm("decode_then_encode", "decode_then_encode", 4.0, 4.0)
    arm(VAECAST, "preencode", 0.1, 2.2)
    arm("preencode", "preencode", 2.0, 2.0)
    arm(VAECAST, "ffmpeg_pipe", 0.1, 2.0)
    arm("ffmpeg_pipe", "ffmpeg_pipe", 0.4, 2.5)
    arm(VAECAST, "decode_only", 0.125, 2.2)
    arm(VAECAST, "encode_only", 0.125, 2.4)
    for name, chunk_s, total_s in (("decode_only", 0.08, 2.0), ("encode_only", 0.02, 0.5)):
        runs.append(
            {
                "arm": name,
                "pair": name,
                "repeat": repeat,
                "round": round_,
                "result": {"chunk_s": [chunk_s * scale, 1.0], "total_s": total_s * scale},
            }
        )
    return runs


def test_repeat_ratios_pair_each_run_with_its_own_vaecast_run() -> None:
    ratios = repeat_ratios(_repeat())
    assert ratios["total_over_decode_then_encode"] == pytest.approx(0.5)
    assert ratios["total_over_preencode"] == pytest.approx(1.1)
    assert ratios["total_over_ffmpeg_pipe"] == pytest.approx(0.8)
    assert ratios["ttff_over_ffmpeg_pipe"] == pytest.approx(0.25)
    # The fastest peer is the one vaecast is slowest against.
    assert ratios["total_over_best_peer"] == pytest.approx(1.1)
    # 0.125 / (0.08 + 0.02), each reference against its own vaecast run.
    assert ratios["ttff_over_first_chunk"] == pytest.approx(1.25)
    # max(decode 2.0, encode 0.5) is the decode, against the vaecast run beside it.
    assert ratios["total_over_bound"] == pytest.approx(1.1)


def test_repeat_ratios_with_unequal_vaecast_runs() -> None:
    runs = _repeat()
    for run in runs:
        if run["arm"] == VAECAST and run["pair"] == "encode_only":
            run["ttff_s"] = 0.25
    # 1 / (0.08 / 0.125 + 0.02 / 0.25)
    assert repeat_ratios(runs)["ttff_over_first_chunk"] == pytest.approx(1 / 0.72)


def test_rounds_of_a_repeat_average_geometrically_and_the_best_peer_from_the_means() -> None:
    first = _repeat(0, round_=0)
    second = _repeat(0, round_=1)
    for run in second:
        if run["arm"] == "preencode":
            run["last_byte_s"] = 2.2 / 0.9  # vaecast / preencode 0.9 this round
        if run["arm"] == "ffmpeg_pipe":
            run["last_byte_s"] = 2.0 / 1.25  # vaecast / ffmpeg_pipe 1.25 this round
        if run["arm"] == "decode_only":
            run["result"]["total_s"] = 2.2 / 1.21  # total / bound 1.21 this round
    ratios = repeat_ratios([*first, *second])
    assert ratios["total_over_preencode"] == pytest.approx((1.1 * 0.9) ** 0.5)
    assert ratios["total_over_ffmpeg_pipe"] == pytest.approx((0.8 * 1.25) ** 0.5)
    assert ratios["total_over_bound"] == pytest.approx((1.1 * 1.21) ** 0.5)
    # The best peer of the means (ffmpeg pipe, 1.0), not the mean of each round's
    # best (1.1 and 1.25).
    assert ratios["total_over_best_peer"] == pytest.approx(1.0)
    assert ratios["ttff_over_first_chunk"] == pytest.approx(1.25)


def test_a_load_that_slows_a_whole_repeat_leaves_its_ratios_alone() -> None:
    quiet, loaded = per_repeat([*_repeat(0), *_repeat(1, scale=1.7)])
    assert quiet.keys() == loaded.keys()
    for name, value in quiet.items():
        assert loaded[name] == pytest.approx(value), name


def test_summarize_gives_a_verdict_for_the_targets_only() -> None:
    ratios = [repeat_ratios(_repeat(r)) for r in range(MIN_REPEATS)]
    for r, value in enumerate((1.0, 1.2, 1.3, 1.22, 1.26)):
        ratios[r]["ttff_over_first_chunk"] = value
    summary = summarize(ratios)
    ttff = summary["ttff_over_first_chunk"]
    assert (ttff["median"], ttff["q1"], ttff["q3"]) == (1.22, 1.2, 1.26)
    assert ttff["verdict"] == Verdict.INCONCLUSIVE and ttff["median_meets"] is True
    assert explain(ttff) == (
        "inconclusive: the median 1.220 meets 1.25, IQR 1.200-1.260 straddles it"
    )
    bound = summary["total_over_bound"]
    assert bound["verdict"] == Verdict.MET  # 1.1 every time, the limit itself
    assert summary["total_over_best_peer"]["verdict"] == Verdict.NOT_MET
    assert "verdict" not in summary["total_over_preencode"]


PROC_STAT = """cpu  1000 50 300 9000 20 5 15 30 0 0
cpu0 500 25 150 4500 10 2 7 15 0 0
intr 12345
"""


def test_busy_and_steal_from_proc_stat() -> None:
    hz = load._TICKS_HZ
    busy, steal = load.busy_and_steal(PROC_STAT)
    assert busy == pytest.approx((1000 + 50 + 300 + 5 + 15 + 30) / hz)
    assert steal == pytest.approx(30 / hz)
    with pytest.raises(ValueError):
        load.busy_and_steal("intr 1\n")


def test_process_cpu_with_a_name_holding_parentheses_and_spaces() -> None:
    hz = load._TICKS_HZ
    stat = "4242 (python (x) y) S 1 4242 4242 0 -1 4194304 100 0 0 0 70 30 20 10 20 0 1 0"
    assert load.process_cpu_s(stat) == pytest.approx((70 + 30 + 20 + 10) / hz)


def test_between_subtracts_our_own_cpu_time() -> None:
    before = load.CpuSample(at_s=10.0, busy_s=100.0, steal_s=1.0, ours_s=50.0, loadavg_1min=0.5)
    after = load.CpuSample(at_s=14.0, busy_s=107.0, steal_s=1.4, ours_s=56.0, loadavg_1min=1.5)
    measured = load.between(before, after)
    assert measured["wall_s"] == pytest.approx(4.0)
    assert measured["others_cpu_s"] == pytest.approx(1.0)
    assert measured["others_cores"] == pytest.approx(0.25)
    assert measured["steal_cores"] == pytest.approx(0.1)
    assert measured["ours_cores"] == pytest.approx(1.5)
    assert measured["loadavg_1min"] == [0.5, 1.5]
    # Tick rounding can make ours exceed the machine's delta: never negative.
    assert load.between(before, after.__class__(14.0, 103.0, 1.0, 56.0, 1.0))[
        "others_cpu_s"
    ] == pytest.approx(0.0)


def test_sample_reads_this_machine() -> None:
    first = load.sample()
    second = load.sample()
    assert second.busy_s >= first.busy_s > 0
    assert second.ours_s >= first.ours_s > 0


def _event(event: str, t: float, chunk: int | None = None) -> dict[str, Any]:
    return {"arm": VAECAST, "event": event, "chunk": chunk, "t": t}


def test_stages_of_a_run_from_its_trace() -> None:
    trace = [
        _event("request", 0.002),
        _event("decode_start", 0.015),
        _event("open_start", 0.016),
        _event("opened", 0.020),
        _event("decoded", 0.100, 0),
        _event("handed_off", 0.103, 0),
        _event("encode_start", 0.104, 0),
        _event("encoded", 0.106, 0),
        _event("decoded", 0.200, 1),
        _event("encode_start", 0.210, 1),
        _event("handed_off", 0.211, 1),
        _event("encoded", 0.220, 1),
    ]
    run = {"arm": VAECAST, "ttff_s": 0.108, "last_byte_s": 0.230, "trace": trace}
    ttff = ttff_stages(run)
    assert ttff["request head parsed"] == pytest.approx(0.002)
    assert ttff["body read, parsed, job started"] == pytest.approx(0.014)
    assert ttff["encoder open (no spare)"] == pytest.approx(0.004)
    assert ttff["request to decode start"] == pytest.approx(0.013)
    assert ttff["first chunk decode"] == pytest.approx(0.085)
    assert ttff["quantize + hand-off to the encode thread"] == pytest.approx(0.004)
    assert ttff["first chunk encode"] == pytest.approx(0.002)
    assert ttff["to the client"] == pytest.approx(0.002)
    total = total_stages(run)
    assert total == pytest.approx(
        {
            "before the decode": 0.015,
            "decode (last chunk decoded)": 0.185,
            "hand-offs in the decode thread": 0.003 + 0.011,
            "after the last chunk decoded": 0.030,
        }
    )
    # A server that records fewer moments (an older tree) gives the stages it can.
    assert "encoder open (no spare)" not in ttff_stages({**run, "trace": trace[1:2] + trace[4:]})
    # A spare opened after the previous job (before this request) is not this job's.
    spare = [_event("open_start", -0.5), _event("opened", -0.496), *trace[:2], *trace[4:]]
    spare += [_event("open_start", 0.225), _event("opened", 0.229)]  # the next job's
    ttff = ttff_stages({**run, "trace": spare})
    assert "encoder open (no spare)" not in ttff
    assert ttff["first chunk decode"] == pytest.approx(0.085)


def test_vaecast_against_the_first_configuration_per_repeat() -> None:
    def runs(ttffs: list[list[float]]) -> list[dict[str, Any]]:
        return [
            {"arm": VAECAST, "repeat": repeat, "ttff_s": ttff, "last_byte_s": 10 * ttff}
            for repeat, values in enumerate(ttffs)
            for ttff in values
        ]

    result = vaecast_against_first(
        {
            "before": runs([[0.2, 0.2, 0.4], [0.4, 0.5, 0.3]]),
            "after": runs([[0.1, 0.2, 0.1], [0.3, 0.3, 0.2]]),
        }
    )
    assert result["before"]["ttff_s"]["median"] == pytest.approx(1.0)
    # Repeat medians: after 0.1 / 0.2, then 0.3 / 0.4.
    assert (result["after"]["ttff_s"]["low"], result["after"]["ttff_s"]["high"]) == (
        pytest.approx(0.5),
        pytest.approx(0.75),
    )
    assert result["after"]["last_byte_s"]["median"] == pytest.approx(0.625)


def test_first_fragment_summary_pairs_rounds() -> None:
    rows = {
        "before": [{"ttff_s": 0.2, "first chunk decode": 0.1}, {"ttff_s": 0.4}],
        "after": [{"ttff_s": 0.1, "first chunk decode": 0.08}, {"ttff_s": 0.3}],
    }
    summary = first_fragment.summarize(rows)
    assert summary["before"]["ttff_vs_first"]["median"] == pytest.approx(1.0)
    after = summary["after"]
    assert (after["ttff_vs_first"]["low"], after["ttff_vs_first"]["high"]) == (
        pytest.approx(0.5),
        pytest.approx(0.75),
    )
    assert after["medians_s"] == {"ttff_s": pytest.approx(0.2), "first chunk decode": 0.08}
    assert "| after | 0.625 (0.56-0.69) | 200.0 | 80.0 |" in first_fragment.markdown(
        {"meta": {"requests": 2, "finished_utc": "-", "load_start": "-"}, "summary": summary}
    )
