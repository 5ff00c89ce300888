"""Fencing: a stale worker's write to a sqlite3 sink is refused; a newer one wins."""

from __future__ import annotations

import sqlite3
import time

import pytest

from rota import FencedTable, Lease, RotaClient, StaleFence, fenced_write


@pytest.fixture(params=[False, True], ids=["update-then-insert", "upsert"])
def sink(request: pytest.FixtureRequest) -> FencedTable:
    conn = sqlite3.connect(":memory:")
    table = FencedTable(conn, "outputs", upsert=request.param)
    table.create_table()
    return table


def test_larger_fences_win_and_smaller_ones_are_refused(sink: FencedTable) -> None:
    sink.write("k", "first", 10)
    assert sink.read("k") == ("first", 10)
    sink.write("k", "newer", 12)
    assert sink.read("k") == ("newer", 12)
    with pytest.raises(StaleFence) as stale:
        sink.write("k", "stale", 11)
    assert (stale.value.key, stale.value.fence, stale.value.current) == ("k", 11, 12)
    with pytest.raises(StaleFence):
        sink.write("k", "same fence again", 12)
    assert sink.read("k") == ("newer", 12), "a refused write changed nothing"
    sink.write("other", "independent", 1)
    assert sink.fence_of("other") == 1 and sink.read("none") is None
    with pytest.raises(ValueError):
        sink.write("k", "v", -1)


@pytest.mark.parametrize("upsert", [False, True], ids=["update-then-insert", "upsert"])
def test_allow_equal_lets_a_holder_rewrite_its_own_output(upsert: bool) -> None:
    sink = FencedTable(sqlite3.connect(":memory:"), upsert=upsert, allow_equal=True)
    sink.create_table()
    sink.write("k", "step 1", 7)
    sink.write("k", "step 2", 7)
    sink.write("k", "step 2", 7)  # a retried write, same value
    assert sink.read("k") == ("step 2", 7)
    with pytest.raises(StaleFence):
        sink.write("k", "older holder", 6)
    sink.write("k", "newer holder", 8)
    assert sink.read("k") == ("newer holder", 8)


def test_table_and_column_names_are_checked() -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(ValueError):
        FencedTable(conn, "outputs; DROP TABLE x")
    with pytest.raises(ValueError):
        FencedTable(conn, "t", fence_column="f f")


def test_custom_columns_and_the_one_call_helper(tmp_path) -> None:  # type: ignore[no-untyped-def]
    conn = sqlite3.connect(str(tmp_path / "sink.db"))
    table = FencedTable(conn, "reports", key_column="name", value_column="body", fence_column="task_id")
    table.create_table()
    with conn:
        fenced_write(conn, "reports", "r1", "v1", 5, key_column="name", value_column="body", fence_column="task_id")
    fenced_write(conn, "reports", "r1", "v2", 7, commit=True, key_column="name", value_column="body", fence_column="task_id")
    again = sqlite3.connect(str(tmp_path / "sink.db"))
    assert again.execute("SELECT name, body, task_id FROM reports").fetchall() == [("r1", "v2", 7)]


def test_a_worker_whose_lease_lapsed_cannot_overwrite_the_new_holder(
    client: RotaClient, group: str, sink: FencedTable
) -> None:
    client.add(group, "report", key="report")
    # Worker A claims the job, then stalls (no renewals) past its lease.
    a = client.claim(group, 300)
    assert a is not None
    time.sleep(0.5)
    # Worker B (another client) claims it: a new version with a larger id.
    other = RotaClient(client.urls)
    b_lease = other.claim_lease(group, 10_000)
    assert b_lease is not None and b_lease.task.key == "report"
    assert b_lease.fence > a.id
    sink.write("report", "B's output", b_lease.fence)
    # A wakes up and writes with its own (old) fence: refused, B's output stays.
    with pytest.raises(StaleFence):
        sink.write("report", "A's stale output", a.id)
    assert sink.read("report") == ("B's output", b_lease.fence)
    # The cluster refuses A's finish too; B's goes through.
    with pytest.raises(Exception, match="does not exist"):
        client.finish(a)
    b_lease.finish({"written": True})
    assert client.job(group, "report").state == "succeeded"


def test_a_stale_write_before_the_new_holders_is_overwritten(client: RotaClient, group: str, sink: FencedTable) -> None:
    """The fence orders writers; it does not keep a stale writer that comes first from
    writing: the new holder, with a larger fence, overwrites it."""
    client.add(group, "x", key="x")
    a = client.claim(group, 300)
    assert a is not None
    time.sleep(0.5)
    b = client.claim(group, 10_000)
    assert b is not None and b.id > a.id
    sink.write("x", "A (stale, but first)", a.id)
    sink.write("x", "B", b.id)
    assert sink.read("x") == ("B", b.id)


def test_the_fence_of_a_renewed_lease_refuses_its_own_older_writes(client: RotaClient, group: str) -> None:
    sink = FencedTable(sqlite3.connect(":memory:"))
    sink.create_table()
    client.add(group, "x", key="x")
    lease = client.claim_lease(group, 1500)
    assert lease is not None
    first_fence = lease.fence
    sink.write("x", "step 1", first_fence)
    deadline = time.monotonic() + 5
    while lease.fence == first_fence and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lease.fence > first_fence, "renewed"
    sink.write("x", "step 2", lease.fence)
    with pytest.raises(StaleFence):
        sink.write("x", "a delayed write of step 1", first_fence)
    lease.finish()
    assert isinstance(lease, Lease)
