"""Every ```python snippet of python/README.md and of the top README runs as printed (issue 28:
docs that hold when copied). In each file, the snippet that starts with ``# worker.py`` is
written to ``worker.py``; every other one runs as a script beside it, as a reader would run it,
and must exit 0 with nothing on stderr (a warning on every run is a defect of the example)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Each README, and how many parent snippets it has at least (a lost fence loses snippets).
READMES = {"python/README.md": 3, "README.md": 1}


def snippets(doc: str) -> tuple[str, list[str]]:
    """The worker snippet and the others, in order."""
    found = re.findall(r"^```python\n(.*?)^```", (REPO / doc).read_text(), re.S | re.M)
    worker = next(s for s in found if s.startswith("# worker.py"))
    return worker, [s for s in found if s is not worker]


CASES = [(doc, i) for doc in READMES for i in range(len(snippets(doc)[1]))]


@pytest.mark.parametrize("doc", READMES)
def test_the_readme_has_its_snippets(doc: str) -> None:
    parents = snippets(doc)[1]
    assert len(parents) >= READMES[doc], f"{len(parents)} parent snippets found in {doc}"


@pytest.mark.parametrize("doc,index", CASES, ids=[f"{d}-{i}" for d, i in CASES])
def test_a_readme_snippet_runs_as_printed(doc: str, index: int, tmp_path: Path) -> None:
    worker, parents = snippets(doc)
    (tmp_path / "worker.py").write_text(worker)
    (tmp_path / "snippet.py").write_text(parents[index])
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"{doc} snippet {index}:\n{parents[index]}\nstderr:\n{done.stderr}"
    assert done.stderr == "", f"{doc} snippet {index} printed to stderr:\n{done.stderr}"
