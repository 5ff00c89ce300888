"""The exceptions of the Rota client.

Every exception the client raises for a cluster's answer is a :class:`RotaError`:

* :class:`Refused`: the cluster processed the write and refused it (``{"errors": [...]}``);
  nothing changed. ``errors`` lists every reason the cluster gave.
* :class:`Rejected`: a node answered 4xx: the request itself is wrong, and sending it
  again cannot help.
* :class:`NotFound`: what a read names does not exist (404).
* :class:`Forgotten`: a watch asked for changes older than the node keeps (410).
* :class:`Unavailable`: no node gave a definite answer before the deadline. For a write
  it may or may not have applied: send it again with the same ``request_id`` (the
  exception carries it) and it applies at most once.
* :class:`Misconfigured`: a node cannot be talked to as the client is set up (its TLS
  certificate is not signed by the CA given, names another host, or the node speaks TLS
  to an ``http://`` URL or plain HTTP to an ``https://`` one); raised at once, since
  retrying cannot help. A subclass of :class:`Unavailable`.
* :class:`LeaseLost`: a lease is no longer held (a renewal was refused, it ran out, or
  it was already ended); a subclass of :class:`Refused`.
* :class:`StaleFence`: a fenced write downstream met a newer fence (see
  :mod:`rota.fencing`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence


class RotaError(Exception):
    """Base class of every error of this client."""


class Refused(RotaError):
    """The cluster processed the write and refused it; nothing changed."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors: List[str] = list(errors)
        super().__init__("refused by the cluster: " + "; ".join(self.errors))


class Rejected(RotaError):
    """A node rejected the request as malformed (4xx); sending it again cannot help."""

    def __init__(self, status: int, message: str, node: str = "") -> None:
        self.status = status
        self.message = message
        self.node = node
        where = f"{node} answered " if node else ""
        super().__init__(f"{where}{status}: {message}")


class NotFound(RotaError):
    """What the call names does not exist (404)."""

    def __init__(self, message: str, node: str = "") -> None:
        self.message = message
        self.node = node
        super().__init__(message)


class Forgotten(RotaError):
    """A watch asked for changes older than the node keeps (410): re-read the group and
    watch from ``revision``."""

    def __init__(self, message: str, revision: int, oldest: int) -> None:
        self.message = message
        self.revision = revision
        self.oldest = oldest
        super().__init__(message)


class Unavailable(RotaError):
    """No node gave a definite answer in time.

    For a write it may or may not have applied: send it again with the same request id
    (``request_id``) and the cluster applies it at most once.
    """

    def __init__(self, waited: float, request_id: Optional[str], last_error: str) -> None:
        self.waited = waited
        self.request_id = request_id
        self.last_error = last_error
        rid = f" (request id {request_id!r})" if request_id is not None else ""
        super().__init__(f"no definite answer after {waited:.1f} s{rid}: {last_error}")


class Misconfigured(Unavailable):
    """A node cannot be talked to as this client is set up, and retrying cannot help: a
    TLS handshake failed on its certificate (not signed by the CA given with ``ca=`` or
    ``ROTA_CA``, or issued for another name) or otherwise for good, or the node answered
    a plain-HTTP request in TLS (give it an ``https://`` URL and ``ca=``). Raised as soon
    as no node of the call answered and one failed this way, instead of retrying until
    ``give_up_after``. ``node`` is the node's address, ``message`` what failed and what
    to check.

    A subclass of :class:`Unavailable`, so that code catching that still catches it; no
    request reached the node, and a write sent again with the same ``request_id`` still
    applies at most once.
    """

    def __init__(self, waited: float, request_id: Optional[str], node: str, message: str) -> None:
        self.node = node
        self.message = message
        super().__init__(waited, request_id, message)
        # The cause and what to check, not "no definite answer after ...".
        self.args = (message,)

    def __str__(self) -> str:
        return self.message


class Cancelled(RotaError):
    """The call was cancelled by its caller (a worker that stops) before it ended."""


class LeaseLost(Refused):
    """The lease is not held any more.

    ``reason`` is ``"refused"`` (a renewal was refused: the task was cancelled, deleted,
    or claimed by another worker after the lease lapsed, or a node refused the client
    itself with a 401 or 403, its token revoked or lacking the right; ``errors`` has the
    cluster's reasons), ``"expired"`` (no renewal succeeded before the lease ran out) or
    ``"ended"`` (the lease was already finished, failed, released or abandoned).
    """

    def __init__(self, reason: str, errors: Sequence[str] = ()) -> None:
        self.reason = reason
        details = list(errors) or [_LOST_TEXT.get(reason, reason)]
        super().__init__([f"the lease was lost ({reason}): " + "; ".join(details)])
        # Keep the cluster's own reasons in ``errors``.
        self.errors = list(errors) or details


_LOST_TEXT = {
    "expired": "no renewal succeeded before the lease ran out",
    "ended": "the lease was already ended",
}


class StaleFence(RotaError):
    """A fenced write met a fence at least as new as its own: a newer holder of the task
    wrote there (or this holder's fence is out of date). Stop working on the task."""

    def __init__(self, key: object, fence: int, current: Optional[int]) -> None:
        self.key = key
        self.fence = fence
        self.current = current
        now = f"; the stored fence is {current}" if current is not None else ""
        super().__init__(
            f"stale fence {fence} for {key!r}{now}: a newer holder of the task wrote here; "
            "stop working on it"
        )
