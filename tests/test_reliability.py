"""The reliability suite at CI scale: the server survives hostile and unlucky input.

One run of `python -m chaos --scale ci` (a real server subprocess:
generated malformed requests, generated valid files, abrupt disconnects, injected
faults; then `vaecast serve` SIGKILLed and restarted on a store, started on a
damaged store, and held by slow clients), then one test per pass criterion, so a
failure names the criterion and lists what broke it: the request, the answer, and
what was expected.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import blocks, lockout, report, restarts, suite
from chaos.results import Category

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> suite.Report:
    work_dir: Path = tmp_path_factory.mktemp("reliability")
    return suite.run(suite.SCALES["ci"], work_dir, say=lambda _: None)


def _findings(category: Category) -> str:
    lines = [f"{category.name}: {category.passed}/{category.tried} passed"]
    for group in category.groups():
        lines.append(f"- {group['key']} (x{group['count']}), expected {group['expected']}")
        lines += [f"    {e['request']} -> {e['answer']}" for e in group["examples"]]
    return "\n".join(lines)


def _assert_clean(result: suite.Report, name: str, minimum: int) -> None:
    category = result.category(name)
    if category.tried < minimum:
        pytest.fail(f"{_findings(category)}\nat least {minimum} expected", pytrace=False)
    if category.findings:
        pytest.fail(_findings(category), pytrace=False)


def test_malformed_requests_get_no_5xx_and_the_server_stays_healthy(
    result: suite.Report,
) -> None:
    _assert_clean(result, "malformed requests (generated)", suite.SCALES["ci"].malformed)
    _assert_clean(result, "malformed requests (catalogue)", len(blocks.BAD_NUMBER_TEXTS))


def test_valid_files_are_all_decoded_to_playable_mp4(result: suite.Report) -> None:
    _assert_clean(result, "valid files", 20)


def test_abrupt_disconnects_leave_every_job_in_a_final_state(result: suite.Report) -> None:
    _assert_clean(result, "abrupt disconnects", suite.SCALES["ci"].disconnects)
    _assert_clean(result, "job states after disconnects", 1)


def test_injected_faults_end_in_recorded_states(result: suite.Report) -> None:
    _assert_clean(result, "injected faults", suite.SCALES["ci"].faults)


def test_nothing_leaks(result: suite.Report) -> None:
    _assert_clean(result, "resources after disconnects and faults", 5)


def test_worst_event_loop_lag_is_under_the_bound(result: suite.Report) -> None:
    _assert_clean(result, "event-loop lag", 6)  # one check per phase
    assert result.category("event-loop lag").figures["worst_s"] < suite.LAG_BOUND_S


def test_shutdown_is_clean_and_the_log_has_no_async_defects(result: suite.Report) -> None:
    _assert_clean(result, "shutdown and server log", 2)


def test_sigkills_lose_no_job_and_change_no_finished_video(result: suite.Report) -> None:
    kills = suite.SCALES["ci"].kills
    _assert_clean(result, restarts.KILLED, kills + 2)  # a start per kill, the last, more
    assert result.category(restarts.KILLED).figures["kills"] == kills


def test_a_damaged_store_is_repaired_at_startup_and_says_so(result: suite.Report) -> None:
    _assert_clean(result, restarts.DAMAGED, 10)


def test_slow_clients_leave_room_for_a_normal_upload(result: suite.Report) -> None:
    _assert_clean(result, lockout.TRICKLING, lockout.SLOW_CLIENTS + 5)
    _assert_clean(result, lockout.EMPTY_PUSH, 2 * lockout.SLOW_CLIENTS + 5)
    for name in (lockout.TRICKLING, lockout.EMPTY_PUSH):
        assert result.category(name).figures["admission_ms"]["max"] < 1000


def test_the_table_has_a_row_per_category(result: suite.Report) -> None:
    table = report.table(result)
    assert table.splitlines()[0] == "| category | tried | passed | found |"
    assert len(table.splitlines()) == 2 + len(result.categories)
