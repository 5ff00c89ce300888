"""Leases: renewal in the background, the fence that changes with it, and losses."""

from __future__ import annotations

import time

import pytest

from rota import Lease, LeaseLost, Refused, RotaClient


def test_work_longer_than_the_lease_keeps_its_task(client: RotaClient, group: str) -> None:
    client.add(group, "long", key="long")
    lease = client.claim_lease(group, duration_ms=2400)
    assert lease is not None
    fences = [lease.fence]
    deadline = time.monotonic() + 6.0  # two and a half lease lengths
    while time.monotonic() < deadline:
        if lease.fence != fences[-1]:
            fences.append(lease.fence)
        assert not lease.lost, lease.lost_reason
        time.sleep(0.02)
    # Renewed about every 800 ms: 7 times, fewer if the cluster is slow to answer.
    assert lease.renewals >= 4, f"{lease.renewals} renewals; fences {fences}"
    assert len(fences) >= 5 and fences == sorted(fences), f"every renewal a new, larger fence: {fences}"
    # Another worker finds nothing to claim all along: the task stayed ours.
    assert client.claim(group, 1000) is None
    assert client.task(lease.fence).ownerid == client.client_id
    lease.finish({"fences": len(fences)})
    job = client.job(group, "long")
    assert job.state == "succeeded" and job.attempts == 1, "one attempt: the lease never lapsed"
    assert [a.outcome for a in job.history] == ["succeeded"]
    with pytest.raises(LeaseLost) as again:
        lease.finish()
    assert again.value.reason == "ended"


def test_a_cancelled_task_loses_its_lease_on_the_next_renewal(client: RotaClient, group: str) -> None:
    client.add(group, "halt me", key="halt")
    lease = client.claim_lease(group, duration_ms=900)
    assert lease is not None
    client.cancel(group, ["halt"])
    assert lease.wait_lost(5), "the renewal after the cancel is refused"
    assert lease.lost and lease.lost_reason is not None
    assert lease.lost_reason.reason == "refused"
    assert any("cancelled" in e for e in lease.lost_reason.errors), lease.lost_reason.errors
    with pytest.raises(LeaseLost):
        lease.check()
    with pytest.raises(LeaseLost) as lost:
        lease.finish("too late")
    assert isinstance(lost.value, Refused), "a lost lease is a refusal"
    assert client.job(group, "halt").state == "cancelled"


def test_a_lapsed_lease_taken_over_is_lost(client: RotaClient, group: str) -> None:
    """A holder that stops renewing (a paused process) lapses; another claims the task;
    the first holder's renewal is then refused."""
    client.add(group, "x", key="x")
    first = client.claim(group, 300)
    assert first is not None
    time.sleep(0.5)
    second = client.claim(group, 60_000)
    assert second is not None and second.key == "x" and second.id > first.id
    # The first holder wakes up and holds its (old) task in a lease: the renewal fails.
    stale = Lease(client, first, 900, claimed_at=time.monotonic() - 10)
    assert stale.wait_lost(5)
    assert stale.lost_reason is not None and stale.lost_reason.reason == "refused"
    assert not stale.wait_confirmed(0), "a late claim is confirmed by its first renewal only"
    client.finish(second)
    job = client.job(group, "x")
    assert [a.outcome for a in job.history] == ["lost", "succeeded"]


def test_a_late_claim_is_confirmed_by_its_first_renewal(client: RotaClient, group: str) -> None:
    client.add(group, "prompt", key="prompt")
    client.add(group, "late", key="late")
    prompt = client.claim_lease(group, duration_ms=10_000)
    assert prompt is not None
    assert prompt.wait_confirmed(0) and prompt.renewals == 0, "answered in good time: held at once"
    prompt.finish()
    # As if the claim had been retried through an outage for ten seconds.
    task = client.claim(group, 3000)
    assert task is not None
    late = Lease(client, task, 3000, claimed_at=time.monotonic() - 10)
    assert late.wait_confirmed(5), late.lost_reason
    assert late.renewals >= 1 and late.fence > task.id
    late.finish()
    assert client.job(group, "late").state == "succeeded"


def test_a_lease_as_a_context_manager(client: RotaClient, group: str) -> None:
    client.add(group, "ok", key="ok")
    client.add(group, "bad", key="bad", max_attempts=1)
    for _ in range(2):
        lease = client.claim_lease(group, 10_000)
        assert lease is not None
        if lease.task.key == "ok":
            with lease:
                pass  # a normal exit finishes
        else:
            with pytest.raises(ValueError):
                with lease:
                    raise ValueError("no such mailbox")
        assert lease.ended
    assert client.job(group, "ok").state == "succeeded"
    bad = client.job(group, "bad")
    assert bad.state == "dead" and bad.history[-1].error == "ValueError: no such mailbox"


def test_release_and_fail_through_the_lease(client: RotaClient, group: str) -> None:
    client.add(group, "r", key="r")
    lease = client.claim_lease(group, 10_000)
    assert lease is not None
    back = lease.release()
    assert back.key == "r" and client.job(group, "r").state == "waiting"
    lease = client.claim_lease(group, 10_000)
    assert lease is not None
    retry = lease.fail("busy", retry_in_ms=0)
    assert retry is not None and retry.key == "r"
    job = client.job(group, "r")
    assert [a.outcome for a in job.history] == ["released", "failed"]
