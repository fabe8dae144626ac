"""Tells test_matrix.py which pairs this session selected, so that their runners start together
(at most test_matrix.CONCURRENT_RUNS at once) instead of one after another."""

from __future__ import annotations

import pytest

import test_matrix


def pytest_collection_finish(session: pytest.Session) -> None:
    """``session.items`` here is what runs: after ``-k`` and the other deselections."""
    for item in session.items:
        if item.path.name != "test_matrix.py":
            continue
        params = getattr(item, "callspec", None)
        if params is None:
            continue
        pair = (params.params.get("parent"), params.params.get("worker"))
        if pair in test_matrix.PAIRS:
            test_matrix.SELECTED_PAIRS.add(pair)  # type: ignore[arg-type]
