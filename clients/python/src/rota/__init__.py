"""Python client of Rota, a replicated task store.

* :class:`RotaClient`: every operation of the worker and job API; writes go to the
  leader and apply exactly once (one request id per write, reused on every retry).
* :class:`Lease`: a claimed task that renews itself in the background; its
  :attr:`~Lease.fence` (the current task id) goes downstream with every write.
* :class:`Worker` / :func:`worker`: the claim, run, finish loop with threads and a
  graceful stop.
* :class:`FencedTable` / :func:`fenced_write`: fenced writes to a SQL sink.
"""

from ._http import Cancel
from .client import RotaClient
from .errors import (
    Cancelled,
    Forgotten,
    LeaseLost,
    Misconfigured,
    NotFound,
    Refused,
    Rejected,
    RotaError,
    StaleFence,
    Unavailable,
)
from .fencing import FencedTable, fenced_write
from .lease import Lease, error_text
from .types import (
    Add,
    Attempt,
    Backoff,
    Change,
    GroupSettings,
    Job,
    JobPage,
    JobWait,
    Task,
    WatchEvent,
    WatchPage,
)
from .worker import FailTask, Worker, worker

__version__ = "0.1.0"

__all__ = [
    "Add",
    "Attempt",
    "Backoff",
    "Cancel",
    "Cancelled",
    "Change",
    "FailTask",
    "FencedTable",
    "Forgotten",
    "GroupSettings",
    "Job",
    "JobPage",
    "JobWait",
    "Lease",
    "LeaseLost",
    "Misconfigured",
    "NotFound",
    "Refused",
    "Rejected",
    "RotaClient",
    "RotaError",
    "StaleFence",
    "Task",
    "Unavailable",
    "WatchEvent",
    "WatchPage",
    "Worker",
    "error_text",
    "fenced_write",
    "worker",
]
