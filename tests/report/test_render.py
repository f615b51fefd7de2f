"""The report page: moments read as dates, wide tables scroll inside the page."""

from __future__ import annotations

from pathlib import Path

from coordinator.report.render import Report, Table, write_html


def summary() -> Table:
    return Table("summary", "Summary", ["figure", "value", "unit"], [
        {"figure": "recording start (unix s)", "value": 1_795_383_495.1, "unit": "s"},
        {"figure": "workers", "value": 1234, "unit": "workers"},
    ])


def test_unix_times_show_as_dates_and_tables_scroll(tmp_path: Path) -> None:
    page = tmp_path / "index.html"
    write_html(page, Report("r", "now", {}, summary()))
    text = page.read_text()
    assert "2026-11-22 21:38:15 UTC" in text  # not 1,795,383,495.1
    assert "1,795,383,495" not in text
    assert ">1,234<" in text  # quantities keep their separators
    assert '<div class=scroll><table>' in text
