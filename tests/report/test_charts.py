"""The report's charts as a reader sees them, checked on matplotlib's objects (legend
labels, colours, axis scale, what is drawn), not on pixels."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed")

from matplotlib.colors import to_hex  # noqa: E402

from coordinator.report.render import line_chart, tasks_per_worker_chart  # noqa: E402

START = 1_700_000_000.0
APIS = ["ApiVersions", "ConnectGroupDescribe", "ConnectGroupHeartbeat", "DescribeGroups",
        "FindCoordinator", "Heartbeat", "JoinGroup", "LeaveGroup", "ListGroups",
        "Metadata", "OffsetCommit", "OffsetFetch", "SyncGroup", "Unknown"]


def test_the_rate_legend_lists_the_apis_used_each_in_its_own_colour(tmp_path: Path) -> None:
    # Every API's counter exists from the start; only three were used, and heartbeats
    # are many more than the rest.
    series = {api: [(START + t, 0.0) for t in range(0, 30, 3)] for api in APIS}
    series["ConnectGroupHeartbeat"] = [(START + t, 30.0) for t in range(0, 30, 3)]
    series["ConnectGroupDescribe"] = [(START + t, 0.5) for t in range(0, 30, 3)]
    series["FindCoordinator"] = [(START, 2.0)] + [(START + t, 0.0) for t in range(3, 30, 3)]
    figure = line_chart(tmp_path / "rates.png", "rates", series, window_start=START,
                        y_label="requests / s")
    axes = figure.axes[0]
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels == ["ConnectGroupDescribe", "ConnectGroupHeartbeat", "FindCoordinator"]
    colours = [to_hex(line.get_color()) for line in axes.get_lines()]
    assert len(set(colours)) == len(colours) == 3
    # The legend stands beside the plot, so it hides no line.
    assert axes.get_legend().get_bbox_to_anchor().x0 > axes.bbox.x1


def test_more_lines_than_ten_never_repeat_a_colour(tmp_path: Path) -> None:
    series = {api: [(START, 1.0 + index), (START + 5, 2.0)] for index, api in
              enumerate(APIS)}
    axes = line_chart(tmp_path / "many.png", "many", series, window_start=START,
                      y_label="requests / s").axes[0]
    colours = [to_hex(line.get_color()) for line in axes.get_lines()]
    assert len(colours) == len(APIS) and len(set(colours)) == len(APIS)


def test_latency_on_a_log_axis_keeps_steady_values_visible_under_spikes(
        tmp_path: Path) -> None:
    steady = [(START + t, 0.2) for t in range(3, 60, 3)]
    series = {"ConnectGroupHeartbeat p99": [(START, 50.0), *steady]}
    axes = line_chart(tmp_path / "latency.png", "latency", series, window_start=START,
                      y_label="ms", log_y=True).axes[0]
    assert axes.get_yscale() == "log"
    low, high = axes.get_ylim()
    assert low <= 0.2 and high >= 50.0
    # A linear axis from 0 to 50 would put 0.2 ms within half a percent of the bottom;
    # on the log axis it sits well clear of it.
    assert axes.transLimits.transform((0, 0.2))[1] > 0.1


def test_times_are_seconds_from_the_start_of_the_recording(tmp_path: Path) -> None:
    axes = line_chart(tmp_path / "t.png", "t", {"x": [(START + 12, 1.0), (START + 40, 2.0)]},
                      window_start=START, y_label="n").axes[0]
    assert list(axes.get_lines()[0].get_xdata()) == [12.0, 40.0]
    assert axes.get_xlabel().startswith("seconds since ")


def test_equal_task_counts_are_a_labelled_bar_not_a_box(tmp_path: Path) -> None:
    axes = tasks_per_worker_chart(tmp_path / "tasks.png", {"e2e": [2, 2, 2, 2, 2, 2]}).axes[0]
    bars = axes.patches
    assert len(bars) == 1 and bars[0].get_width() == 2
    assert [text.get_text() for text in axes.texts] == ["2 on each of 6 workers"]
    assert not axes.get_lines()  # no box's whiskers and median
    assert all(float(tick).is_integer() for tick in axes.get_xticks())


def test_differing_task_counts_are_a_box_per_group(tmp_path: Path) -> None:
    axes = tasks_per_worker_chart(tmp_path / "tasks.png",
                                  {"a": [1, 2, 3, 5], "b": [4, 4]}).axes[0]
    assert not axes.patches and not axes.texts  # boxes are lines, no bars
    assert [tick.get_text() for tick in axes.get_yticklabels()] == ["a", "b"]
    assert axes.get_lines()
