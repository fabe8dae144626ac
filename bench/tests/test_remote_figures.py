"""The recorded remote figures (bench/remote_figures.py) and their section in the bench report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import remote_figures  # noqa: E402
from harness import report  # noqa: E402


def test_re_measuring_one_section_keeps_the_others_in_order() -> None:
    old = remote_figures.compose({"listener": "### L\n\nold listener", "tls_rust": "### T\n\nx"})
    sections = remote_figures.parse(old)
    assert sections == {"tls_rust": "### T\n\nx", "listener": "### L\n\nold listener"}
    sections["ray_w5"] = "### R\n\n```\nnew\n```"
    text = remote_figures.compose(sections)
    assert remote_figures.parse(text) == sections
    assert text.index("### T") < text.index("### R") < text.index("### L")  # SECTIONS' order
    assert text.startswith("# Remote workers: recorded figures")


def test_the_report_includes_the_figures_without_their_title(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "REMOTE_FIGURES", tmp_path / "missing.md")
    assert report._remote_section() == []
    figures = tmp_path / "figures.md"
    figures.write_text(remote_figures.compose({"tls_rust": "### T\n\n```\nW3 1,234\n```"}))
    monkeypatch.setattr(report, "REMOTE_FIGURES", figures)
    lines = report._remote_section()
    assert lines[1] == "## Remote workers: TLS, the Ray launcher, the listener"
    assert "W3 1,234" in lines and "### T" in lines
    assert not any(line.startswith("# ") for line in lines)
