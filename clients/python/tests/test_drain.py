"""The Python worker drains 10 000 tasks with 16 threads against the three nodes while
one node (the leader) is killed with SIGKILL and restarted: every task is finished
exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Dict

import pytest

from conftest import Cluster, wait_until
from rota import Add, Lease, RotaClient, Task, Worker

TASKS = 10_000
BATCH = 2_000  # adds per /update: well within 10 000 items and the 1 MiB body limit
THREADS = 16
KILL_AFTER = 3_000  # finishes before the leader is killed


@pytest.mark.drain
def test_drain_10k_tasks_while_the_leader_restarts(cluster: Cluster, group: str, capsys: pytest.CaptureFixture[str]) -> None:
    client = RotaClient(cluster.urls)
    keys = [f"t{i:05d}" for i in range(TASKS)]
    added_at = time.monotonic()
    for start in range(0, TASKS, BATCH):
        tasks = client.add_many([Add(group, data=k, key=k) for k in keys[start:start + BATCH]])
        assert [t.key for t in tasks] == keys[start:start + BATCH]
    add_seconds = time.monotonic() - added_at

    acked: Counter[str] = Counter()  # finishes the cluster acknowledged, per key
    runs: Counter[str] = Counter()  # handler calls, per key
    lock = threading.Lock()

    def handle(task: Task, lease: Lease) -> Any:
        with lock:
            runs[task.key or ""] += 1
        return {"key": task.key, "fence": lease.fence}

    def on_finish(task: Task, result: Any) -> None:
        with lock:
            acked[task.key or ""] += 1

    worker = Worker(client, group, handle, threads=THREADS, lease_ms=10_000, wait_ms=2_000, on_finish=on_finish)
    started = time.monotonic()
    worker.start()
    events: Dict[str, float] = {}
    try:
        wait_until(lambda: sum(acked.values()) >= KILL_AFTER, timeout=120, what=f"{KILL_AFTER} finishes")
        victim = cluster.leader_id()
        cluster.kill(victim)
        events["killed"] = time.monotonic() - started
        events["finished when killed"] = sum(acked.values())
        time.sleep(1.0)
        cluster.up()  # restarts the killed node; returns once every node is ready
        events["restarted"] = time.monotonic() - started
        wait_until(lambda: sum(acked.values()) >= TASKS, timeout=150, every=0.1, what="every task finished")
        elapsed = time.monotonic() - started
    finally:
        worker.stop(timeout=30)

    rate = TASKS / elapsed
    with capsys.disabled():
        print(
            f"\n[drain] {TASKS} tasks added in {add_seconds:.1f} s ({BATCH} per update); drained by "
            f"{THREADS} threads in {elapsed:.1f} s = {rate:.0f} tasks/s, leader (node {victim}) "
            f"SIGKILLed at {events['killed']:.1f} s after {events['finished when killed']:.0f} finishes, "
            f"restarted and ready at {events['restarted']:.1f} s; handler calls {sum(runs.values())} "
            f"(re-runs after a lost lease: {sum(runs.values()) - len(runs)}); "
            f"{client.retries} requests retried on another node or after a pause"
        )

    # Every task finished exactly once: one acknowledged finish per key, none twice.
    assert len(acked) == TASKS
    twice = [k for k, n in acked.items() if n != 1]
    assert not twice, f"finished more than once: {twice[:10]}"
    assert set(acked) == set(keys)
    assert worker.finished == TASKS
    # The job records agree: every job succeeded, with the result of its one finish.
    jobs = list(client.iter_jobs(group))
    assert len(jobs) == TASKS
    not_done = [(j.key, j.state) for j in jobs if j.state != "succeeded"]
    assert not not_done, not_done[:10]
    assert all(j.result is not None and j.result["key"] == j.key for j in jobs)
    assert sum(1 for a in (j.history[-1] for j in jobs) if a.outcome == "succeeded") == TASKS
    assert client.group(group, owned=True) == [], "no task left in the group"
    assert rate > 0
