"""``Worker``: the claim, run, finish loop, with a number of threads and a graceful stop.

Each of ``threads`` slots claims a task of the group, holds it in a
:class:`~rota.lease.Lease` that renews itself, and calls the handler with the task and
the lease. Once the group has run dry a slot waits in blocking claims (``wait_ms``), so
an idle worker never polls. The handler's return value finishes the task with that
result (any JSON value; ``None`` for none); an exception fails it with the exception's
text (retried after the group's back-off, dead after its last attempt); :class:`FailTask`
fails it with a chosen error and retry delay. A handler may also end the lease itself
(``lease.finish(...)``, ``lease.release()``). A handler whose lease is lost cannot end
the task any more (the finish is refused): it should watch
:attr:`Lease.lost <rota.lease.Lease.lost>` or call
:meth:`Lease.check() <rota.lease.Lease.check>` in long work, and pass
:attr:`Lease.fence <rota.lease.Lease.fence>` downstream.

:meth:`Worker.stop` stops claiming at once (waiting claims are abandoned; a claim the
cluster granted at that very moment stays this client's until its lease lapses, as
when a worker dies), lets running handlers go on for ``grace_ms``, then gives the tasks
of those still running back (so they run elsewhere, without spending an attempt) and
returns; such a handler's thread is
left to end on its own.

::

    client = RotaClient(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"])

    @client.worker("mail", threads=8, lease_ms=30_000)
    def send(task, lease):
        deliver(task.data, fence=lease.fence)
        return {"sent": True}

    send.run()          # until send.stop() (from another thread) or Ctrl-C
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from .errors import Cancelled, LeaseLost, Refused, RotaError, Unavailable
from .lease import Lease, error_text
from .types import Task
from ._http import Cancel

if TYPE_CHECKING:  # pragma: no cover
    from .client import RotaClient

log = logging.getLogger("rota.worker")

Handler = Callable[[Task, Lease], Any]
"""A handler: called with the claimed task and its lease; returns the result."""

CLAIM_FAILURE_REPORT_EVERY = 60.0
"""While claims keep failing, how often (seconds) the log is told again."""


def poll_backoff(empties: int) -> float:
    """The pause (seconds) before claiming again after ``empties`` blocking claims in a
    row came back empty well before their wait (a node that cannot wait, or a wait cut
    short): 100 ms doubling up to 5 s, plus up to half of it at random, so that many
    workers polling a quiet group neither spin nor march in step."""
    base = min(0.1 * float(1 << min(max(empties - 1, 0), 16)), 5.0)
    return base + random.uniform(0.0, base / 2)


class FailTask(Exception):
    """Raise it from a handler to fail the task with ``error`` and, optionally, a retry
    delay instead of the group's back-off."""

    def __init__(self, error: str, retry_in_ms: Optional[int] = None) -> None:
        super().__init__(error)
        self.error = error
        self.retry_in_ms = retry_in_ms


class Worker:
    """Runs ``handler`` on the tasks of ``group``, ``threads`` at a time.

    ``lease_ms``: each claim's lease, renewed at about a third of it. ``wait_ms``: how
    long one blocking claim waits for a task (at most 60 000); a slot claims without
    waiting while its claims find tasks, and waits once one finds none. ``grace_ms``: after a stop, how
    long running handlers may go on before their tasks are failed. ``on_finish(task,
    result)`` and ``on_fail(task, error)`` are called (in the slot's thread) after the
    cluster acknowledged the finish or the fail; ``on_error(exc)`` after a claim failed.

    A worker runs once: :meth:`start` (or :meth:`run`), then :meth:`stop`.
    """

    def __init__(
        self,
        client: "RotaClient",
        group: str,
        handler: Optional[Handler] = None,
        *,
        threads: int = 1,
        lease_ms: int = 30_000,
        wait_ms: int = 20_000,
        grace_ms: int = 10_000,
        on_finish: Optional[Callable[[Task, Any], None]] = None,
        on_fail: Optional[Callable[[Task, str], None]] = None,
        on_error: Optional[Callable[[BaseException], None]] = None,
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if not isinstance(group, str) or not group:
            # Every claim would be refused, and the worker would retry them forever.
            raise ValueError(f"a worker needs a group name, not {group!r}")
        self.client = client
        self.group = group
        self.handler = handler
        self.threads = int(threads)
        self.lease_ms = int(lease_ms)
        self.wait_ms = int(wait_ms)
        self.grace_ms = int(grace_ms)
        self.on_finish = on_finish
        self.on_fail = on_fail
        self.on_error = on_error
        self._lock = threading.Lock()
        # Claims failed in a row, and when that was last logged: shared by the slots, so
        # that a cluster out of reach is logged once, not once per slot and retry.
        self._claim_failures = 0
        self._claim_failure_logged: Optional[float] = None
        self._active: Dict[int, Lease] = {}
        self._failed_by_stop: Set[Lease] = set()
        self._slots: List[threading.Thread] = []
        self._cancel = Cancel()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._started = False
        self.finished = 0
        """Tasks finished (the cluster acknowledged the finish)."""
        self.failed = 0
        """Tasks failed (the cluster acknowledged the fail)."""
        self.lost = 0
        """Tasks whose lease was lost (or ended by the stop) before the handler ended."""

    def __call__(self, handler: Handler) -> "Worker":
        """Decorator use: ``@Worker(client, "group", threads=4)`` over the handler."""
        self.handler = handler
        return self

    @property
    def running(self) -> bool:
        return self._started and not self._done.is_set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> "Worker":
        """Starts the slots (daemon threads) and returns at once."""
        if self.handler is None:
            raise ValueError("the worker has no handler")
        with self._lock:
            if self._started:
                raise RuntimeError("a worker runs once; make a new one")
            self._started = True
        for index in range(self.threads):
            slot = threading.Thread(
                target=self._slot, args=(index,), name=f"rota-worker-{self.group}-{index}", daemon=True
            )
            self._slots.append(slot)
            slot.start()
        threading.Thread(target=self._supervise, name=f"rota-worker-{self.group}-stop", daemon=True).start()
        return self

    def _claim_failed(self, error: RotaError) -> None:
        with self._lock:
            self._claim_failures += 1
            failures, logged = self._claim_failures, self._claim_failure_logged
            due = logged is None or time.monotonic() - logged >= CLAIM_FAILURE_REPORT_EVERY
            if due:
                self._claim_failure_logged = time.monotonic()
        if due:
            log.warning("claims from %r failing (%d in a row): %s", self.group, failures, error)

    def _claims_answered(self) -> None:
        with self._lock:
            failures = self._claim_failures
            self._claim_failures, self._claim_failure_logged = 0, None
        if failures:
            log.warning("claims from %r answered again after %d failed", self.group, failures)

    def run(self) -> int:
        """Starts the worker and blocks until it is stopped (by :meth:`stop` from another
        thread, or Ctrl-C, which stops it gracefully); how many tasks it finished."""
        self.start()
        try:
            while not self._done.wait(0.2):
                pass
        except KeyboardInterrupt:
            self.stop(wait=True)
        return self.finished

    def stop(self, wait: bool = True, timeout: Optional[float] = None) -> bool:
        """Stops claiming (waiting claims are abandoned), gives running handlers
        ``grace_ms``, then fails the tasks still running. With ``wait``, blocks until
        that is done (or ``timeout`` seconds); whether it is."""
        self._stop.set()
        self._cancel.cancel()
        if not self._started:
            self._done.set()
        if threading.current_thread() in self._slots:
            wait = False  # a handler that stops its own worker must not wait for itself
        if wait:
            return self._done.wait(timeout)
        return self._done.is_set()

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits until the worker has stopped; whether it has."""
        return self._done.wait(timeout)

    def __enter__(self) -> "Worker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(wait=True)

    # -- inside ---------------------------------------------------------------------

    def _supervise(self) -> None:
        self._stop.wait()
        deadline = time.monotonic() + self.grace_ms / 1000.0
        for slot in self._slots:
            slot.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            leftover = list(self._active.values())
            self._failed_by_stop.update(leftover)
        # Given back, not failed: a worker going away is not the task's failure, and must
        # not spend its attempts (a rolling restart would make jobs on their last one dead).
        for lease in leftover:
            try:
                lease.release()
                log.warning("task %d of %r given back: the worker stopped past its grace", lease.task.id, self.group)
            except RotaError:
                pass
        self._done.set()

    def _slot(self, index: int) -> None:
        # While claims find tasks, the next claim does not wait: a blocking claim costs
        # the leader a linearizable read before its proposal, so it is slower when tasks
        # are there. Once a claim, or a finish that asked for the next task, finds nothing
        # (and at first), the slot waits in blocking claims (no polling, no log entry
        # while it waits) until one brings a task.
        busy = False
        # A claim without a definite answer may have claimed a task: the next claim asks
        # again under its request id, and so gets that task rather than a second one.
        unsettled: Optional[str] = None
        unsettled_since: Optional[float] = None
        empties = 0
        errors = 0
        carried: Optional[Lease] = None
        while not self._stop.is_set():
            if carried is not None:
                # The last finish claimed this one in the same write.
                lease, carried = carried, None
            else:
                wait_ms = 0 if busy else self.wait_ms
                sent = time.monotonic()
                try:
                    lease = self.client.claim_lease(
                        self.group,
                        self.lease_ms,
                        wait_ms=wait_ms,
                        request_id=unsettled,
                        cancel=self._cancel,
                        first_sent=unsettled_since if unsettled is not None else sent,
                    )
                    unsettled = None
                except Cancelled:
                    return
                except RotaError as e:
                    self._claim_failed(e)
                    if isinstance(e, Unavailable):
                        if unsettled != e.request_id:
                            unsettled_since = sent
                        unsettled = e.request_id
                    else:
                        unsettled = None
                    self._call(self.on_error, e)
                    busy = False
                    # Growing: a refused claim fails at once every time, and must not become
                    # a stream of requests.
                    errors += 1
                    if self._cancel.wait(poll_backoff(errors)):
                        return
                    continue
                errors = 0
                self._claims_answered()
                busy = lease is not None
                if lease is None:
                    if wait_ms and time.monotonic() - sent < wait_ms / 2000.0:
                        # Empty well before the wait was up: this node does not wait (or
                        # the wait was cut short), so poll with a growing pause instead.
                        empties += 1
                        if self._cancel.wait(poll_backoff(empties)):
                            return
                    else:
                        empties = 0
                    continue
                empties = 0
            if self._stop.is_set():
                # Claimed as the stop came: give it back rather than start it.
                try:
                    lease.release()
                except RotaError:
                    pass
                return
            with self._lock:
                self._active[index] = lease
            try:
                carried, found_none = self._work(lease)
                if found_none:
                    # The finish just asked for the next task and there was none: the
                    # next claim waits instead of asking again at once.
                    busy = False
            finally:
                with self._lock:
                    self._active.pop(index, None)
        if carried is not None:
            # Claimed by the last finish as the stop came: give it back unstarted.
            try:
                carried.release()
            except RotaError:
                pass

    def _work(self, lease: Lease) -> Tuple[Optional[Lease], bool]:
        """Runs the handler on ``lease`` and ends the claim: the next task's lease when
        the finish claimed it in the same write, and whether the finish asked for one and
        the group had none."""
        assert self.handler is not None
        if not lease.wait_confirmed():
            # A late claim whose first renewal did not land: another worker may hold
            # the task, so its work never starts.
            self._count_lost(lease, f"a late claim's first renewal did not land, so its work never started: {lease.lost_reason}")
            return None, False
        claimed = lease.task
        result: Any = None
        error: Optional[str] = None
        retry_in_ms: Optional[int] = None
        saw_lost = False
        try:
            result = self.handler(claimed, lease)
        except FailTask as e:
            error, retry_in_ms = e.error, e.retry_in_ms
        except LeaseLost:
            saw_lost = True
        except Exception as e:  # the handler's failure is the task's
            error = error_text(e)
        except BaseException as e:
            self._fail(lease, error_text(e), None)
            raise
        else:
            try:
                json.dumps(result)
            except (TypeError, ValueError) as e:
                error = f"the handler's result is not JSON: {e}"
        with self._lock:
            failed_by_stop = lease in self._failed_by_stop
            self._failed_by_stop.discard(lease)
        if failed_by_stop:
            self._count_lost(lease, "the stop gave the task back after the grace period")
        elif saw_lost:
            why = lease.lost_reason
            self._count_lost(lease, "the handler saw its lease lost" + (f": {why}" if why is not None else ""))
        elif lease.ended and not lease.lost:
            pass  # the handler ended the lease itself (finish, fail, release, abandon)
        elif error is None:
            return self._finish(lease, result)
        else:
            self._fail(lease, error, retry_in_ms)
        return None, False

    def _finish(self, lease: Lease, result: Any) -> Tuple[Optional[Lease], bool]:
        """Finishes ``lease``'s task; unless the worker is stopping, the same write claims
        the slot's next task (one commit per cycle): its lease, and whether the write
        asked for one and the group had none."""
        claim_next = not self._stop.is_set()
        sent = time.monotonic()
        claimed: List[Task] = []
        try:
            try:
                if claim_next:
                    claimed = lease.finish_and_claim(result, group=self.group, duration_ms=self.lease_ms)
                else:
                    lease.finish(result)
            except Unavailable as e:
                # It may have applied: ask once more under its request id.
                if claim_next:
                    claimed = self.client.finish_and_claim(
                        lease.task, result, group=self.group, duration_ms=self.lease_ms, request_id=e.request_id
                    )
                else:
                    self.client.finish(lease.task, result, request_id=e.request_id)
        except LeaseLost as e:
            self._count_lost(lease, str(e))
            return None, False
        except Refused as e:
            # The claim had ended (a lapse, a cancel) before the finish came.
            self._count_lost(lease, f"its finish was refused: {e}")
            return None, False
        except RotaError as e:
            log.warning("finish of task %d of %r failed: %s", lease.task.id, self.group, e)
            return None, False
        # The next task's lease starts renewing before the callback runs, which may be
        # slow.
        carried = Lease(self.client, claimed[0], self.lease_ms, claimed_at=sent) if claimed else None
        with self._lock:
            self.finished += 1
        self._call(self.on_finish, lease.task, result)
        return carried, claim_next and not claimed

    def _fail(self, lease: Lease, error: str, retry_in_ms: Optional[int]) -> None:
        try:
            try:
                lease.fail(error, retry_in_ms)
            except Unavailable as e:
                self.client.fail(lease.task, error, retry_in_ms, request_id=e.request_id)
        except LeaseLost as e:
            self._count_lost(lease, str(e))
            return
        except Refused as e:
            self._count_lost(lease, f"its fail was refused: {e}")
            return
        except RotaError as e:
            log.warning("fail of task %d of %r failed: %s", lease.task.id, self.group, e)
            return
        with self._lock:
            self.failed += 1
        self._call(self.on_fail, lease.task, error)

    def _count_lost(self, lease: Lease, why: str) -> None:
        with self._lock:
            self.lost += 1
        log.warning("task %d of %r: %s", lease.task.id, self.group, why)

    @staticmethod
    def _call(callback: Optional[Callable[..., None]], *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # a callback's bug must not stop the slot
            log.exception("a worker callback failed")


def worker(client: "RotaClient", group: str, **options: Any) -> Callable[[Handler], Worker]:
    """Decorator: ``@worker(client, "mail", threads=8)`` makes the handler a
    :class:`Worker` (options as :class:`Worker` takes them)."""

    def wrap(handler: Handler) -> Worker:
        return Worker(client, group, handler, **options)

    return wrap
