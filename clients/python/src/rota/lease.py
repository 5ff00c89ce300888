"""``Lease``: a claimed task that renews itself in a background thread and always knows
its current fencing id.

A renewal writes a new version of the task, whose id is the fence from then on: pass
:attr:`Lease.fence` to whatever the work writes downstream (see docs/fencing.md and
:mod:`rota.fencing`), so that a worker whose lease lapsed cannot overwrite a newer
worker's output. A lease is lost when a renewal is refused (the task was cancelled, or
its lease lapsed and another worker claimed it; or a node rejected the renewal with
any other 4xx: 401 or 403 when its token was revoked or lacks the right, 400 or 422 for
a renewal no node will take) or when no renewal got a definite
answer before the lease ran out; the work should then stop, since it no longer owns the
task (or can no longer end it).

The lease's end is reckoned conservatively by this process's clock: from when the write
that granted it was sent. The cluster alone judges it (in log time), so a renewal is
always asked of the cluster, which refuses one whose lease lapsed.

A claim answered late (retried through an outage, with less than a third of its lease
left by that reckoning) may have been granted long ago and lapsed, or only just now: its
work should wait for :meth:`Lease.wait_confirmed`, which returns once the first renewal
settles it. :class:`~rota.worker.Worker` does so.

::

    lease = client.claim_lease("mail", duration_ms=30_000, wait_ms=20_000)
    if lease is not None:
        with lease:                       # fails the task if the block raises
            send(lease.task.data, fence=lease.fence)
            lease.finish({"sent": True})  # or leave the block: finishes without a result
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, List, Optional, Tuple, Type

from .errors import LeaseLost, Refused, Rejected, RotaError
from .types import Task

if TYPE_CHECKING:  # pragma: no cover
    from types import TracebackType

    from .client import RotaClient

RETRY_UNKNOWN_AFTER = 1.0
"""After a renewal without a definite answer, the next try comes within this many seconds."""



RETRIED_STATUSES = (421, 425)
"""4xx statuses that HTTP lets a client send again (Misdirected Request, Too Early): a
renewal answered so is retried; any other 4xx ends the lease."""


def error_text(error: BaseException) -> str:
    """How a failed task records an exception: ``"ValueError: the message"``."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()


class Lease:
    """Holds ``task``, claimed by ``client`` for ``duration_ms`` with a request sent at
    ``claimed_at`` (a ``time.monotonic()`` value; default: now), and renews it every
    ``renew_every_ms`` (default: a third of the lease) until it is finished, failed,
    released or abandoned, or lost.

    Thread-safe: the work may run in one thread while another reads :attr:`fence` or
    ends the lease; ending waits for a renewal in flight and then uses the version it
    wrote.
    """

    def __init__(
        self,
        client: "RotaClient",
        task: Task,
        duration_ms: int,
        *,
        claimed_at: Optional[float] = None,
        renew_every_ms: Optional[int] = None,
    ) -> None:
        if duration_ms <= 0:
            raise ValueError("duration_ms must be positive")
        self._client = client
        self._duration_ms = int(duration_ms)
        self._duration = self._duration_ms / 1000.0
        every_ms = renew_every_ms if renew_every_ms is not None else self._duration_ms / 3.0
        self._every = max(float(every_ms) / 1000.0, 0.001)
        sent = claimed_at if claimed_at is not None else time.monotonic()
        self._task = task
        # When the lease runs out by this process's clock, conservatively.
        self._until = sent + self._duration
        self._next = sent + self._every
        # Held while a renewal is written and while the lease is ended.
        self._lock = threading.Lock()
        self._ended = False
        self._lost: Optional[LeaseLost] = None
        self._lost_event = threading.Event()
        # Set once the lease is known to be held: at once for a claim answered with a
        # third of its lease left, after the first renewal for one answered later.
        self._confirmed = threading.Event()
        if self._until - time.monotonic() >= self._duration / 3.0:
            self._confirmed.set()
        # Set once confirmed or lost, for wait_confirmed.
        self._settled = threading.Event()
        if self._confirmed.is_set():
            self._settled.set()
        self._wake = threading.Event()
        # A renewal whose outcome is unknown: (task id, request id, first sent). It is
        # sent again under the same request id, so that it applies once and its first
        # outcome (the new version, if it applied) is learnt.
        self._pending: Optional[Tuple[int, str, float]] = None
        self._renewals = 0
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"rota-lease-{task.id}", daemon=True
        )
        self._thread.start()

    # -- what the work reads -------------------------------------------------------

    @property
    def task(self) -> Task:
        """The task as last written: its id is the current fence."""
        return self._task

    @property
    def fence(self) -> int:
        """The current fencing id: pass it downstream with every write the work makes.
        It changes (grows) with every renewal."""
        return self._task.id

    @property
    def duration_ms(self) -> int:
        return self._duration_ms

    @property
    def renewals(self) -> int:
        """How many renewals succeeded."""
        return self._renewals

    @property
    def lost(self) -> bool:
        """Whether the lease was lost (the work should stop)."""
        return self._lost is not None

    @property
    def lost_reason(self) -> Optional[LeaseLost]:
        """Why the lease was lost, if it was."""
        return self._lost

    @property
    def ended(self) -> bool:
        """Whether the holder ended the lease (finished, failed, released, abandoned)."""
        return self._ended

    @property
    def held(self) -> bool:
        """Whether the lease is neither ended nor lost."""
        return not self._ended and self._lost is None

    def wait_confirmed(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lease is known to be held (at once for a claim answered with
        at least a third of its lease left; after the first renewal lands for one
        answered later), is lost or ended, or ``timeout`` seconds pass; whether it is
        known to be held. Start the work only after it returns ``True``."""
        self._settled.wait(timeout)
        return self._confirmed.is_set() and self._lost is None and not self._ended

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lease is lost or ``timeout`` seconds pass; whether it was."""
        return self._lost_event.wait(timeout)

    def check(self) -> None:
        """Raises :class:`~rota.errors.LeaseLost` if the lease was lost or ended: call it
        between steps of long work."""
        lost = self._lost
        if lost is not None:
            raise LeaseLost(lost.reason, lost.errors)
        if self._ended:
            raise LeaseLost("ended")

    # -- renewing ---------------------------------------------------------------------

    def _renew_loop(self) -> None:
        try:
            while True:
                delay = self._next - time.monotonic()
                if delay > 0 and self._wake.wait(delay):
                    return
                with self._lock:
                    if self._ended or self._lost is not None:
                        return
                    self._renew_once()
                    if self._lost is not None:
                        return
        finally:
            # Whatever ended the renewals (an end, a loss, a fault of this thread), a
            # wait_confirmed must not wait for a renewal that will never come.
            self._settled.set()

    def _set_lost(self, lost: LeaseLost) -> None:
        self._lost = lost
        self._lost_event.set()
        self._settled.set()
        self._wake.set()

    def _renew_once(self) -> None:
        """One renewal, with the lock held: the new version, a loss, or nothing known."""
        task = self._task
        now = time.monotonic()
        if self._pending is not None and self._pending[0] == task.id:
            _, request_id, first_sent = self._pending
        else:
            request_id, first_sent = self._client.next_request_id(), now
            self._pending = (task.id, request_id, first_sent)
        # Bounded by what is left of the lease: past it the task is not ours unless nobody
        # took it meanwhile, and work running on it may collide with another worker's. A
        # late claim's first renewal gets at least one call instead: its claim may have
        # been granted only just now, and its work waits for the renewal (wait_confirmed).
        deadline = self._until
        if not self._confirmed.is_set():
            deadline = max(deadline, now + self._client.call_timeout)
        try:
            renewed = self._client.renew(task, self._duration_ms, request_id=request_id, deadline=deadline)
        except Refused as e:
            self._pending = None
            self._set_lost(LeaseLost("refused", e.errors))
            return
        except Rejected as e:
            if e.status in RETRIED_STATUSES:
                self._retry_or_expire()
                return
            # A definite 4xx (the client retries 408 and 429 itself): the token was
            # revoked or lacks the right, or the renewal is one no node will take. Sent
            # again it meets the same answer, and the work may not be able to end the
            # task either. Lost now, with the node's reason, rather than at the lease's
            # end as if no node had answered.
            self._pending = None
            node = f" by {e.node}" if e.node else ""
            self._set_lost(LeaseLost("refused", [f"the renewal was refused{node} ({e.status}): {e.message}"]))
            return
        except RotaError:
            self._retry_or_expire()
            return
        self._pending = None
        self._task = renewed
        self._renewals += 1
        self._confirmed.set()
        self._settled.set()
        self._until = first_sent + self._duration
        self._next = first_sent + self._every

    def _retry_or_expire(self) -> None:
        """After a renewal without a definite answer: the same renewal again soon, or the
        lease lost as ``expired`` once it ran out."""
        now = time.monotonic()
        if now >= self._until:
            self._set_lost(LeaseLost("expired"))
        else:
            self._next = now + min(self._every, RETRY_UNKNOWN_AFTER)

    # -- ending -----------------------------------------------------------------------

    def _end(self) -> Task:
        """Stops renewing and hands back the current version, unless the lease is lost."""
        with self._lock:
            if self._lost is None and not self._ended and self._pending is not None:
                if self._pending[0] == self._task.id:
                    # A renewal may have applied unseen: learn its outcome first, so that
                    # the end names the current version.
                    self._renew_once()
            if self._lost is not None:
                self._stop_renewing()
                raise LeaseLost(self._lost.reason, self._lost.errors)
            if self._ended:
                raise LeaseLost("ended")
            self._stop_renewing()
            return self._task

    def _stop_renewing(self) -> None:
        """Marks the lease ended, with the lock held, and wakes the renewer and any
        wait_confirmed (which then answers ``False`` unless the lease was confirmed)."""
        self._ended = True
        self._wake.set()
        self._settled.set()

    def finish(self, result: Any = None) -> None:
        """Ends the claim with success and an optional JSON result. Raises
        :class:`~rota.errors.LeaseLost` if the lease was lost or already ended, and
        :class:`~rota.errors.Refused` if the cluster refuses (e.g. the job was cancelled)."""
        task = self._end()
        self._client.finish(task.id, result)

    def finish_and_claim(self, result: Any = None, *, group: str, duration_ms: int, count: int = 1) -> List[Task]:
        """As :meth:`finish`, and in the same write claims up to ``count`` of ``group``'s
        next tasks for ``duration_ms`` (see :meth:`RotaClient.finish_and_claim`): the
        claimed versions, to be held in leases of their own."""
        task = self._end()
        return self._client.finish_and_claim(task.id, result, group=group, duration_ms=duration_ms, count=count)

    def fail(self, error: str = "", retry_in_ms: Optional[int] = None) -> Optional[Task]:
        """Ends the claim with an error: the task is retried after the group's back-off
        (or ``retry_in_ms``), or is dead after its last attempt. The retry's version, if
        any."""
        task = self._end()
        return self._client.fail(task.id, error, retry_in_ms)

    def release(self) -> Task:
        """Gives the task back, available now (a job's attempt is ``released``)."""
        task = self._end()
        return self._client.release(task)

    def abandon(self) -> None:
        """Stops renewing without telling the cluster: the lease lapses on its own."""
        with self._lock:
            self._stop_renewing()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional["TracebackType"],
    ) -> None:
        """Leaving the block ends a lease still held: a raised exception fails the task
        with its text (and propagates); a normal exit finishes it without a result
        (:class:`~rota.errors.LeaseLost` if it was lost meanwhile)."""
        if self._ended:
            return
        if exc is not None:
            if self._lost is None:
                try:
                    self.fail(error_text(exc))
                except RotaError:
                    pass
            else:
                self.abandon()
            return
        self.finish()

    def __repr__(self) -> str:
        state = "lost" if self.lost else ("ended" if self._ended else "held")
        return f"<Lease of task {self._task.id} in {self._task.group!r}: {state}, {self._renewals} renewals>"
