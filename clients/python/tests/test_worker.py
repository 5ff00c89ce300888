"""The worker loop: results and errors recorded in the job outcomes, blocking claims,
graceful stop."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Dict, List

from conftest import wait_until
from rota import FailTask, Lease, RotaClient, Task, Worker, worker


def claim_waits(client: RotaClient) -> List[int]:
    """The wait, in ms, of each claim ``client`` sends from now on (filled as they go)."""
    waits: List[int] = []
    real = client.claim_lease

    signature = inspect.signature(real)

    def counted(*args: Any, **kwargs: Any) -> Any:
        waits.append(signature.bind(*args, **kwargs).arguments.get("wait_ms", 0))
        return real(*args, **kwargs)

    client.claim_lease = counted  # type: ignore[method-assign]
    return waits


def test_results_finish_and_exceptions_fail(client: RotaClient, group: str) -> None:
    keys = [f"job-{i}" for i in range(12)]
    client.add_many([{"group": group, "key": k, "data": str(i), "max_attempts": 1} for i, k in enumerate(keys)])
    finished: List[str] = []
    failed: Dict[str, str] = {}
    lock = threading.Lock()

    def on_finish(task: Task, result: Any) -> None:
        with lock:
            finished.append(task.key or "")

    def on_fail(task: Task, error: str) -> None:
        with lock:
            failed[task.key or ""] = error

    @worker(client, group, threads=4, lease_ms=10_000, wait_ms=1_000, on_finish=on_finish, on_fail=on_fail)
    def handle(task: Task, lease: Lease) -> Any:
        n = int(task.data)
        assert lease.fence == lease.task.id and task.key == lease.task.key
        if n % 4 == 1:
            raise ValueError(f"cannot handle {n}")
        if n % 4 == 2:
            raise FailTask(f"refused {n}", retry_in_ms=0)
        if n % 4 == 3:
            return None
        return {"square": n * n}

    with handle:
        done = client.wait_jobs(group, keys, wait_ms=20_000)
    assert done.finished, [(j.key, j.state) for j in done.jobs]
    by_key = {j.key: j for j in done.jobs}
    for i, key in enumerate(keys):
        job = by_key[key]
        if i % 4 == 0:
            assert (job.state, job.result) == ("succeeded", {"square": i * i})
        elif i % 4 == 1:
            assert job.state == "dead" and job.history[-1].error == f"ValueError: cannot handle {i}"
            assert job.reason == f"attempt 1 failed: ValueError: cannot handle {i}"
        elif i % 4 == 2:
            assert job.state == "dead" and job.history[-1].error == f"refused {i}"
        else:
            assert (job.state, job.result) == ("succeeded", None)
        assert len(job.history) == 1 and job.history[0].owner == client.client_id
    assert sorted(finished) == sorted(k for i, k in enumerate(keys) if i % 4 in (0, 3))
    assert set(failed) == {k for i, k in enumerate(keys) if i % 4 in (1, 2)}
    assert (handle.finished, handle.failed, handle.lost) == (6, 6, 0)
    assert not handle.running


def test_a_failed_task_is_retried_until_it_succeeds(client: RotaClient, group: str) -> None:
    client.add(group, "flaky", key="flaky")
    calls: List[int] = []

    def handle(task: Task, lease: Lease) -> Any:
        calls.append(task.attempt)
        if len(calls) < 3:
            raise FailTask("not yet", retry_in_ms=0)
        return "third time"

    w = Worker(client, group, handle, threads=2, wait_ms=1_000)
    w.start()
    job = client.job(group, "flaky", wait_ms=20_000)
    w.stop()
    assert job.state == "succeeded" and job.result == "third time"
    assert calls == [1, 2, 3]
    assert [a.outcome for a in job.history] == ["failed", "failed", "succeeded"]


def test_idle_workers_wait_in_blocking_claims_and_stop_at_once(client: RotaClient, group: str) -> None:
    seen: List[str] = []
    w = Worker(client, group, lambda task, lease: seen.append(task.data), threads=3, wait_ms=30_000)
    w.start()
    time.sleep(0.5)
    client.add(group, "late")
    wait_until(lambda: seen == ["late"], timeout=10, what="the waiting claim took the new task")
    started = time.monotonic()
    assert w.stop(timeout=10)
    assert time.monotonic() - started < 3, "waiting claims are abandoned, not waited out"


def test_stop_lets_running_work_finish_within_the_grace(client: RotaClient, group: str) -> None:
    client.add(group, "slow", key="slow")
    started = threading.Event()

    def slow(task: Task, lease: Lease) -> Any:
        started.set()
        time.sleep(1.0)
        return "finished in the grace"

    w = Worker(client, group, slow, grace_ms=5_000, wait_ms=1_000)
    w.start()
    assert started.wait(10)
    w.stop()
    assert w.finished == 1
    job = client.job(group, "slow")
    assert job.state == "succeeded" and job.result == "finished in the grace"


def test_work_past_the_grace_is_given_back_so_it_runs_elsewhere_at_once(client: RotaClient, group: str) -> None:
    client.add(group, "stuck", key="stuck", max_attempts=1)
    started = threading.Event()
    release = threading.Event()

    def stuck(task: Task, lease: Lease) -> Any:
        started.set()
        release.wait(20)
        return "too late"

    w = Worker(client, group, stuck, grace_ms=300, wait_ms=1_000)
    w.start()
    assert started.wait(10)
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 3
    # Released, not failed: the job on its only attempt is not dead, and is claimable now.
    job = client.job(group, "stuck")
    assert job.state == "waiting" and job.history[-1].outcome == "released", job
    assert client.claim(group, 60_000) is not None
    release.set()
    wait_until(lambda: w.lost == 1, timeout=5, what="the late finish is counted as lost")
    assert w.finished == 0


def test_a_finish_the_cluster_refuses_is_counted_as_lost(client: RotaClient, group: str) -> None:
    """The job is cancelled before its lease's first renewal could tell: the finish is
    refused, and the worker counts the task as lost, not as nothing."""
    client.add(group, "x", key="gone")

    def cancel_then_return(task: Task, lease: Lease) -> Any:
        client.cancel(group, ["gone"])
        return "too late"

    w = Worker(client, group, cancel_then_return, lease_ms=60_000, wait_ms=1_000)
    w.start()
    try:
        wait_until(lambda: w.lost == 1, timeout=10, what="the refused finish is counted as lost")
    finally:
        w.stop()
    assert w.finished == 0


def test_a_handler_whose_task_is_cancelled_sees_its_lease_lost(client: RotaClient, group: str) -> None:
    client.add(group, "halt", key="halt")
    saw_loss = threading.Event()

    def long(task: Task, lease: Lease) -> Any:
        client.cancel(group, ["halt"])
        if lease.wait_lost(10):
            saw_loss.set()
        lease.check()  # raises LeaseLost: the worker counts the task lost
        return "unreachable"

    w = Worker(client, group, long, lease_ms=900, wait_ms=1_000)
    w.start()
    assert saw_loss.wait(15)
    wait_until(lambda: w.lost == 1, timeout=5)
    w.stop()
    assert (w.finished, w.failed) == (0, 0)
    assert client.job(group, "halt").state == "cancelled"


def test_client_decorator_and_non_json_results(client: RotaClient, group: str) -> None:
    client.add(group, "x", key="x", max_attempts=1)

    @client.worker(group, wait_ms=1_000)
    def bad(task: Task, lease: Lease) -> Any:
        return object()

    assert isinstance(bad, Worker)
    with bad:
        job = client.job(group, "x", wait_ms=10_000)
    assert job.state == "dead" and "not JSON" in (job.history[-1].error or "")


def test_a_handler_may_stop_its_own_worker(client: RotaClient, group: str) -> None:
    client.add(group, "last", key="last")
    w = Worker(client, group, wait_ms=1_000, grace_ms=10_000)

    @w
    def handle(task: Task, lease: Lease) -> Any:
        w.stop()  # returns at once: it does not wait for this very handler
        return "stopped myself"

    started = time.monotonic()
    w.start()
    assert w.join(10) and time.monotonic() - started < 5
    assert w.finished == 1
    assert client.job(group, "last").result == "stopped myself"


def test_each_finish_claims_the_next_task_in_the_same_write(client: RotaClient, group: str) -> None:
    for i in range(6):
        client.add(group, str(i), key=f"k{i}")
    claims = claim_waits(client)
    done: List[str] = []
    w = Worker(client, group, lambda task, lease: done.append(task.data), threads=1, wait_ms=200)
    w.start()
    try:
        wait_until(lambda: len(done) == 6, timeout=20, what="all six run")
    finally:
        assert w.stop(timeout=5)
    assert sorted(done) == [str(i) for i in range(6)]
    assert all(client.job(group, f"k{i}").state == "succeeded" for i in range(6))
    # One claim for the first task, the others came with the finishes; then the idle
    # slot's blocking claims (at most a few in this time).
    assert len(claims) < 6, f"{len(claims)} claims for 6 tasks"


def test_a_finish_that_finds_no_next_task_is_followed_by_a_waiting_claim(client: RotaClient, group: str) -> None:
    """The finish of the last task asked for the next one in the same write and found
    none: the slot's next claim waits for one rather than asking again at once."""
    client.add(group, "only", key="only")
    waits = claim_waits(client)
    done: List[str] = []
    w = Worker(client, group, lambda task, lease: done.append(task.data), threads=1, wait_ms=300)
    w.start()
    try:
        wait_until(lambda: len(done) == 1 and len(waits) >= 2, timeout=20, what="the task run and the slot waiting")
    finally:
        assert w.stop(timeout=5)
    assert client.job(group, "only").state == "succeeded"
    assert (w.finished, w.lost) == (1, 0), "the finish itself must have gone through"
    assert 0 not in waits, f"claims' waits in ms: {waits}"


def test_a_late_claim_runs_only_once_its_first_renewal_lands(client: RotaClient, group: str) -> None:
    """A claim answered long after it was sent may have been granted long ago and lapsed:
    its handler starts only once a renewal confirms the lease, and never if the task was
    taken meanwhile."""
    client.add(group, "x", key="x")
    first = client.claim(group, 300)
    assert first is not None
    time.sleep(0.5)
    taken = client.claim(group, 60_000)
    assert taken is not None and taken.key == "x", "the lapsed task, claimed again"
    client.add(group, "y", key="y")
    handed: List[Task] = []

    def late_claim_lease(group_: str, duration_ms: int, **kwargs: Any) -> Any:
        # As if every claim had been retried through an outage longer than its lease;
        # the first one hands back the lapsed version of "x".
        sent = time.monotonic() - duration_ms / 1000.0 - 1
        if not handed:
            handed.append(first)
            return Lease(client, first, duration_ms, claimed_at=sent)
        kwargs["first_sent"] = sent
        return RotaClient.claim_lease(client, group_, duration_ms, **kwargs)

    client.claim_lease = late_claim_lease  # type: ignore[method-assign]
    ran: List[Any] = []
    w = Worker(client, group, lambda task, lease: ran.append((task.key, lease.renewals)), wait_ms=200)
    w.start()
    try:
        wait_until(lambda: ran, timeout=10, what="the handler of y")
    finally:
        assert w.stop(timeout=5)
    assert len(ran) == 1 and ran[0][0] == "y" and ran[0][1] >= 1, ran
    assert w.lost == 1, "x was never worked: its renewal was refused"
    client.finish(taken)


def test_failing_claims_are_logged_once_for_all_slots(caplog: Any) -> None:
    import logging
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    errors: List[BaseException] = []
    client = RotaClient([dead], call_timeout=0.2, give_up_after=0.3)
    w = Worker(client, "nowhere", lambda task, lease: None, threads=3, wait_ms=100, on_error=errors.append)
    with caplog.at_level(logging.WARNING, logger="rota.worker"):
        w.start()
        wait_until(lambda: len(errors) >= 6, timeout=30)
        w.stop()
    failing = [r for r in caplog.records if "failing" in r.getMessage()]
    assert len(failing) == 1, [r.getMessage() for r in caplog.records]
    assert "claims from 'nowhere' failing (1 in a row)" in failing[0].getMessage()
