"""A language added from outside the repository (``WIREPOOL_LANGUAGES``, "Adding a language" in
README.md): its rows join every suite's list, ``{here}`` is its own file's folder, a name given
twice is refused, and a parent runner drives the added worker as it drives ours."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import test_matrix as matrix

PYTHON_WORKER = matrix.REPO / "python" / "conformance" / "worker.py"


def _outside_sdk(tmp_path: Path, name: str = "outside") -> Path:
    """An 'SDK' kept elsewhere: a launcher script beside its own languages file."""
    script = tmp_path / "worker.sh"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{PYTHON_WORKER}" "$@"\n',
                      encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    extra = tmp_path / "languages.json"
    extra.write_text(json.dumps({"languages": [
        {"name": name, "worker": ["{here}/worker.sh"], "remote": False,
         "remote_reason": "a test row"}]}), encoding="utf-8")
    return extra


def test_extra_rows_join_and_here_is_their_folder(tmp_path: Path) -> None:
    rows = matrix.load_languages(str(_outside_sdk(tmp_path)))
    assert [r["name"] for r in rows[:-1]] == [r["name"] for r in matrix.load_languages(None)]
    assert rows[-1]["worker"] == [str(tmp_path / "worker.sh")]


def test_a_name_given_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="named twice.*python"):
        matrix.load_languages(str(_outside_sdk(tmp_path, "python")))


def test_the_environment_reaches_every_suite(tmp_path: Path) -> None:
    code = ("import json, test_matrix as m, test_remote as r; "
            "print(json.dumps([m.WORKERS, r.REMOTE_WORKERS, r.NOT_REMOTE_WORKERS]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=matrix.HERE, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, matrix.LANGUAGES_ENV: str(_outside_sdk(tmp_path))})
    assert done.returncode == 0, done.stderr
    workers, remote, not_remote = json.loads(done.stdout)
    assert "outside" in workers and "outside" not in remote
    assert not_remote["outside"] == "a test row"


def test_a_parent_runner_drives_the_added_worker(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    lang = matrix.load_languages(str(_outside_sdk(tmp_path)))[-1]
    monkeypatch.setitem(matrix.BY_NAME, "outside", lang)
    picked = [sc for sc in matrix.SCENARIOS["scenarios"]
              if sc["name"] in ("echo_raw_4_kib", "echo_json_larger_than_one_frame")]
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps({**matrix.SCENARIOS, "scenarios": picked}), encoding="utf-8")
    run = matrix.run_runner("python", "outside", path)
    assert run.error is None, run.error
    assert set(run.reports) == {sc["name"] for sc in picked}, run.stderr_tail
    assert all(r["ok"] for r in run.reports.values()), run.reports
    assert not run.leaked
