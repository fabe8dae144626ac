"""Ctrl-C in a blocking caller: prompt and quiet in every form (issue 15).

Each case runs a small program in a child interpreter, interrupts it with SIGINT while it waits
for rows, and checks that it exits within a bound well below the pool's 5 s close grace and
prints nothing but the KeyboardInterrupt traceback.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BASIC = os.path.join(os.path.dirname(__file__), "workers", "basic.py")

FORMS = {
    # The README's form: a bare ``for`` inside the pool's ``with``. The interrupted iterator is
    # kept alive by the traceback, so the pool's close used to wait out its 5 s grace.
    "bare_for_in_pool_with": """
        with wirepool.Pool([sys.executable, BASIC]) as pool:
            for row in pool.stream(METHOD, {}):
                ready()
    """,
    "stream_with": """
        with wirepool.Pool([sys.executable, BASIC]) as pool:
            with pool.stream(METHOD, {}) as rows:
                for row in rows:
                    ready()
    """,
    "bare_for_no_with": """
        pool = wirepool.Pool([sys.executable, BASIC])
        for row in pool.stream(METHOD, {}):
            ready()
    """,
    "next_by_hand": """
        with wirepool.Pool([sys.executable, BASIC]) as pool:
            rows = pool.stream(METHOD, {})
            while True:
                next(rows)
                ready()
    """,
}

PRELUDE = """
import os, sys, wirepool
BASIC, METHOD = sys.argv[1], sys.argv[2]
_said = False
def ready():
    global _said
    if not _said:  # the parent test interrupts us once it reads this line
        _said = True
        print("ready", flush=True)
"""


@pytest.mark.parametrize("method", ["trickle", "endless"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_ctrl_c_while_streaming_is_prompt_and_quiet(form: str, method: str) -> None:
    program = PRELUDE + textwrap.dedent(FORMS[form])
    proc = subprocess.Popen([sys.executable, "-c", program, BASIC, method],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        # ``trickle`` now blocks the reader in its wait for the second row; ``endless`` keeps
        # it busy reading.
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
        took = time.monotonic() - interrupted
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0  # the interrupt propagated
    assert "KeyboardInterrupt" in err, err
    for noise in ("never awaited", "Event loop is closed", "Exception ignored", "Task was destroyed"):
        assert noise not in err, err
    # The pool closes with a 5 s grace; an interrupted stream must not spend it.
    assert took < 3.5, f"{form}/{method}: exited {took:.1f}s after Ctrl-C\n{err}"


def test_ctrl_c_while_the_pool_starts_is_prompt_and_quiet(tmp_path: Path) -> None:
    """Interrupting ``Pool(...)`` while its workers start: their reaping used to wait out its
    timeouts (~6 s) and pending tasks complained at exit."""
    marker = tmp_path / "spawned"
    slow_hello = (f"import time; open({str(marker)!r}, 'a').close(); time.sleep(5); "
                  f"exec(open({BASIC!r}).read())")
    program = "import sys, wirepool\nwirepool.Pool([sys.executable, '-c', sys.argv[1]], workers=2)\n"
    proc = subprocess.Popen([sys.executable, "-c", program, slow_hello], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():  # a worker runs: the pool is inside its start-up
            assert time.monotonic() < deadline and proc.poll() is None, "no worker started"
            time.sleep(0.01)
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
        took = time.monotonic() - interrupted
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    for noise in ("never awaited", "Event loop is closed", "Exception ignored", "Task was destroyed"):
        assert noise not in err, err
    assert took < 3.5, f"exited {took:.1f}s after Ctrl-C\n{err}"


# The child's helper thread hands SIGINT to the pool's loop thread, as the kernel may for a
# process-directed Ctrl-C: its C handler runs there and the main thread, asleep in its wait, is
# not woken by it.
TO_THE_LOOP_THREAD = """
import os, signal, sys, threading, time, wirepool
BASIC, MARKER = sys.argv[1], sys.argv[2]
def deliver():
    while not os.path.exists(MARKER):
        time.sleep(0.01)
    loop_thread = next(t for t in threading.enumerate() if t.name == "wirepool-pool")
    signal.pthread_kill(loop_thread.ident, signal.SIGINT)
threading.Thread(target=deliver, daemon=True).start()
"""

WAITS = {
    # Pool(...) waits for its workers' HELLO (each sleeps 5 s first).
    "start": """
slow_hello = (f"import time; open({MARKER!r}, 'a').close(); time.sleep(5); "
              f"exec(open({BASIC!r}).read())")
wirepool.Pool([sys.executable, '-c', slow_hello], workers=2)
""",
    # A blocking call waits for a 5 s result.
    "call": """
with wirepool.Pool([sys.executable, BASIC], workers=1) as pool:
    open(MARKER, 'a').close()
    pool.call("sleep", {"seconds": 5})
""",
    # A map's reader waits for its head result.
    "map": """
with wirepool.Pool([sys.executable, BASIC], workers=1) as pool:
    open(MARKER, 'a').close()
    list(pool.map("sleep", [{"seconds": 5}]))
""",
    # A stream's reader waits for its second row (10 s away).
    "stream": """
with wirepool.Pool([sys.executable, BASIC], workers=1) as pool:
    for row in pool.stream("trickle", {}):
        open(MARKER, 'a').close()
""",
}


@pytest.mark.parametrize("wait", sorted(WAITS))
def test_a_ctrl_c_the_kernel_hands_to_the_loop_thread_still_interrupts_promptly(
        wait: str, tmp_path: Path) -> None:
    program = TO_THE_LOOP_THREAD + WAITS[wait]
    proc = subprocess.Popen([sys.executable, "-c", program, BASIC, str(tmp_path / "waiting")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    started = time.monotonic()
    try:
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    for noise in ("never awaited", "Event loop is closed", "Exception ignored", "Task was destroyed"):
        assert noise not in err, err
    # The waits last 5 s or more; the pool's start-up, the interrupt and the close fit well inside 3.5 s.
    assert took < 3.5, f"{wait}: exited {took:.1f}s after it started\n{err}"
