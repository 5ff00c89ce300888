"""The load driver of scripts/compare-peers: one work pattern against Rota, Postgres and
a RabbitMQ quorum queue, already started by that script (their addresses in the JSON
file given with --systems-file).

Each run: a fresh queue (a Rota group, a Postgres table, a quorum queue) preloaded with
--tasks tasks; W worker processes (processes, so that the GIL does not cap the clients),
each with its own connection, loop "claim one task, complete it" from a common start
time, through a warm-up, for --seconds. A cycle counts when its complete returns inside
the measured window; its claim's and complete's latencies are the samples. After the
run the tasks left are counted (preloaded less every completed cycle, warm-up and the
last cycle past the window included, must be left) and removed.

The systems alternate: each round runs every worker count on every system, the systems
in the given order on odd rounds and reversed on even ones. Every wait is bounded; a
worker that does not report in time is killed and its run marked failed.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import multiprocessing as mp
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

# Bounds on every wait (seconds).
CONNECT_TIMEOUT = 60.0  # all workers connected and ready
RESULT_GRACE = 30.0  # after the window ends, for the workers' results
PRELOAD_TIMEOUT = 300.0  # one preload
CTL_TIMEOUT = 60.0  # one rabbitmqctl call
WORKER_ERRORS_MAX = 50  # a worker that failed this often stops
CLOSE_DELAY = 1.0  # workers close their connections this long after the window's end

SYSTEM_ORDER = ("rota", "postgres", "rabbitmq")
PR_SET_PDEATHSIG = 1  # prctl option: a signal for this process when its parent dies
STOPPING = False  # set by a TERM or INT: the run is abandoned, the workers stopped at once
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- process CPU, from /proc ---------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    ppid: int
    cpu: float  # user + system seconds
    reaped: float  # user + system seconds of the children it reaped (cutime, cstime)


def process_table() -> Dict[int, Proc]:
    table: Dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command: state, ppid, ..., utime (14th field), stime, cutime, cstime.
        ticks = [int(x) for x in fields[11:15]]
        table[int(name)] = Proc(int(fields[1]), (ticks[0] + ticks[1]) / CLK_TCK, (ticks[2] + ticks[3]) / CLK_TCK)
    return table


@dataclass
class CpuSnapshot:
    groups: Dict[str, float]  # CPU seconds of each named group of process trees
    # Every other user-space process, each with the children it reaped: one that ends
    # moves its CPU into its parent's count rather than out of the sum.
    background: float
    # CPU seconds the hypervisor gave to others while this machine's CPUs had work
    # (/proc/stat's steal time; 0 where it is not reported).
    steal: float


def steal_seconds() -> float:
    """The machine's steal time so far, in CPU seconds over all its CPUs."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        # cpu user nice system idle iowait irq softirq steal ...
        return int(fields[8]) / CLK_TCK if fields[0] == "cpu" and len(fields) > 8 else 0.0
    except (OSError, ValueError):
        return 0.0


def cpu_snapshot(roots: Dict[str, List[int]]) -> CpuSnapshot:
    """The CPU used so far by the process trees under each group's ``roots``, and by
    every other process (kernel threads aside)."""
    table = process_table()
    kids: Dict[int, List[int]] = {}
    for pid, proc in table.items():
        kids.setdefault(proc.ppid, []).append(pid)
    groups: Dict[str, float] = {}
    claimed = set()
    for name, pids in roots.items():
        total, stack = 0.0, list(pids)
        while stack:
            pid = stack.pop()
            if pid in claimed or pid not in table:
                continue
            claimed.add(pid)
            # With reaped children: a Postgres backend's CPU moves to the postmaster.
            total += table[pid].cpu + table[pid].reaped
            stack.extend(kids.get(pid, []))
        groups[name] = total
    # Kernel threads (kthreadd, pid 2, and its children) do the I/O and network work the
    # benchmark itself causes: not counted as other work.
    background = sum(proc.cpu + proc.reaped for pid, proc in table.items()
                     if pid not in claimed and pid != 2 and proc.ppid != 2)
    return CpuSnapshot(groups, background, steal_seconds())


def read_pid(path: str, first_line: bool = True) -> Optional[int]:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    text = text.splitlines()[0] if first_line and text else text
    try:
        return int(text.strip())
    except ValueError:
        return None


def run(cmd: List[str], timeout: float = CTL_TIMEOUT) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


# --- the systems ------------------------------------------------------------------------


class Ops:
    """One worker's connection: ``claim()`` answers a task handle or None (empty queue);
    ``complete(handle)`` ends it."""

    def claim(self) -> Any:
        raise NotImplementedError

    def complete(self, task: Any) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """The loop ended: give back anything claimed ahead of a claim()."""

    def close(self) -> None:
        pass


class Rota:
    name = "rota"

    def __init__(self, cfg: Dict[str, Any], repo: str) -> None:
        from rota import RotaClient

        self.cfg = cfg
        self.repo = repo
        self.urls: List[str] = cfg["urls"]
        self.admin = RotaClient(self.urls, call_timeout=10.0, give_up_after=30.0)

    def describe(self) -> List[str]:
        bin_dir = Path(self.cfg["bin_dir"])
        version = run([str(bin_dir / "rota"), "--version"])
        built = time.strftime("%Y-%m-%d %H:%M", time.localtime((bin_dir / "rota-node").stat().st_mtime))
        try:
            head = run(["git", "-C", self.repo, "rev-parse", "--short", "HEAD"])
            dirty = run(["git", "-C", self.repo, "status", "--porcelain", "--untracked-files=no"])
            head += " (uncommitted changes)" if dirty else ""
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            head = "unknown"
        cluster = self.admin.cluster()
        return [
            f"{version}, rota-node built {built} in {bin_dir}; checkout {head}",
            f"3 nodes (rota dev up --sync always): every node fsyncs its Raft log before it "
            f"acknowledges; a write commits once a majority has it on disk; leader node {cluster.get('leader')}",
            ("claim: RotaClient.claim(group, duration_ms=60000) = POST /claim (seed API, no wait);"
             " complete: RotaClient.delete(task) = POST /update {deletes: [id]}; both go to the leader")
            if self.cfg.get("mode", "delete") == "delete" else
            ("complete: RotaClient.finish_and_claim(task, group=...) = POST /finish with next: the finish"
             " and the claim of the next task in one write (one commit); claim: the task that brought"
             " (a request only when it brought none), so the claim latency is near 0 and the cycle is one request"),
            "client: clients/python (HTTP/1.1 on plain sockets, keep-alive), one RotaClient per worker process",
        ]

    def pids(self) -> List[int]:
        pids = [read_pid(f"{self.cfg['dir']}/node-{i}.pid") for i in (1, 2, 3)]
        return [p for p in pids if p]

    def prepare(self, run_id: str, tasks: int) -> Dict[str, Any]:
        from rota import Add

        group = f"cmp-{run_id}"
        batch = 5000  # an update holds at most 10 000 items and 1 MiB
        for start in range(0, tasks, batch):
            adds = [Add(group, data=f"task-{i}") for i in range(start, min(tasks, start + batch))]
            self.admin.add_many(adds)
        return {"group": group, "note": f"leader {self.admin.find_leader()}"}

    def open(self, target: Dict[str, Any], index: int) -> Ops:
        from rota import RotaClient

        client = RotaClient(self.urls, call_timeout=5.0, give_up_after=10.0)
        group = target["group"]

        combined = self.cfg.get("mode", "delete") == "next"

        class RotaOps(Ops):
            def __init__(self) -> None:
                self.carried: List[Any] = []

            def claim(self) -> Any:
                if self.carried:
                    return self.carried.pop()
                return client.claim(group, duration_ms=60_000)

            def complete(self, task: Any) -> None:
                if combined:
                    self.carried = client.finish_and_claim(task, group=group, duration_ms=60_000)
                else:
                    client.delete(task)

            def stop(self) -> None:
                for task in self.carried:
                    client.release(task)
                self.carried = []

            def close(self) -> None:
                client.close()

        return RotaOps()

    def _stats(self, group: str) -> Dict[str, Any]:
        leader = self.admin.find_leader() or self.urls[0]
        url = leader if leader.startswith("http") else f"http://{leader}"
        with urllib.request.urlopen(f"{url}/groups/{group}/stats", timeout=10) as answer:
            stats: Dict[str, Any] = json.load(answer)
        return stats

    def finish(self, target: Dict[str, Any]) -> Tuple[int, int]:
        """(tasks left claimable, tasks left claimed), then removes them."""
        group = target["group"]
        stats = self._stats(group)
        left = (int(stats["available"]), int(stats["owned"]))
        # Removed, so that later runs do not carry (and snapshot) this run's leftovers.
        while True:
            tasks = self.admin.group(group, limit=5000, owned=True)
            if not tasks:
                break
            self.admin.update(deletes=[t.id for t in tasks])
        return left


class Postgres:
    name = "postgres"

    def __init__(self, cfg: Dict[str, Any], repo: str) -> None:
        import psycopg

        self.cfg = cfg
        self.dsn = cfg["dsn"]
        self.admin = psycopg.connect(self.dsn, autocommit=True)

    def describe(self) -> List[str]:
        import psycopg

        row = self.admin.execute("SELECT version()").fetchone()
        show = {}
        for name in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes",
                     "shared_buffers", "max_wal_size", "checkpoint_timeout"):
            show[name] = self.admin.execute(f"SHOW {name}").fetchone()[0]
        return [
            f"{row[0]}",
            "1 server, no replica: " + ", ".join(f"{k}={v}" for k, v in show.items())
            + " (initdb defaults; only listen address and port set)",
            "claim: UPDATE t SET state='claimed', owner=$1, claimed_at=now() WHERE id = (SELECT id FROM t"
            " WHERE state='ready' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id;"
            + (" complete: DELETE FROM t WHERE id=$1 AND owner=$2; each its own transaction (autocommit, one fsync each)"
             if self.cfg.get("mode", "separate") == "separate" else
             " complete: one transaction (one commit, one fsync) of DELETE FROM t WHERE id=$1 AND owner=$2 and the"
             " claim of the next task; claim: the task that brought (a transaction only when it brought none)"),
            f"client: psycopg {psycopg.__version__} (libpq, binary), TCP to 127.0.0.1, one connection per worker process;"
            " table with a partial index on id WHERE state='ready'",
        ]

    def pids(self) -> List[int]:
        pid = read_pid(f"{self.cfg['data']}/postmaster.pid")
        return [pid] if pid else []

    def prepare(self, run_id: str, tasks: int) -> Dict[str, Any]:
        table = f"tasks_{run_id.replace('-', '_')}"
        a = self.admin
        a.execute(f"DROP TABLE IF EXISTS {table}")
        a.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'ready',"
            " payload text NOT NULL, owner bigint, claimed_at timestamptz)"
        )
        a.execute(f"CREATE INDEX {table}_ready ON {table} (id) WHERE state = 'ready'")
        a.execute(f"INSERT INTO {table} (payload) SELECT 'task-' || i FROM generate_series(1, %s) AS i", (tasks,))
        # Fresh statistics and visibility map, as a table in steady use would have.
        a.execute(f"VACUUM ANALYZE {table}")
        return {"table": table}

    def open(self, target: Dict[str, Any], index: int) -> Ops:
        import psycopg

        conn = psycopg.connect(self.dsn, autocommit=True, options="-c statement_timeout=10000")
        table, owner = target["table"], index + 1
        claim_sql = (
            f"UPDATE {table} SET state = 'claimed', owner = %s, claimed_at = now() WHERE id = ("
            f"SELECT id FROM {table} WHERE state = 'ready' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)"
            " RETURNING id"
        )
        complete_sql = f"DELETE FROM {table} WHERE id = %s AND owner = %s"
        release_sql = f"UPDATE {table} SET state = 'ready', owner = NULL WHERE id = %s AND owner = %s"
        # Like for like with Rota's --rota-mode next: the complete and the next claim in one
        # commit.
        combined = self.cfg.get("mode", "separate") == "combined"

        class PostgresOps(Ops):
            def __init__(self) -> None:
                self.carried: Optional[Any] = None

            def claim(self) -> Any:
                if self.carried is not None:
                    task, self.carried = self.carried, None
                    return task
                row = conn.execute(claim_sql, (owner,)).fetchone()
                return None if row is None else row[0]

            def complete(self, task: Any) -> None:
                if not combined:
                    if conn.execute(complete_sql, (task, owner)).rowcount != 1:
                        raise RuntimeError(f"task {task} was not ours to delete")
                    return
                with conn.transaction():
                    if conn.execute(complete_sql, (task, owner)).rowcount != 1:
                        raise RuntimeError(f"task {task} was not ours to delete")
                    row = conn.execute(claim_sql, (owner,)).fetchone()
                self.carried = None if row is None else row[0]

            def stop(self) -> None:
                if self.carried is not None:
                    conn.execute(release_sql, (self.carried, owner))
                    self.carried = None

            def close(self) -> None:
                conn.close()

        return PostgresOps()

    def finish(self, target: Dict[str, Any]) -> Tuple[int, int]:
        table = target["table"]
        rows = dict(self.admin.execute(f"SELECT state, count(*) FROM {table} GROUP BY state").fetchall())
        self.admin.execute(f"DROP TABLE {table}")
        return int(rows.get("ready", 0)), int(rows.get("claimed", 0))


class RabbitMQ:
    name = "rabbitmq"

    def __init__(self, cfg: Dict[str, Any], repo: str) -> None:
        self.cfg = cfg
        self.ctl: str = cfg["ctl"]
        self.nodes: List[str] = cfg["nodes"]
        self.urls: List[str] = cfg["urls"]
        self.mode: str = cfg.get("mode", "get")

    def _ctl(self, *args: str) -> str:
        return run([self.ctl, "-q", "-n", self.nodes[0], *args])

    def describe(self) -> List[str]:
        import pika

        version = self._ctl("version")
        otp = self._ctl("eval", "erlang:system_info(otp_release).").strip('"')
        sync = self._ctl("eval", "maps:get(wal_sync_method, ra_system:fetch(quorum_queues)).")
        return [
            f"RabbitMQ {version} on Erlang/OTP {otp}; nodes {', '.join(self.nodes)}",
            f"3 nodes clustered, one quorum queue with a member on each (x-quorum-initial-group-size=3);"
            f" Raft (Ra) WAL sync method {sync} (the default: fdatasync before a write counts as written);"
            " schedulers without busy-wait (+sbwt none)",
            ("claim: basic.get with manual ack (a dequeue committed through the queue's Raft log);"
             " complete: basic.ack (no reply in AMQP 0-9-1: the next basic.get on the channel follows it in"
             " the log)" if self.mode == "get" else
             "claim: the next delivery to a consumer with prefetch 1 and manual ack (the broker sends it"
             " once the previous ack is settled); complete: basic.ack (no reply in AMQP 0-9-1)")
            + f" [--rabbit-mode {self.mode}]; preload published with publisher confirms",
            f"client: pika {pika.__version__} (BlockingConnection), one connection per worker process to the"
            " node that leads the queue; preload with aio-pika",
        ]

    def pids(self) -> List[int]:
        pids = [read_pid(f) for f in self.cfg["pid_files"]]
        return [p for p in pids if p]

    def _leader(self, queue: str) -> Tuple[str, List[str]]:
        """The node that leads ``queue`` and its members, checked: a quorum queue on all
        three nodes."""
        text = self._ctl("list_queues", "name", "type", "leader", "members", "--formatter", "json")
        for q in json.loads(text):
            if q["name"] == queue:
                if q["type"] != "quorum" or sorted(q["members"]) != sorted(self.nodes):
                    raise RuntimeError(f"queue {queue} is {q['type']} with members {q['members']}")
                return q["leader"], q["members"]
        raise RuntimeError(f"queue {queue} not listed")

    def prepare(self, run_id: str, tasks: int) -> Dict[str, Any]:
        import pika

        queue = f"cmp-{run_id}"
        conn = pika.BlockingConnection(pika.URLParameters(self.urls[0]))
        try:
            ch = conn.channel()
            ch.queue_delete(queue)
            # Declared on the first node: its leader is placed there (client-local).
            ch.queue_declare(queue, durable=True, arguments={
                "x-queue-type": "quorum", "x-quorum-initial-group-size": 3})
        finally:
            conn.close()
        leader, members = self._leader(queue)
        url = self.urls[self.nodes.index(leader)]
        asyncio.run(asyncio.wait_for(self._publish(url, queue, tasks), PRELOAD_TIMEOUT))
        return {"queue": queue, "url": url,
                "note": f"quorum queue led by {leader}, {len(members)} members"}

    @staticmethod
    async def _publish(url: str, queue: str, tasks: int) -> None:
        import aio_pika

        connection = await aio_pika.connect(url, timeout=30)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = channel.default_exchange
            window = 1000  # publishes awaiting their confirm at once
            for start in range(0, tasks, window):
                await asyncio.gather(*(
                    exchange.publish(
                        aio_pika.Message(f"task-{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=queue,
                    )
                    for i in range(start, min(tasks, start + window))
                ))

    def open(self, target: Dict[str, Any], index: int) -> Ops:
        import pika

        params = pika.URLParameters(target["url"])
        params.socket_timeout = 10
        params.blocked_connection_timeout = 30
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        queue = target["queue"]
        deliveries = None
        if self.mode == "consume":
            ch.basic_qos(prefetch_count=1)
            # Yields (None, None, None) after 10 s without a delivery: an empty queue.
            deliveries = ch.consume(queue, auto_ack=False, inactivity_timeout=10)

        class RabbitOps(Ops):
            def claim(self) -> Any:
                if deliveries is not None:
                    method, _props, _body = next(deliveries)
                else:
                    method, _props, _body = ch.basic_get(queue, auto_ack=False)
                return None if method is None else method.delivery_tag

            def complete(self, task: Any) -> None:
                ch.basic_ack(task)

            def close(self) -> None:
                conn.close()

        return RabbitOps()

    def finish(self, target: Dict[str, Any]) -> Tuple[int, int]:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(target["url"]))
        try:
            ch = conn.channel()
            # The workers' connections are closed: any unacked message is back to ready.
            ok = ch.queue_declare(target["queue"], passive=True)
            left = ok.method.message_count
            ch.queue_delete(target["queue"])
        finally:
            conn.close()
        return int(left), 0


SYSTEMS = {"rota": Rota, "postgres": Postgres, "rabbitmq": RabbitMQ}


# --- workers -----------------------------------------------------------------------------


def worker_main(system: Any, target: Dict[str, Any], index: int, timing: Any, go: Any, results: Any,
                driver_pid: int) -> None:
    """One worker process: connect, report ready, wait for the go, then cycle until the
    window ends; report counts and latency samples (ms)."""
    # The driver stops the workers; a Ctrl-C must not kill them halfway through a report.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # And if the driver dies without stopping them (SIGKILL), they go too.
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != driver_pid:
        return  # the driver was already gone
    try:
        ops = system.open(target, index)
    except Exception as e:  # noqa: BLE001 (reported to the driver, which fails the run)
        results.put({"index": index, "fatal": f"cannot connect: {e!r}"})
        return
    results.put({"index": index, "ready": True})
    if not go.wait(CONNECT_TIMEOUT + 10):
        ops.close()
        return
    start, measure_from, end = timing[0], timing[1], timing[2]
    claim_ms, complete_ms = array("d"), array("d")
    completed = errors = 0
    dry = False
    last_error = ""
    while time.monotonic() < start:
        time.sleep(min(0.01, max(0.0, start - time.monotonic())))
    cpu0 = time.process_time()
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            task = ops.claim()
        except Exception as e:  # noqa: BLE001
            errors, last_error = errors + 1, f"claim: {e!r}"
            if errors >= WORKER_ERRORS_MAX:
                break
            continue
        t1 = time.perf_counter()
        if task is None:
            dry = True  # the preload ran out: the run is flagged
            break
        try:
            ops.complete(task)
        except Exception as e:  # noqa: BLE001
            errors, last_error = errors + 1, f"complete: {e!r}"
            if errors >= WORKER_ERRORS_MAX:
                break
            continue
        t2 = time.perf_counter()
        completed += 1
        done_at = time.monotonic()
        if measure_from <= done_at <= end:
            claim_ms.append((t1 - t0) * 1000.0)
            complete_ms.append((t2 - t1) * 1000.0)
    cpu = time.process_time() - cpu0
    try:
        ops.stop()
    except Exception as e:  # noqa: BLE001
        errors, last_error = errors + 1, f"stop: {e!r}"
    results.put({
        "index": index, "claim_ms": claim_ms, "complete_ms": complete_ms, "completed": completed,
        "errors": errors, "last_error": last_error, "dry": dry, "cpu": cpu,
    })
    # Connections stay open until the driver has read the servers' CPU at the window's
    # end: a server process that exits meanwhile (a Postgres backend) would take its CPU
    # out of the count until its parent reaps it.
    time.sleep(max(0.0, end + CLOSE_DELAY - time.monotonic()))
    try:
        ops.close()
    except Exception:  # noqa: BLE001 (the run is over; closing is best effort)
        pass


# --- runs ----------------------------------------------------------------------------------


@dataclass
class Result:
    round: int
    system: str
    workers: int
    cycles: int = 0
    seconds: float = 0.0
    claim_ms: List[float] = field(default_factory=list)
    complete_ms: List[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    last_error: str = ""
    dry: bool = False
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    others_cpu: float = 0.0
    background_cpu: float = 0.0
    steal_cpu: float = 0.0
    check: str = ""
    failed: str = ""
    noisy: bool = False  # other processes used more CPU than --bg-limit during the window

    @property
    def rate(self) -> float:
        return self.cycles / self.seconds if self.seconds else 0.0


def percentile(sorted_values: List[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    rank = round(p / 100.0 * (len(sorted_values) - 1))
    return sorted_values[min(rank, len(sorted_values) - 1)]


def one_run(systems: Dict[str, Any], name: str, workers: int, rnd: int, args: argparse.Namespace) -> Result:
    system = systems[name]
    result = Result(round=rnd, system=name, workers=workers, seconds=args.seconds)
    run_id = f"r{rnd}-w{workers}-{os.getpid()}"
    t = time.monotonic()
    try:
        target = system.prepare(run_id, args.tasks)
    except Exception as e:  # noqa: BLE001 (the run is reported as failed; the others go on)
        result.failed = f"preload: {e!r}"
        return result
    note = f" ({target['note']})" if target.get("note") else ""
    print(f"-- round {rnd}, {name}, {workers} worker(s): {args.tasks} tasks preloaded in "
          f"{time.monotonic() - t:.1f} s{note}", flush=True)
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    go = ctx.Event()
    timing = ctx.Array("d", 3, lock=False)
    procs = [ctx.Process(target=worker_main, args=(system, target, i, timing, go, results, os.getpid()),
                         daemon=True)
             for i in range(workers)]
    reports: List[Dict[str, Any]] = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + CONNECT_TIMEOUT
        ready = 0
        while ready < workers:
            msg = results.get(timeout=max(0.1, deadline - time.monotonic()))
            if "fatal" in msg:
                raise RuntimeError(f"worker {msg['index']}: {msg['fatal']}")
            ready += 1
        start = time.monotonic() + 0.2
        timing[0], timing[1], timing[2] = start, start + args.warmup, start + args.warmup + args.seconds
        go.set()
        others = [s for n, s in systems.items() if n != name]

        def cpu() -> CpuSnapshot:
            # This driver's tree is this driver, its workers and nothing else; the script
            # that started it and its helpers sit idle.
            return cpu_snapshot({"own": system.pids(), "peers": [p for s in others for p in s.pids()],
                                 "driver": [os.getpid(), os.getppid()]})

        time.sleep(max(0.0, timing[1] - time.monotonic()))
        before = cpu()
        time.sleep(max(0.0, timing[2] - time.monotonic()))
        after = cpu()
        result.server_cpu = after.groups["own"] - before.groups["own"]
        result.others_cpu = after.groups["peers"] - before.groups["peers"]
        # Another build or test running meanwhile shows here.
        result.background_cpu = max(0.0, after.background - before.background)
        # And a host busy with other guests here: noise that no process on this machine shows.
        result.steal_cpu = max(0.0, after.steal - before.steal)
        deadline = timing[2] + RESULT_GRACE
        while len(reports) < workers:
            reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
    except queue.Empty:
        result.failed = f"timed out waiting for the workers ({len(reports)} of {workers} reported)"
    except Exception as e:  # noqa: BLE001 (the run is reported as failed; the others go on)
        result.failed = repr(e)
    finally:
        # Workers that reported have exited or are about to; on a stop (TERM, Ctrl-C)
        # none is waited for.
        for p in procs:
            p.join(timeout=0 if STOPPING else 10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    claim: List[float] = []
    complete: List[float] = []
    for r in reports:
        claim.extend(r["claim_ms"])
        complete.extend(r["complete_ms"])
        result.completed += r["completed"]
        result.errors += r["errors"]
        result.last_error = r["last_error"] or result.last_error
        result.dry = result.dry or r["dry"]
        result.client_cpu += r["cpu"]
    result.cycles = len(claim)
    result.claim_ms, result.complete_ms = sorted(claim), sorted(complete)
    try:
        ready_left, claimed_left = system.finish(target)
        expected = args.tasks - result.completed
        result.check = "ok" if (ready_left, claimed_left) == (expected, 0) else (
            f"MISMATCH: {ready_left} ready and {claimed_left} claimed left, {expected} expected ready")
    except Exception as e:  # noqa: BLE001
        result.check = f"not checked: {e!r}"
    return result


# --- output -----------------------------------------------------------------------------------


def fsync_probe(directory: str, count: int = 200) -> Tuple[float, float]:
    """p50 and p99 in ms of an 8 KiB write plus fdatasync in ``directory`` (the disk all
    three systems log to)."""
    samples = []
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        block = os.urandom(8192)
        for _ in range(count):
            t = time.perf_counter()
            os.write(f.fileno(), block)
            os.fdatasync(f.fileno())
            samples.append((time.perf_counter() - t) * 1000.0)
    samples.sort()
    return percentile(samples, 50), percentile(samples, 99)


def wake_probe(count: int = 2000, cpus: Optional[set] = None) -> Tuple[float, float]:
    """p50 and p99 in us of a one-byte round trip through two pipes between this process
    and a child, each woken by the other's write: two wake-ups, the hop a request and its
    answer make between a client and a server on this machine. With ``cpus`` both
    processes run there (one CPU: no wake-up crosses CPUs); without, where the scheduler
    puts them. Raises OSError if the probe cannot run or the child fails."""
    warmup = 50
    to_child, from_parent = os.pipe()
    try:
        to_parent, from_child = os.pipe()
    except OSError:
        os.close(to_child)
        os.close(from_parent)
        raise
    try:
        pid = os.fork()
    except OSError:
        for fd in (to_child, from_parent, to_parent, from_child):
            os.close(fd)
        raise
    if pid == 0:
        # Each side holds only its own ends, so a side that ends is an end of file to
        # the other rather than a read that never returns.
        status = 1
        try:
            os.close(from_parent)
            os.close(to_parent)
            if cpus:
                os.sched_setaffinity(0, cpus)
            while os.read(to_child, 1):
                os.write(from_child, b"x")
            status = 0
        except (SystemExit, KeyboardInterrupt):
            pass  # stopped with the run (the script's signal handlers): nothing to report
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(to_child)
    os.close(from_child)
    saved = os.sched_getaffinity(0)
    samples = []
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        for i in range(warmup + count):
            t = time.perf_counter()
            os.write(from_parent, b"x")
            if not os.read(to_parent, 1):
                raise OSError("the wake-up probe's child ended early")
            if i >= warmup:
                samples.append((time.perf_counter() - t) * 1e6)
    finally:
        os.sched_setaffinity(0, saved)
        os.close(from_parent)
        os.close(to_parent)
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise OSError(f"the wake-up probe's child failed (wait status {status})")
    samples.sort()
    return percentile(samples, 50), percentile(samples, 99)


def wake_line() -> str:
    """What the wake-up probe found, for the header; a failed probe does not stop a run."""
    allowed = os.sched_getaffinity(0)
    try:
        if len(allowed) == 1:
            p50, p99 = wake_probe()
            return (f"wake-ups: a pipe round trip between two processes takes p50 {p50:.0f} us,"
                    f" p99 {p99:.0f} us (this process may run on one CPU only)")
        spread = wake_probe()
        one_cpu = wake_probe(cpus={min(allowed)})
    except OSError as e:
        return f"wake-ups: not measured ({e})"
    return (f"wake-ups: a pipe round trip between two processes takes p50 {spread[0]:.0f} us,"
            f" p99 {spread[1]:.0f} us where the scheduler puts them; p50 {one_cpu[0]:.0f} us,"
            f" p99 {one_cpu[1]:.0f} us on one CPU")


def fmt_ms(v: float) -> str:
    return "-" if v != v else f"{v:.2f}"


def per_cycle(cpu_seconds: float, cycles: int) -> str:
    return f"{1000.0 * cpu_seconds / cycles:.2f}" if cycles else "-"


def print_runs(results: List[Result]) -> None:
    header = (f"{'round':>5}  {'system':<9} {'W':>3}  {'cycles/s':>9}  {'claim p50':>9}  {'claim p99':>9}  "
              f"{'compl p50':>9}  {'compl p99':>9}  {'srv CPU':>8}  {'cli CPU':>8}  {'others':>6}  {'bg':>6}  {'steal':>6}  check")
    print(header)
    print("-" * len(header))
    for r in results:
        if r.failed:
            print(f"{r.round:>5}  {r.system:<9} {r.workers:>3}  FAILED: {r.failed}")
            continue
        notes = [r.check]
        if r.dry:
            notes.append("RAN DRY (raise --tasks)")
        if r.noisy:
            notes.append("NOISY (background load above --bg-limit)")
        if r.errors:
            notes.append(f"{r.errors} errors, last: {r.last_error[:120]}")
        print(f"{r.round:>5}  {r.system:<9} {r.workers:>3}  {r.rate:>9.1f}  {fmt_ms(percentile(r.claim_ms, 50)):>9}  "
              f"{fmt_ms(percentile(r.claim_ms, 99)):>9}  {fmt_ms(percentile(r.complete_ms, 50)):>9}  "
              f"{fmt_ms(percentile(r.complete_ms, 99)):>9}  {per_cycle(r.server_cpu, r.cycles):>8}  "
              f"{per_cycle(r.client_cpu, r.completed):>8}  {100.0 * r.others_cpu / r.seconds:>5.1f}%  "
              f"{100.0 * r.background_cpu / r.seconds:>5.1f}%  {100.0 * r.steal_cpu / r.seconds:>5.1f}%  "
              f"{'; '.join(notes)}")


def print_summary(results: List[Result], names: List[str], worker_counts: List[int], rounds: int) -> None:
    over = "the median over rounds" if rounds > 1 else "one round"
    print(f"\n== Summary ({over}). Rota/this: Rota's cycles/s over the system's; this/Rota p50: the system's"
          " claim p50 over Rota's; above 1 means Rota is ahead")
    header = f"{'W':>3}  {'system':<9} {'cycles/s':>9}  {'claim p50':>9}  {'claim p99':>9}  {'Rota/this':>9}  {'this/Rota p50':>13}"
    print(header)
    print("-" * len(header))

    def agg(name: str, w: int) -> Optional[Tuple[float, float, float, List[float]]]:
        rs = [r for r in results if r.system == name and r.workers == w and not r.failed and r.cycles]
        if not rs:
            return None
        rates = [r.rate for r in rs]
        return (statistics.median(rates), statistics.median(percentile(r.claim_ms, 50) for r in rs),
                statistics.median(percentile(r.claim_ms, 99) for r in rs), rates)

    for w in worker_counts:
        rota = agg("rota", w)
        for name in names:
            a = agg(name, w)
            if a is None:
                print(f"{w:>3}  {name:<9} {'no result':>9}")
                continue
            rate, p50, p99, rates = a
            ratio = lat = ""
            if name != "rota" and rota is not None:
                ratio = f"{rota[0] / rate:.2f}x"
                lat = f"{p50 / rota[1]:.2f}x"
            runs = f"  (runs: {', '.join(f'{x:.0f}' for x in rates)})" if len(rates) > 1 else ""
            if any(r.noisy for r in results if r.system == name and r.workers == w):
                runs += "  NOISY"
            print(f"{w:>3}  {name:<9} {rate:>9.1f}  {fmt_ms(p50):>9}  {fmt_ms(p99):>9}  {ratio:>9}  {lat:>13}{runs}")


def stop(signum: int, _frame: Any) -> None:
    global STOPPING
    STOPPING = True
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems-file", required=True)
    parser.add_argument("--systems", default=",".join(SYSTEM_ORDER))
    parser.add_argument("--workers", default="1,16")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--rabbit-mode", choices=("get", "consume"), default="get",
                        help="RabbitMQ claim: basic.get, or a consumer with prefetch 1")
    parser.add_argument("--rota-mode", choices=("delete", "next"), default="delete",
                        help="Rota's cycle: claim then delete, or a finish that claims the next task")
    parser.add_argument("--postgres-mode", choices=("separate", "combined"), default="separate",
                        help="Postgres's cycle: claim and complete in two transactions, or a complete"
                        " that claims the next task in the same transaction (like --rota-mode next)")
    parser.add_argument("--bg-limit", type=float, default=15.0,
                        help="most CPU (%% of one core) other processes may use during a run's window")
    parser.add_argument("--bg-retries", type=int, default=2, help="times a run over --bg-limit is run again")
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    # TERM (the script's cleanup) and Ctrl-C as an exit that stops the workers first.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    config = json.loads(Path(args.systems_file).read_text())
    config["rabbitmq"]["mode"] = args.rabbit_mode
    if "rota" in config:
        config["rota"]["mode"] = args.rota_mode
    if "postgres" in config:
        config["postgres"]["mode"] = args.postgres_mode
    names = [n for n in args.systems.split(",") if n]
    worker_counts = [int(w) for w in args.workers.split(",")]
    systems = {n: SYSTEMS[n](config[n], config["repo"]) for n in names}

    cores = os.cpu_count()
    load = os.getloadavg()[0]
    if load > 0.5 * (cores or 1):
        print(f"\nWARNING: the machine is busy before the start (load average {load:.1f} on {cores} cores):"
              " the figures will be low and noisy; the bg column shows how much", flush=True)
    p50, p99 = fsync_probe(args.work_dir)
    print("\n== What is measured")
    print(f"machine: {cores} cores, {os.uname().release}; every server and every client on it, over loopback TCP;"
          f" all data under {args.work_dir}")
    print(f"disk: an 8 KiB write + fdatasync there takes p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    # Wake-ups between processes are most of a lightly loaded request's cost on some
    # virtual machines (docs/performance.md, session 31): printed so that figures from
    # different machines can be told apart.
    print(wake_line())
    print(f"pattern: {args.tasks} tasks preloaded per run; W worker processes each loop claim one task, complete it;"
          f" {args.warmup:g} s warm-up, then {args.seconds:g} s measured; a cycle counts when its complete returns"
          f" in the window; fresh queue per run; worker counts {worker_counts}, {args.rounds} round(s)")
    for n, s in systems.items():
        print(f"{n}:")
        for line in s.describe():
            print(f"  {line}")
    print("columns: latencies in ms as each worker saw them; srv CPU = the system's processes' CPU ms per counted"
          " cycle (all its nodes); cli CPU = the workers' CPU ms per cycle; others = CPU of the idle systems"
          " during the window, in % of one core; bg = CPU of every other process on the machine during the"
          " window, in % of one core (near 0 on an idle machine); steal = CPU time the hypervisor gave to other"
          " guests while this machine had work, in % of one core (0 where not reported); check = tasks left after"
          " the run match the preload less the cycles completed\n",
          flush=True)

    results: List[Result] = []
    for rnd in range(1, args.rounds + 1):
        order = names if rnd % 2 else list(reversed(names))
        for w in worker_counts:
            for name in order:
                # A run during which something else loaded the machine is run again
                # (after a pause), up to --bg-retries times; the last attempt counts.
                for attempt in range(args.bg_retries + 1):
                    r = one_run(systems, name, w, rnd, args)
                    background = 100.0 * r.background_cpu / r.seconds
                    r.noisy = not r.failed and background > args.bg_limit
                    if not r.noisy or attempt == args.bg_retries:
                        break
                    print(f"   other processes used {background:.0f}% of a core meanwhile (--bg-limit"
                          f" {args.bg_limit:g}%): running it again in 10 s", flush=True)
                    time.sleep(10)
                results.append(r)
                tail = f"FAILED: {r.failed}" if r.failed else (
                    f"{r.rate:.1f} cycles/s, claim p50 {fmt_ms(percentile(r.claim_ms, 50))} ms,"
                    f" p99 {fmt_ms(percentile(r.claim_ms, 99))} ms; check {r.check}")
                print(f"   {tail}", flush=True)

    print("\n== Runs (in the order run)")
    print_runs(results)
    print_summary(results, names, worker_counts, args.rounds)
    noisy = [r for r in results if r.noisy]
    if noisy:
        print(f"\nWARNING: {len(noisy)} run(s) shared the machine with other work (bg column): their figures"
              " are low; rerun on an idle machine", file=sys.stderr)
    bad = [r for r in results if r.failed or r.dry or not r.check.startswith("ok")]
    if bad:
        print(f"\n{len(bad)} run(s) failed, ran dry or did not check out: see the table above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
