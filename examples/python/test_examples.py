"""Every Python example runs and prints what its docstring promises."""

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

EXPECTED = {
    "unary.py": ["1 + 2 = 3", "sum of 10,000 calls: 50005000"],
    "stream.py": ["100000 rows", "summary {'count': 100000}"],
    "lease.py": ["'items': ['a', 'b', 'c']"],
    "cancel.py": ["cancelled; the worker stayed warm", "deadline: DEADLINE_EXCEEDED 206",
                  "still answers: {'sum': 4}"],
    "crash.py": ["WORKER_EXITED (300)", "exited with status 3", "crash: about to die on purpose",
                 "the pool replaced the worker: {'sum': 42}"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str) -> None:
    out = subprocess.run([sys.executable, str(HERE / name)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for line in EXPECTED[name]:
        assert line in out.stdout, f"{name}: {line!r} not in output:\n{out.stdout}\n{out.stderr}"


def test_lease_keeps_one_worker() -> None:
    out = subprocess.run([sys.executable, str(HERE / "lease.py")], capture_output=True, text=True,
                         timeout=60)
    pids = {line.split("'pid': ")[1].split(",")[0] for line in out.stdout.splitlines()}
    assert len(pids) == 1, out.stdout
