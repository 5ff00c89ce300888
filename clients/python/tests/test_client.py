"""Every operation of RotaClient against a real cluster, its typed errors, exactly-once
writes under one request id, and leader discovery."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from conftest import Cluster, read_request, wait_until
from rota import (
    Add,
    Backoff,
    Change,
    NotFound,
    Refused,
    Rejected,
    RotaClient,
    Task,
    Unavailable,
)


def dead_address() -> str:
    """An address where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- round trips ------------------------------------------------------------------------


def test_add_claim_renew_finish_round_trip(client: RotaClient, group: str) -> None:
    added = client.add(group, "payload-1")
    assert isinstance(added, Task)
    assert (added.group, added.data, added.ownerid, added.key) == (group, "payload-1", client.client_id, None)
    assert client.task(added.id) == added
    assert client.group(group) == [added]
    assert group in client.groups()

    claimed = client.claim(group, 60_000)
    assert claimed is not None and claimed.id > added.id and claimed.data == "payload-1"
    assert client.group(group) == [], "an owned task is not listed by default"
    assert client.group(group, owned=True) == [claimed]
    with pytest.raises(NotFound):
        client.task(added.id)

    renewed = client.renew(claimed, 60_000)
    assert renewed.id > claimed.id and renewed.data == claimed.data
    assert renewed.timespec >= claimed.timespec
    assert client.tasks([claimed.id, renewed.id]) == [None, renewed]

    client.finish(renewed)
    assert client.group(group, owned=True) == []
    assert client.claim(group, 1000) is None


def test_update_is_one_transaction(client: RotaClient, group: str) -> None:
    a, b, c = client.add_many([Add(group, "a"), Add(group, "b"), {"group": group, "data": "c"}])
    assert [t.data for t in (a, b, c)] == ["a", "b", "c"]
    # Adds, an update, a delete and a dependency at once.
    written = client.update(
        adds=[Add(group, "d")], updates=[Change(a.id, "a2")], deletes=[b], depends=[c]
    )
    assert [t.data for t in written] == ["d", "a2"]
    assert sorted(t.data for t in client.group(group)) == ["a2", "c", "d"]
    # A refused part refuses the whole: nothing changes, every reason is listed.
    with pytest.raises(Refused) as refused:
        client.update(adds=[Add(group, "e")], deletes=[b.id], depends=[987_654_321])
    assert len(refused.value.errors) == 2, refused.value.errors
    assert any("987654321" in e for e in refused.value.errors)
    assert sorted(t.data for t in client.group(group)) == ["a2", "c", "d"]
    assert client.group(group, limit=1)[0].data in ("a2", "c", "d")
    # A task read back may be sent as an update entry.
    (c2,) = client.update(updates=[c])
    assert c2.id > c.id and c2.data == "c"
    client.delete(c2.id)
    assert sorted(t.data for t in client.group(group)) == ["a2", "d"]


def test_release_gives_a_claimed_task_back(client: RotaClient, group: str) -> None:
    client.add(group, "r", key="r")
    claimed = client.claim(group, 60_000)
    assert claimed is not None and claimed.attempt == 1
    released = client.release(claimed)
    assert released.id > claimed.id
    job = client.job(group, "r")
    assert job.state == "waiting" and job.history[-1].outcome == "released"


def test_finish_and_claim_is_one_cycle_in_one_write(client: RotaClient, group: str) -> None:
    client.add(group, "a", key="a")
    client.add(group, "b", key="b")
    a = client.claim(group, 60_000)
    assert a is not None and a.key == "a"
    claimed = client.finish_and_claim(a, {"ok": 1}, group=group, duration_ms=60_000)
    assert [t.key for t in claimed] == ["b"] and claimed[0].ownerid == client.client_id
    assert client.job(group, "a").state == "succeeded"
    assert client.finish_and_claim(claimed[0], group=group) == [], "nothing left to claim"
    assert client.job(group, "b").state == "succeeded"
    client.add(group, "c", key="c")
    with pytest.raises(Refused, match="does not exist"):
        client.finish_and_claim(a, group=group)
    assert client.job(group, "c").state == "waiting", "a refused finish claims nothing"


def test_finish_many_ends_every_claim_or_none(client: RotaClient, group: str) -> None:
    for key in ("a", "b", "c"):
        client.add(group, f"work {key}", key=key)
    claimed = client.claim_many(group, 3, 60_000)
    assert sorted(t.key for t in claimed) == ["a", "b", "c"]
    other = RotaClient(client.urls, client_id=client.client_id + 1000)
    with pytest.raises(Refused, match=f"task {claimed[0].id} "):
        other.finish_many(claimed)
    assert client.job(group, "a").state == "running", "nothing changed"
    client.finish_many([(claimed[0], {"n": 0}), claimed[1], (claimed[2].id, "two")])
    assert client.job(group, "a").result == {"n": 0}
    assert client.job(group, "b").state == "succeeded"
    assert client.job(group, "c").result == "two"
    with pytest.raises(Rejected, match="name from 1 to 1000"):
        client.finish_many([])


def test_jobs_finish_fail_cancel_retry_and_records(client: RotaClient, group: str) -> None:
    fetch = client.add(group, "git clone", key="fetch", priority=5)
    build = client.add(group, "make", key="build", after=["fetch"], max_attempts=1)
    assert (fetch.key, fetch.priority, build.key) == ("fetch", 5, "build")
    # keep answers the live task; refuse (the default) is a refusal.
    assert client.add(group, "other", key="fetch", on_conflict="keep") == fetch
    with pytest.raises(Refused, match="fetch"):
        client.add(group, "other", key="fetch")

    job = client.job(group, "build")
    assert (job.state, job.after, job.max_attempts, job.data) == ("waiting", ["fetch"], 1, "make")
    assert client.job(group, "fetch").dependants == ["build"]

    claimed = client.claim(group, 60_000)
    assert claimed is not None and claimed.key == "fetch", "build waits for fetch"
    assert client.claim(group, 60_000) is None
    client.finish(claimed, {"commit": "abc"})
    fetched = client.job(group, "fetch")
    assert (fetched.state, fetched.result, fetched.finished) == ("succeeded", {"commit": "abc"}, True)
    assert fetched.history[-1].outcome == "succeeded"
    # The id its add answered reads the outcome too; the finished version's does not.
    assert fetched.id == fetch.id and client.job_by_id(fetch.id) == fetched
    with pytest.raises(NotFound, match="by group and key"):
        client.job_by_id(claimed.id)

    claimed = client.claim(group, 60_000)
    assert claimed is not None and claimed.key == "build"
    assert client.fail(claimed, "3 tests failed") is None, "its only attempt: dead"
    dead = client.job(group, "build")
    assert dead.state == "dead" and "3 tests failed" in (dead.reason or "")
    assert dead.history[-1].error == "3 tests failed"
    assert [j.key for j in client.dead(group).jobs] == ["build"]

    (retried,) = client.retry(group, ["build"])
    assert retried.key == "build" and client.job(group, "build").state == "waiting"
    with pytest.raises(Refused, match="only dead jobs"):
        client.retry(group, ["build"])

    claimed = client.claim(group, 60_000)
    assert claimed is not None and claimed.attempt == 2, "the numbering goes on"
    assert client.fail(claimed, "again") is None, "its budget (one attempt) again, used up"
    assert client.job(group, "build").state == "dead"

    # A fail with attempts left answers the retry's version, due after retry_in_ms.
    client.add(group, "flaky", key="flaky")
    claimed = client.claim(group, 60_000)
    assert claimed is not None and claimed.key == "flaky"
    again = client.fail(claimed, "try later", retry_in_ms=60_000)
    assert again is not None and again.key == "flaky" and again.id > claimed.id
    assert client.job(group, "flaky").state == "failed"
    assert client.claim(group, 60_000) is None, "not due for a minute"
    client.cancel(group, ["flaky"])

    client.cancel(group, ["build"])
    cancelled = client.job(group, "build")
    assert cancelled.state == "cancelled" and cancelled.reason == f"cancelled by client {client.client_id}"
    with pytest.raises(Refused, match="succeeded"):
        client.cancel(group, ["fetch"])

    page = client.jobs(group, limit=1)
    assert [j.key for j in page.jobs] == ["build"] and page.next == "build"
    page2 = client.jobs(group, after=page.next)
    assert [j.key for j in page2.jobs] == ["fetch", "flaky"] and page2.next is None
    assert [j.key for j in client.iter_jobs(group, page_size=1)] == ["build", "fetch", "flaky"]
    assert [j.key for j in client.jobs(group, state="succeeded").jobs] == ["fetch"]

    waited = client.wait_jobs(group, ["fetch", "build", "never"], wait_ms=100)
    assert waited.finished is False and waited.missing == ["never"]
    assert [j.key for j in waited.jobs] == ["fetch", "build"]
    assert client.wait_jobs(group, ["fetch", "build"]).finished is True

    # More keys than a URL holds: the client sends them in a body (POST /jobs/wait).
    many = ["fetch"] + [f"{n:04}" + "é" * 126 for n in range(999)]
    waited = client.wait_jobs(group, many, wait_ms=100)
    assert waited.finished is False and [j.key for j in waited.jobs] == ["fetch"]
    assert waited.missing == many[1:]


def test_blocking_claim_and_waits(client: RotaClient, group: str) -> None:
    # Nothing to claim: the claim waits, then answers None at the deadline.
    started = time.monotonic()
    assert client.claim(group, 5_000, wait_ms=400) is None
    assert time.monotonic() - started >= 0.35

    # A task added while a claim waits is claimed by it.
    box = {}

    def claim() -> None:
        box["task"] = client.claim(group, 60_000, wait_ms=10_000)

    waiter = threading.Thread(target=claim)
    waiter.start()
    time.sleep(0.3)
    added = client.add(group, "wake", key="w")
    waiter.join(15)
    task = box["task"]
    assert task is not None and task.key == "w" and task.id > added.id

    # A job wait answers once the job finishes.
    def finish_later() -> None:
        time.sleep(0.3)
        client.finish(task, "done")

    threading.Thread(target=finish_later).start()
    started = time.monotonic()
    job = client.job(group, "w", wait_ms=10_000)
    assert job.state == "succeeded" and job.result == "done"
    assert time.monotonic() - started < 8


def test_claim_many_takes_up_to_count_each_with_its_own_fence(client: RotaClient, group: str) -> None:
    added = [client.add(group, f"t{i}") for i in range(5)]
    claimed = client.claim_many(group, 3, 60_000)
    assert [t.data for t in claimed] == ["t0", "t1", "t2"]
    assert len({t.id for t in claimed}) == 3 and all(t.id > added[-1].id for t in claimed)
    for task in claimed:
        client.delete(task)
    rest = client.claim_many(group, 10, 60_000)
    assert [t.data for t in rest] == ["t3", "t4"]
    assert client.claim_many(group, 10, 60_000, wait_ms=200) == []
    with pytest.raises(ValueError):
        client.claim_many(group, 0)


def test_settings_and_watch(client: RotaClient, group: str) -> None:
    defaults = client.settings(group)
    assert defaults.max_running == 0 and defaults.paused is False
    changed = client.change_settings(
        group, max_running=1, max_attempts=3, backoff=Backoff(500, 2.0, 10_000), retention_ms=60_000
    )
    assert (changed.max_running, changed.max_attempts, changed.retention_ms) == (1, 3, 60_000)
    assert changed.backoff == Backoff(500, 2.0, 10_000)
    paused = client.change_settings(group, paused=True)
    assert paused.paused and paused.max_running == 1, "unnamed settings keep their value"
    client.add(group, "x")
    assert client.claim(group, 1000) is None, "a paused group answers no task"
    client.change_settings(group, paused=False)
    claimed = client.claim(group, 60_000)
    assert claimed is not None
    assert client.settings(group).running == 1
    with pytest.raises(Rejected):
        client.change_settings(group, max_running=-1)

    page = client.watch(group, after=0)
    kinds = [c.kind for c in page.changes]
    assert "settings" in kinds and "task" in kinds and "removed" in kinds
    assert page.group == group and page.revision >= max(c.revision for c in page.changes)
    # Nothing new: a short wait answers empty, from the revision given.
    later = client.watch(group, after=page.revision, wait_ms=200)
    assert later.changes == [] and later.revision >= page.revision
    client.finish(claimed)
    after_finish = client.watch(group, after=page.revision, wait_ms=5_000)
    assert any(c.kind == "removed" and c.id == claimed.id for c in after_finish.changes)


def test_cluster_status(client: RotaClient, cluster: Cluster) -> None:
    status = client.cluster()
    assert status["leader"] in status["voters"] and len(status["nodes"]) == 3


# -- typed errors -------------------------------------------------------------------------


def test_errors_are_typed(client: RotaClient, group: str) -> None:
    with pytest.raises(Refused) as refused:
        client.finish(123_456_789_012)
    assert refused.value.errors == ["finish: task 123456789012 does not exist"]

    with pytest.raises(Rejected) as rejected:
        client.claim(group, 0)
    assert rejected.value.status == 400 and "duration" in rejected.value.message

    with pytest.raises(Rejected):
        client.add(group, "x", key="")  # a key is 1 to 256 bytes
    with pytest.raises(Rejected):
        client.write("/update", {"clientid": client.client_id, "bogus": 1})

    with pytest.raises(NotFound):
        client.job(group, "no-such-job")
    with pytest.raises(NotFound):
        client.task(987_654_321_000)

    # Owned by another client: refused with the owner named.
    claimed = (client.add(group, "mine"), client.claim(group, 60_000))[1]
    assert claimed is not None
    other = RotaClient(client.urls, client_id=client.client_id + 1)
    with pytest.raises(Refused, match="not held by this client|owned"):
        other.finish(claimed)
    client.finish(claimed)


def test_a_body_far_over_the_limit_is_refused_at_once(client: RotaClient, group: str) -> None:
    """A node reads at most 8 MiB past its 1 MiB body limit, answers 413 and closes: the
    client's send breaks, and it reads the 413 rather than retrying every node."""
    retries = client.retries
    for mib in (2, 16):
        with pytest.raises(Rejected) as refused:
            client.add(group, "x" * (mib << 20))
        assert refused.value.status == 413, refused.value
    assert client.retries == retries


def test_tasks_reads_ids_past_a_urls_length_in_several_requests(client: RotaClient, group: str) -> None:
    added = client.add(group, "kept")
    far = list(range(10**12, 10**12 + 9_999))  # 13 digits each: about 140 KiB of path
    found = client.tasks(far[:5_000] + [added.id] + far[5_000:])
    assert len(found) == 10_000 and found[5_000] == added
    assert found.count(None) == 9_999
    with pytest.raises(ValueError, match="at most 10000"):
        client.tasks(range(10_001))


def test_gives_up_with_the_last_error_when_no_node_answers() -> None:
    lonely = RotaClient([dead_address(), dead_address()], call_timeout=0.5, give_up_after=0.6)
    started = time.monotonic()
    with pytest.raises(Unavailable) as gave_up:
        lonely.add("g", "x", request_id="my-write-1")
    assert gave_up.value.request_id == "my-write-1"
    assert "connect" in gave_up.value.last_error
    assert time.monotonic() - started < 5
    with pytest.raises(Unavailable) as read_gave_up:
        lonely.groups()
    assert read_gave_up.value.request_id is None


def test_client_arguments() -> None:
    with pytest.raises(ValueError):
        RotaClient([])
    with pytest.raises(ValueError):
        RotaClient("127.0.0.1:1", client_id=2**63)
    c = RotaClient("http://127.0.0.1:1/, 127.0.0.1:2 ,127.0.0.1:1", client_id=3)
    assert c.urls == ["127.0.0.1:1", "127.0.0.1:2"]
    a, b = c.next_request_id(), c.next_request_id()
    assert a != b and a.startswith("c3-") and len(a) <= 64
    assert RotaClient("h:1").client_id != RotaClient("h:1").client_id


# -- exactly once -------------------------------------------------------------------------


def test_a_write_sent_twice_under_one_request_id_applies_once(client: RotaClient, group: str) -> None:
    body = {"clientid": client.client_id, "adds": [{"group": group, "data": "once"}]}
    first = client.write("/update", body, request_id="add-once")
    second = client.write("/update", body, request_id="add-once")
    assert first == second and len(first) == 1
    assert [t.id for t in client.group(group)] == [first[0].id], "one task, not two"

    # The same for a claim: the retry gets the first claim's task, no second claim.
    client.add(group, "other")
    claim = {"clientid": client.client_id, "group": group, "duration": 60_000}
    c1 = client.write("/claim", claim, request_id="claim-once")
    c2 = client.write("/claim", claim, request_id="claim-once")
    assert c1 == c2 and len(c1) == 1
    assert len(client.group(group)) == 1, "the other task is still unclaimed"

    # And for a finish: the retry answers the first outcome (success), not a refusal.
    client.finish(c1[0], "r", request_id="finish-once")
    client.finish(c1[0], "r", request_id="finish-once")
    with pytest.raises(Refused):
        client.finish(c1[0], "r")  # a new request id: the task is gone

    # The same request id from another client id is another write.
    other = RotaClient(client.urls, client_id=client.client_id + 7)
    third = other.write("/update", {"clientid": other.client_id, "adds": [{"group": group, "data": "once"}]}, request_id="add-once")
    assert third[0].id != first[0].id


def test_a_write_retried_after_a_lost_answer_applies_once(cluster: Cluster, group: str) -> None:
    """The first node takes the write and dies before answering (simulated: it answers
    slower than the client waits); the client goes on to the next node with the same
    request id and gets the first outcome."""
    slow = _SlowProxy(cluster.leader_url())
    try:
        c = RotaClient([slow.url] + cluster.urls, call_timeout=0.5)
        c.find_leader = lambda: None  # type: ignore[method-assign]
        c._discover_needed = False
        task = c.add(group, "through-the-slow-node", key="once")
        wait_until(lambda: slow.forwarded == 1, timeout=10, what="the write reached the cluster through the slow node")
        assert c.retries >= 1
        assert [t.id for t in c.group(group)] == [task.id]
        job = c.job(group, "once")
        assert job.run == 1 and job.task == task.id
    finally:
        slow.close()


class _SlowProxy:
    """Forwards one request to the node, then holds the answer back for 2 s."""

    def __init__(self, target: str) -> None:
        host, port = target.replace("http://", "").split(":")
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.forwarded = 0
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            request = read_request(conn)
            if request is None:
                return
            head, body, _ = request
            with socket.create_connection(self.target) as upstream:
                upstream.sendall(head.replace(b"Connection: keep-alive", b"") + b"\r\nConnection: close\r\n\r\n" + body)
                answer = b""
                while True:
                    chunk = upstream.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            self.forwarded += 1
            time.sleep(2)  # the client gives up on this node first
            try:
                conn.sendall(answer)
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()


# -- leader discovery ---------------------------------------------------------------------


def test_a_follower_first_is_left_for_the_leader(cluster: Cluster, group: str) -> None:
    follower = cluster.follower_urls()[0]
    leader = cluster.leader_url()
    c = RotaClient([follower] + [u for u in cluster.urls if u != follower])
    assert c.preferred == follower.replace("http://", "")
    c.add(group, "x")
    assert c.preferred == leader.replace("http://", ""), "writes go to the leader"
    assert c.find_leader() == leader.replace("http://", "")


def test_only_a_follower_works_through_its_relay(cluster: Cluster, group: str) -> None:
    follower = cluster.follower_urls()[0]
    c = RotaClient([follower])
    c._discover_needed = False  # never asks who leads: every call goes through the relay
    task = c.add(group, "relayed", key="k")
    claimed = c.claim(group, 60_000)
    assert claimed is not None and claimed.key == "k" and claimed.id > task.id
    c.finish(claimed, 1)
    assert c.job(group, "k").result == 1
    assert c.known_urls == [follower.replace("http://", "")]
    assert c.preferred == follower.replace("http://", "")


def test_a_client_given_one_node_learns_the_others_and_outlives_it(cluster: Cluster, group: str) -> None:
    follower = cluster.follower_urls()[0]
    c = RotaClient([follower], give_up_after=30)
    c.add(group, "first")
    everyone = sorted(u.replace("http://", "") for u in cluster.urls)
    assert sorted(c.known_urls) == everyone
    assert c.urls == [follower.replace("http://", "")]
    assert c.preferred == cluster.leader_url().replace("http://", ""), "writes go to the leader"
    victim = next(n["id"] for n in cluster.status(follower)["nodes"] if n["api_addr"] == follower.replace("http://", ""))
    cluster.kill(victim)
    try:
        c.add(group, "second")
        assert sorted(t.data for t in c.group(group)) == ["first", "second"]
    finally:
        cluster.up()


def test_one_dead_address_is_skipped(cluster: Cluster, group: str) -> None:
    c = RotaClient([dead_address()] + cluster.urls)
    c.add(group, "x")
    assert c.preferred == cluster.leader_url().replace("http://", "")
    # Without a look at /cluster first, the dead node is tried and skipped.
    blind = RotaClient([dead_address(), cluster.follower_urls()[0]])
    blind._discover_needed = False
    t = blind.add(group, "y")
    assert t.data == "y" and blind.preferred == cluster.follower_urls()[0].replace("http://", "")
    assert sorted(x.data for x in c.group(group)) == ["x", "y"]


def test_one_client_many_threads(client: RotaClient, group: str) -> None:
    errors = []
    ids = []
    lock = threading.Lock()

    def work(n: int) -> None:
        try:
            for i in range(20):
                t = client.add(group, f"{n}-{i}")
                with lock:
                    ids.append(t.id)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(ids)) == 160
    assert len(client.group(group)) == 160
