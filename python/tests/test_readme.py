"""Every ```python snippet of python/README.md runs as printed (issue 28: docs that hold when
copied). The snippet that starts with ``# worker.py`` is written to ``worker.py``; every other
one runs as a script beside it, as a reader would run it, and must exit 0 with nothing on stderr
(a warning on every run is a defect of the example)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
WORKER = next(s for s in SNIPPETS if s.startswith("# worker.py"))
PARENTS = [s for s in SNIPPETS if s is not WORKER]


def test_the_readme_has_its_snippets() -> None:
    assert len(PARENTS) >= 3, f"{len(PARENTS)} parent snippets found in {README}"


@pytest.mark.parametrize("index", range(len(PARENTS)))
def test_a_readme_snippet_runs_as_printed(index: int, tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "snippet.py").write_text(PARENTS[index])
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"snippet {index}:\n{PARENTS[index]}\nstderr:\n{done.stderr}"
    assert done.stderr == "", f"snippet {index} printed to stderr:\n{done.stderr}"
