"""Writing the report: CSV per table, figures.json, matplotlib PNGs and index.html."""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The object-oriented matplotlib API needs no pyplot state and no display backend.
import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as PlotFigure

Row = dict[str, Any]


@dataclass
class Table:
    """A named table: rows of plain values, written as ``<name>.csv`` and into figures.json."""

    name: str
    title: str
    columns: list[str]
    rows: list[Row]
    note: str = ""


@dataclass
class Chart:
    """A PNG file and what it shows; ``missing_reason`` is set when there was no data."""

    file: str
    title: str
    missing_reason: str = ""


@dataclass
class Report:
    title: str
    generated_at: str
    inputs: dict[str, Any]
    summary: Table
    tables: list[Table] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    group_details: list[Table] = field(default_factory=list)
    # kind, text, reasons (coordinator/report/headline.py)
    headline: dict[str, Any] = field(default_factory=dict)


def _plain(value: Any) -> Any:
    """JSON- and CSV-safe values: no NaN or infinity, numbers stay numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_csv(path: Path, table: Table) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=table.columns, extrasaction="ignore")
        writer.writeheader()
        for row in table.rows:
            writer.writerow({key: _csv_cell(row.get(key)) for key in table.columns})


def _csv_cell(value: Any) -> Any:
    value = _plain(value)
    return "" if value is None else value


def write_figures_json(path: Path, report: Report, extra: Mapping[str, Any]) -> None:
    def table_json(table: Table) -> dict[str, Any]:
        return {
            "title": table.title,
            "columns": table.columns,
            "rows": [{key: _plain(row.get(key)) for key in table.columns} for row in table.rows],
            "csv": f"{table.name}.csv",
            "note": table.note,
        }

    document = {
        "title": report.title,
        "generated_at": report.generated_at,
        "inputs": report.inputs,
        "summary": {
            row["figure"]: {key: _plain(value) for key, value in row.items() if key != "figure"}
            for row in report.summary.rows
        },
        "tables": {table.name: table_json(table) for table in report.tables},
        "charts": {
            chart.file: {"title": chart.title, "missing_reason": chart.missing_reason}
            for chart in report.charts
        },
        "models": report.models,
        **extra,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=False, default=_plain) + "\n")


# ---------------------------------------------------------------------------------------
# Charts


def _new_plot(title: str, height: float = 3.6) -> tuple[PlotFigure, Any]:
    figure = PlotFigure(figsize=(9, height), dpi=90)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    return figure, axes


def _save(figure: PlotFigure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, format="png")


def missing_chart(path: Path, title: str, reason: str) -> None:
    """A placeholder PNG, so the page and the file list look the same with or without data."""
    figure, axes = _new_plot(title, height=1.6)
    axes.axis("off")
    axes.text(0.5, 0.5, f"no data: {reason}", ha="center", va="center", fontsize=11)
    _save(figure, path)


# Up to this span the time axis is in seconds, beyond it in minutes.
SECONDS_AXIS_LIMIT = 600.0


def time_axis(window_start: float, span_seconds: float) -> tuple[float, str]:
    """(seconds per axis unit, axis label) for a chart starting at ``window_start``."""
    started = datetime.fromtimestamp(window_start, UTC).strftime("%H:%M:%S UTC on %Y-%m-%d")
    if span_seconds <= SECONDS_AXIS_LIMIT:
        return 1.0, f"seconds since {started}"
    return 60.0, f"minutes since {started}"


def used_series(series: Mapping[str, Sequence[tuple[float, float]]]
                ) -> dict[str, Sequence[tuple[float, float]]]:
    """The series with something to show: every API's counter exists from the start, but
    one that stayed at zero is only clutter in the legend."""
    return {name: points for name, points in series.items()
            if any(value for _, value in points)}


def distinct_colours(count: int) -> list[Any]:
    """One colour per line, none repeated: matplotlib's ten-colour cycle repeats after ten
    lines, so more than ten take the twenty-colour palette."""
    palette = matplotlib.colormaps["tab10" if count <= 10 else "tab20"]
    return [palette(index % palette.N) for index in range(count)]


def line_chart(path: Path, title: str, series: Mapping[str, Sequence[tuple[float, float]]],
               *, window_start: float, y_label: str, log_y: bool = False) -> PlotFigure:
    """Lines over seconds (or minutes) from ``window_start``; with ``log_y`` the y axis is
    logarithmic, so small steady values stay visible under rare large ones."""
    figure, axes = _new_plot(title)
    shown = used_series(series)
    latest = max((time for points in shown.values() for time, _ in points),
                 default=window_start)
    unit, label = time_axis(window_start, latest - window_start)
    for (name, points), colour in zip(sorted(shown.items()), distinct_colours(len(shown)),
                                      strict=True):
        ordered = sorted(points)
        axes.plot(
            [(time - window_start) / unit for time, _ in ordered],
            [value for _, value in ordered],
            marker=".",
            label=name,
            color=colour,
        )
    axes.set_xlabel(label)
    axes.set_ylabel(y_label + (" (log scale)" if log_y else ""))
    if log_y and shown:
        axes.set_yscale("log")
    if shown:
        # Beside the plot, not over it: no line hides behind the legend.
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(figure, path)
    return figure


def tasks_per_worker_chart(path: Path, tasks_by_group: Mapping[str, Sequence[int]],
                           limit: int = 30) -> PlotFigure:
    """Per group (the largest ``limit``), its workers' task counts: a box where they differ;
    where every worker of every group runs the same count, a bar with that count written
    on it (a box of one value is a line on an axis of nothing)."""
    largest = sorted(tasks_by_group, key=lambda group: (-len(tasks_by_group[group]), group))
    shown = sorted(largest[:limit])
    title = "tasks per worker per group"
    if len(tasks_by_group) > limit:
        title += f" (largest {limit} of {len(tasks_by_group)} groups)"
    figure, axes = _new_plot(title, height=max(3.0, 0.3 * len(shown) + 1.2))
    counts = [list(tasks_by_group[group]) for group in shown]
    positions = range(1, len(shown) + 1)
    if all(len(set(values)) == 1 for values in counts):
        bars = axes.barh(positions, [values[0] for values in counts], color="tab:blue")
        axes.bar_label(bars, [f"{values[0]:,} on each of {len(values):,} workers"
                              for values in counts], padding=4, fontsize=8)
        axes.margins(x=0.3)
    else:
        axes.boxplot(counts, orientation="horizontal")
    axes.set_yticks(positions, shown, fontsize=8)
    axes.set_xlabel("tasks on one worker")
    axes.xaxis.get_major_locator().set_params(integer=True)
    _save(figure, path)
    return figure


# ---------------------------------------------------------------------------------------
# HTML


def _format(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e15:
            return f"{int(value):,}"
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table_html(table: Table, heading: str = "h2") -> str:
    head = "".join(f"<th>{html.escape(column)}</th>" for column in table.columns)
    body = []
    for row in table.rows:
        cells = []
        for column in table.columns:
            value = row.get(column)
            css = ' class="missing"' if row.get("status") == "missing" else ""
            text = _format(value)
            if column == "value" and "unix" in str(row.get("figure", "")) \
                    and isinstance(_plain(value), (int, float)):
                # a moment, not a quantity: a reader wants the date (the CSV keeps the number)
                text = datetime.fromtimestamp(float(_plain(value)), UTC).strftime(
                    "%Y-%m-%d %H:%M:%S UTC")
            cells.append(f"<td{css}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = f"<p class=note>{html.escape(table.note)}</p>" if table.note else ""
    link = f' <a href="{html.escape(table.name)}.csv">CSV</a>'
    return (
        f"<{heading} id=\"{html.escape(table.name)}\">{html.escape(table.title)}{link}"
        f"</{heading}>{note}<div class=scroll><table><thead><tr>{head}</tr></thead><tbody>"
        + "".join(body)
        + "</tbody></table></div>"
    )


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f2f2f2; }
td:first-child, th:first-child { text-align: left; }
td.missing { color: #a33; }
p.note { color: #555; font-size: 0.9em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
div.scroll { overflow-x: auto; max-width: 100%; }
h2 a, h3 a { font-size: 0.6em; font-weight: normal; }
div.headline { border-left: 6px solid #2a7; background: #f4faf6; padding: 0.4em 1em; }
div.headline.disturbed, div.headline.too_short, div.headline.no_data,
div.headline.over_budget { border-color: #c90; background: #fdf8ee; }
div.headline.failed { border-color: #c33; background: #fdf0f0; }
div.headline p { font-size: 1.1em; margin: 0.4em 0; }
"""


def _headline_html(headline: Mapping[str, Any]) -> str:
    if not headline:
        return ""
    reasons = "".join(f"<li>{html.escape(str(reason))}</li>"
                      for reason in headline.get("reasons", []))
    return (f'<div class="headline {html.escape(str(headline.get("kind", "")))}" '
            f'id="headline"><p>{html.escape(str(headline.get("text", "")))}</p>'
            + (f"<ul>{reasons}</ul>" if reasons else "") + "</div>")


def write_html(path: Path, report: Report) -> None:
    inputs = "".join(
        f"<li>{html.escape(str(key))}: <code>{html.escape(str(value))}</code></li>"
        for key, value in report.inputs.items()
    )
    charts = []
    for chart in report.charts:
        reason = (
            f"<p class=note>missing: {html.escape(chart.missing_reason)}</p>"
            if chart.missing_reason
            else ""
        )
        charts.append(
            f"<h3>{html.escape(chart.title)}</h3>{reason}"
            f"<img src=\"{html.escape(chart.file)}\" alt=\"{html.escape(chart.title)}\">"
        )
    models = "".join(f"<li>{html.escape(model)}</li>" for model in report.models)
    details = "".join(_table_html(table, "h3") for table in report.group_details)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(report.title)}</title><style>{STYLE}</style></head>
<body>
<h1>{html.escape(report.title)}</h1>
{_headline_html(report.headline)}
<p class=note>Generated {html.escape(report.generated_at)}. All figures are also in
<a href="figures.json">figures.json</a> and one CSV per table.</p>
<ul>{inputs}</ul>
{_table_html(report.summary)}
<h2>Capacity model</h2><ul>{models}</ul>
<h2>Charts</h2>
{"".join(charts)}
{"".join(_table_html(table) for table in report.tables)}
<h2>Workers per group</h2>
{details or "<p class=note>no snapshot given</p>"}
</body></html>
"""
    path.write_text(page)
