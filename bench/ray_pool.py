"""W5 (CPU-bound tasks) on a Ray-launched wirepool pool, beside a local wirepool pool and Ray's
own ``ray.util.multiprocessing.Pool``, in the same run and on the same local Ray cluster.

    .venv/bin/python bench/ray_pool.py [--repeats 5] [--tasks-s 0.3] [--max-tasks 2000]
                                       [--task-us 1000,50] [--workers 2]

(``make test-ray`` installs Ray in the venv; ``pip install 'wirepool[ray]'`` elsewhere.)

Every contender burns the same CPU per task: ``task_us`` microseconds of the thread's CPU time
(``time.thread_time_ns``, so a task preempted by a neighbour still costs the same work), in a
Python process, ``workers`` processes:

- ``wirepool ray``: ``AsyncPool(launcher=RayLauncher(num_cpus=1))``: each worker (the bench's
  Python worker, bench/runners/wirepool_python_worker.py, method ``spin``) runs in a Ray actor
  and joins the pool over TCP + TLS 1.3 with its own ticket (PROTOCOL.md 21.8);
- ``wirepool local``: the same pool and worker with local children on socketpairs;
- ``ray pool``: ``ray.util.multiprocessing.Pool(workers)``, one ``apply_async`` per task, all
  submitted at once (Ray queues them: the most the pool can overlap);
- ``ray pool map``: ``Pool.map`` with its default chunksize (``len / (4 x workers)`` tasks per
  actor call): Ray's batching, which a caller gets by default for a list known in advance, and
  which no per-task API has; shown for completeness, not the target's baseline.

The wirepool pools are driven as bench/runners/wirepool_python.py drives W5: ``2 x workers``
callers each calling ``spin`` in turn (``max_in_flight`` 2). Each repeat runs every contender
once, in turn (alternated, so drift hits all alike), on the same tasks: ``tasks-s`` seconds of
ideal work, at most ``max-tasks`` tasks (Ray's pool spends 3-7 ms of wall time per task here:
6,000 tasks of 50 us would take it half a minute a repeat). The report gives tasks/s min / median /
max, the median's share of the ideal (``workers`` cores fully busy, capped by the machine's
cores) and the ratio of each repeat to Ray's pool of the same repeat (min / median / max).
Target (issue 14): ``wirepool ray`` >= 5x ``ray pool`` on 1 ms tasks.

On a machine whose cores others are using, compare ``wirepool ray`` with Ray's pools: their
processes are all started by Ray, in Ray's own sessions. The ``wirepool local`` workers are
children of this script, in its session, and with the kernel's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled``) a session shares the CPU as one group: under
contention they get less of it than Ray's processes do, whatever the pool's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import wirepool  # noqa: E402
from wirepool import launchers  # noqa: E402

WORKER = [sys.executable, os.path.join(HERE, "runners", "wirepool_python_worker.py")]
ENV = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))


def spin_cpu(task_us: int) -> int:
    """The task of Ray's pool: the bench worker's ``spin`` (and bench/runners/common.py's)."""
    deadline = time.thread_time_ns() + task_us * 1000
    while time.thread_time_ns() < deadline:
        pass
    return task_us


async def _drive(pool: wirepool.AsyncPool, task_us: int, tasks: int, callers: int) -> float:
    left = [tasks]

    async def caller() -> None:
        while left[0] > 0:
            left[0] -= 1
            if await pool.call("spin", task_us) != task_us:
                raise RuntimeError("spin answered a different value")
    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return tasks / (time.perf_counter() - start)


class WirepoolContender:
    """A started pool (local or Ray-launched), kept for every repeat like Ray's pool is. Its
    event loop runs in a thread of its own all along, so that heartbeats are answered while the
    other contenders run (a remote worker leaves a parent silent for 3 periods)."""

    def __init__(self, workers: int, ray_launched: bool) -> None:
        self.workers = workers
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        launcher = launchers.RayLauncher(num_cpus=1, host="127.0.0.1") if ray_launched else None
        self.pool = wirepool.AsyncPool(WORKER, workers=workers, max_in_flight=2, env=ENV,
                                       launcher=launcher, worker_output="discard",
                                       startup_timeout=120)
        self._wait(self.pool.start())
        self.run(1, 4 * workers)  # warm-up: every worker answered, code paths hot

    def _wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def run(self, task_us: int, tasks: int) -> float:
        return self._wait(_drive(self.pool, task_us, tasks, 2 * self.workers))

    def close(self) -> None:
        self._wait(self.pool.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class RayPoolContender:
    def __init__(self, workers: int, chunked: bool) -> None:
        from ray.util.multiprocessing import Pool
        self.pool = Pool(processes=workers)
        self.chunked = chunked
        self.run(1, 4 * workers)

    def run(self, task_us: int, tasks: int) -> float:
        start = time.perf_counter()
        if self.chunked:
            got = self.pool.map(spin_cpu, [task_us] * tasks)
        else:
            handles = [self.pool.apply_async(spin_cpu, (task_us,)) for _ in range(tasks)]
            got = [h.get() for h in handles]
        rate = tasks / (time.perf_counter() - start)
        if got != [task_us] * tasks:
            raise RuntimeError("Ray's pool answered different values")
        return rate

    def close(self) -> None:
        self.pool.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tasks-s", type=float, default=0.3,
                    help="seconds of ideal work per repeat (sets the task count)")
    ap.add_argument("--max-tasks", type=int, default=2000)
    ap.add_argument("--task-us", default="1000,50")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    import ray

    cores = os.cpu_count() or 1
    ray.init(num_cpus=max(args.workers, 2), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    names = ["wirepool ray", "wirepool local", "ray pool", "ray pool map"]
    try:
        contenders: dict[str, Any] = {
            "wirepool ray": WirepoolContender(args.workers, ray_launched=True),
            "wirepool local": WirepoolContender(args.workers, ray_launched=False),
            "ray pool": RayPoolContender(args.workers, chunked=False),
        }
        contenders["ray pool map"] = contenders["ray pool"]
        results: dict[tuple[int, str], list[float]] = {}
        task_us_list = [int(t) for t in args.task_us.split(",")]
        for task_us in task_us_list:
            ideal = min(args.workers, cores) / (task_us / 1e6)
            tasks = max(8 * args.workers, min(args.max_tasks, round(args.tasks_s * ideal)))
            for _ in range(args.repeats):
                for name in names:
                    c = contenders[name]
                    if name.startswith("ray pool"):
                        c.chunked = name == "ray pool map"
                    results.setdefault((task_us, name), []).append(c.run(task_us, tasks))
        for c in {id(c): c for c in contenders.values()}.values():
            c.close()
    finally:
        ray.shutdown()
    print(f"# W5 CPU-bound tasks, {args.workers} workers, {cores} cores, {args.repeats} repeats "
          f"alternated, {args.tasks_s:g} s of ideal work each; tasks/s")
    print(f"{'task':8} {'contender':15} {'min':>9} {'median':>9} {'max':>9} {'of ideal':>9} "
          f"{'vs ray pool (min/med/max)':>28}")
    doc: dict[str, Any] = {"workers": args.workers, "cores": cores, "repeats": args.repeats,
                           "rows": []}
    for task_us in task_us_list:
        ideal = min(args.workers, cores) / (task_us / 1e6)
        base = results[(task_us, "ray pool")]
        for name in names:
            v = results[(task_us, name)]
            ratios = [a / b for a, b in zip(v, base)]
            med = statistics.median(v)
            print(f"{task_us:>5} us {name:15} {min(v):9,.0f} {med:9,.0f} {max(v):9,.0f} "
                  f"{med / ideal:8.0%} {min(ratios):9.2f}x {statistics.median(ratios):7.2f}x "
                  f"{max(ratios):7.2f}x")
            doc["rows"].append({"task_us": task_us, "contender": name, "tasks_per_s": v,
                                "ideal_tasks_per_s": ideal, "vs_ray_pool": ratios})
    print("ideal: the workers' cores fully busy with task CPU; 'vs ray pool' is each repeat's "
          "ratio to Ray's pool in the same repeat")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
