"""loadtest.studies._trust's pure parts: how a row is judged against issue 44's targets, and how a gap is netted."""

from __future__ import annotations

from loadtest.studies._trust import Row, misses, rss_cell, status_summary, table, verdict
from loadtest.studies._trust_monitor import SELF, _net, waited


def row(**changes: object) -> Row:
    fields = dict(
        attack="redos",
        tree="abc1234",
        statuses={"201": 3, "422": 3},
        gap_ms=180.0,
        net_gap_ms=40.0,
        long_gaps=2,
        slowest_s=0.3,
        rss={11: [150.0, 170.0, 155.0], 12: [148.0, 149.0, 149.0]},
        initial=[11, 12],
        crashed=0,
        restarted=0,
        connections=0,
        probed="2/2",
        figures={},
    )
    fields.update(changes)
    return Row(**fields)  # type: ignore[arg-type]


def test_a_row_within_every_target_meets_them():
    assert misses(row()) == []
    assert verdict(row()) == "meets"


def test_each_target_missed_is_named_with_its_figure():
    bad = row(
        statuses={"500": 2, "timeout": 1},
        net_gap_ms=1500.0,
        crashed=1,
        connections=3,
        rss={11: [150.0, 1464.0, 1460.0], 12: [148.0, 149.0, 149.0]},
    )
    assert misses(bad, idle_net_ms=90.0) == [
        "/healthz gap 1500 ms net of CPU waits > 100 (idle: 90)",
        "2 5xx",
        "1 requests without an answer",
        "1 worker(s) died",
        "3 connection(s) to the listener",
        "worker RSS +1310 MB after 10 s",
    ]


def test_an_attacks_own_figures_are_judged_each_round():
    figures = {
        "invalid bodies accepted (2xx)": [0, 12],
        "stream end after the CLI returned (s)": [0.02, None, 1.5, "not opened (503)"],
        "failed requests": ["0 of 300", "7 of 290"],
        "batch operations": [[201, 201, 200], "none (not per operation)"],
    }
    assert misses(row(figures=figures)) == [
        "12 invalid bodies stored",
        "2 stream(s) open > 1 s after revocation",
        "1 stream(s) not opened",
        "failed requests (7 of 290)",
        "a batch not answered per operation (none (not per operation))",
    ]


def test_a_reload_replacing_the_workers_is_not_a_crash():
    hup = row(attack="hup-pgid", crashed=2, restarted=2, expect_reload=True, rss={})
    assert misses(hup) == []


def test_the_rss_cell_shows_the_worker_that_rose_most_and_the_table_one_line_a_row():
    assert rss_cell(row()) == "150/170/155"
    assert status_summary({"422": 3, "201": 3}) == "201 x3 422 x3"
    lines = table([row(attack="idle"), row()])
    assert len(lines) == 4 and lines[3].endswith("| meets |")


def test_a_gap_is_netted_of_its_workers_and_the_monitors_cpu_waits():
    # (time, {pid: ns waited so far}); worker 7 waited 300 ms and the monitor 100 ms within the gap.
    timeline = [(0.0, {SELF: 0, 7: 0}), (1.0, {SELF: 0, 7: 0}), (1.6, {SELF: 100_000_000, 7: 300_000_000})]
    assert waited(timeline, 7, 1.05, 1.55) == 0.3
    assert round(_net(timeline, (1.05, 1.55, 7)), 3) == 0.1
    assert _net(timeline, (1.05, 1.55, None)) == _net(timeline, (1.05, 1.55, 7))
    assert waited(timeline, 7, 1.05, 2.0) == 0.0  # no sample after the gap: nothing subtracted
