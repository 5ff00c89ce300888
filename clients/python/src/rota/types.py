"""The API's JSON shapes as typed, immutable values.

Field names are the wire's (``openapi.json`` on every node): ``timespec`` is
milliseconds since the Unix epoch, every ``*_ms`` a number of milliseconds. Fields the
server adds later are ignored when read, so a newer server does not break this client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

JSON = Any
"""Any JSON value (``None``, ``bool``, ``int``, ``float``, ``str``, lists, dicts)."""

ON_CONFLICT = ("refuse", "keep", "resubmit")
JOB_STATES = ("waiting", "running", "failed", "succeeded", "dead", "cancelled")


def key_list(what: str, keys: Iterable[str]) -> List[str]:
    """``keys`` as a list of ``str``; a lone string is refused, since it would otherwise be
    taken for a list of one-character keys."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{what} is a list of keys, not one {type(keys).__name__}: write [{keys!r}]")
    out = list(keys)
    for key in out:
        if not isinstance(key, str):
            raise TypeError(f"{what}: a key is a str, not {type(key).__name__} ({key!r})")
    return out


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Task:
    """A task version as the API shows it. ``id`` is its identity and fencing token."""

    id: int
    group: str
    data: str
    timespec: int
    """Available time (for a claimed task: its lease end), ms since the epoch, log time."""
    ownerid: int
    key: Optional[str] = None
    """The job's key; only on tasks added with one."""
    priority: int = 0
    attempt: int = 0
    """The attempt this version belongs to; only on jobs that were claimed (else 0)."""

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Task":
        return cls(
            id=int(obj["id"]),
            group=str(obj.get("group", "")),
            data=str(obj.get("data") or ""),
            timespec=int(obj.get("timespec", 0)),
            ownerid=int(obj.get("ownerid", 0)),
            key=obj.get("key"),
            priority=int(obj.get("priority") or 0),
            attempt=int(obj.get("attempt") or 0),
        )

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "id": self.id,
            "group": self.group,
            "data": self.data,
            "timespec": self.timespec,
            "ownerid": self.ownerid,
        }
        if self.key is not None:
            out["key"] = self.key
        if self.priority:
            out["priority"] = self.priority
        if self.attempt:
            out["attempt"] = self.attempt
        return out


@dataclass(frozen=True)
class Add:
    """One entry of an update's ``adds``: a new task, or a job when ``key`` is given.

    ``timespec``: missing is now; negative is now + |t| ms; otherwise absolute ms.
    ``after``, ``max_attempts``, ``every_ms`` and ``on_conflict`` need a ``key``.
    """

    group: str
    data: str = ""
    key: Optional[str] = None
    timespec: Optional[int] = None
    priority: Optional[int] = None
    after: Optional[Sequence[str]] = None
    max_attempts: Optional[int] = None
    every_ms: Optional[int] = None
    on_conflict: Optional[str] = None
    """``"refuse"`` (default), ``"keep"`` or ``"resubmit"``."""

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"group": self.group, "data": self.data}
        if self.key is not None:
            out["key"] = self.key
        if self.timespec is not None:
            out["timespec"] = int(self.timespec)
        if self.priority is not None:
            out["priority"] = int(self.priority)
        if self.after:
            out["after"] = key_list("after", self.after)
        if self.max_attempts is not None:
            out["max_attempts"] = int(self.max_attempts)
        if self.every_ms is not None:
            out["every_ms"] = int(self.every_ms)
        if self.on_conflict is not None:
            out["on_conflict"] = self.on_conflict
        return out


@dataclass(frozen=True)
class Change:
    """One entry of an update's ``updates``: a new version of task ``id``.

    A missing ``data`` sets the payload empty; ``timespec`` as in :class:`Add` (a
    negative one, ``-lease_ms``, is a lease renewal by the owner; now or the past gives
    the task back).
    """

    id: int
    data: Optional[str] = None
    timespec: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"id": int(self.id)}
        if self.data is not None:
            out["data"] = self.data
        if self.timespec is not None:
            out["timespec"] = int(self.timespec)
        return out


AddLike = Union[Add, Mapping[str, Any]]
ChangeLike = Union[Change, Task, Mapping[str, Any]]


def add_json(add: AddLike) -> Dict[str, Any]:
    """The wire form of an add given as :class:`Add` or as a dict (sent as is)."""
    if isinstance(add, Add):
        return add.to_json()
    return dict(add)


def change_json(change: ChangeLike) -> Dict[str, Any]:
    """The wire form of an update entry: a :class:`Change`, a :class:`Task` (its id and
    data, available now) or a dict (sent as is)."""
    if isinstance(change, Change):
        return change.to_json()
    if isinstance(change, Task):
        return {"id": change.id, "data": change.data}
    return dict(change)


@dataclass(frozen=True)
class Attempt:
    """One claim of a job and how it ended."""

    run: int
    attempt: int
    owner: int
    started_at: int
    ended_at: Optional[int]
    outcome: str
    """``running``, ``succeeded``, ``failed``, ``lost``, ``released`` or ``cancelled``."""
    error: Optional[str] = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Attempt":
        return cls(
            run=int(obj.get("run", 0)),
            attempt=int(obj.get("attempt", 0)),
            owner=int(obj.get("owner", 0)),
            started_at=int(obj.get("started_at", 0)),
            ended_at=_opt_int(obj.get("ended_at")),
            outcome=str(obj.get("outcome", "")),
            error=obj.get("error"),
        )


@dataclass(frozen=True)
class Job:
    """A job's record, as ``GET /job`` answers it (docs/jobs.md)."""

    group: str
    key: str
    state: str
    """``waiting``, ``running``, ``failed``, ``succeeded``, ``dead`` or ``cancelled``."""
    task: Optional[int]
    available_at: Optional[int]
    data: Optional[str]
    priority: int
    max_attempts: Optional[int]
    every_ms: Optional[int]
    run: int
    attempts: int
    history: List[Attempt]
    result: JSON
    reason: Optional[str]
    created_at: int
    finished_at: Optional[int]
    expires_at: Optional[int]
    after: List[str]
    dependants: List[str]
    resubmitted: bool
    id: Optional[int] = None
    """The job's id: the task id its current run began with (what its add answered);
    :meth:`~rota.RotaClient.job_by_id` reads the record by it. ``None`` from servers
    before it was added, and for jobs last enqueued before snapshot format 6."""

    @property
    def finished(self) -> bool:
        """Whether the job has finished: succeeded, dead or cancelled."""
        return self.state in ("succeeded", "dead", "cancelled")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Job":
        return cls(
            group=str(obj.get("group", "")),
            key=str(obj.get("key", "")),
            state=str(obj.get("state", "")),
            task=_opt_int(obj.get("task")),
            available_at=_opt_int(obj.get("available_at")),
            data=obj.get("data"),
            priority=int(obj.get("priority") or 0),
            max_attempts=_opt_int(obj.get("max_attempts")),
            every_ms=_opt_int(obj.get("every_ms")),
            run=int(obj.get("run") or 0),
            attempts=int(obj.get("attempts") or 0),
            history=[Attempt.from_json(a) for a in obj.get("history") or []],
            result=obj.get("result"),
            reason=obj.get("reason"),
            created_at=int(obj.get("created_at") or 0),
            finished_at=_opt_int(obj.get("finished_at")),
            expires_at=_opt_int(obj.get("expires_at")),
            after=[str(k) for k in obj.get("after") or []],
            dependants=[str(k) for k in obj.get("dependants") or []],
            resubmitted=bool(obj.get("resubmitted", False)),
            id=_opt_int(obj.get("id")),
        )


@dataclass(frozen=True)
class JobPage:
    """A page of job records in key order; pass ``next`` as ``after`` for the next page
    (``None`` on the last page)."""

    jobs: List[Job]
    next: Optional[str]


@dataclass(frozen=True)
class JobWait:
    """The answer of ``GET /jobs/wait``: the named jobs' records once all have finished,
    or as they were at the deadline."""

    finished: bool
    jobs: List[Job]
    missing: List[str]
    """Named keys with no record (never added, or past the retention)."""


@dataclass(frozen=True)
class Backoff:
    """Retry back-off: ``base_ms * factor^(attempt-1)``, at most ``max_ms``, jittered."""

    base_ms: int
    factor: float
    max_ms: int

    def to_json(self) -> Dict[str, Any]:
        return {"base_ms": int(self.base_ms), "factor": self.factor, "max_ms": int(self.max_ms)}


@dataclass(frozen=True)
class GroupSettings:
    """A group's settings (``running`` is always 0 in the answer of a change)."""

    group: str
    max_running: int
    paused: bool
    max_attempts: int
    backoff: Backoff
    retention_ms: int
    running: int

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "GroupSettings":
        b = obj.get("backoff") or {}
        return cls(
            group=str(obj.get("group", "")),
            max_running=int(obj.get("max_running") or 0),
            paused=bool(obj.get("paused", False)),
            max_attempts=int(obj.get("max_attempts") or 0),
            backoff=Backoff(int(b.get("base_ms", 0)), float(b.get("factor", 1.0)), int(b.get("max_ms", 0))),
            retention_ms=int(obj.get("retention_ms") or 0),
            running=int(obj.get("running") or 0),
        )


@dataclass(frozen=True)
class WatchEvent:
    """One change to a group. ``kind`` says which fields are set: ``task`` (a version
    written: ``task``), ``removed`` (a version removed: ``id``), ``job`` (a record
    changed: ``job``), ``job_dropped`` (a record dropped: ``key``) or ``settings``."""

    kind: str
    revision: int
    task: Optional[Task] = None
    id: Optional[int] = None
    job: Optional[Job] = None
    key: Optional[str] = None
    settings: Optional[GroupSettings] = None
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "WatchEvent":
        return cls(
            kind=str(obj.get("kind", "")),
            revision=int(obj.get("revision", 0)),
            task=Task.from_json(obj["task"]) if obj.get("task") is not None else None,
            id=_opt_int(obj.get("id")),
            job=Job.from_json(obj["job"]) if obj.get("job") is not None else None,
            key=obj.get("key"),
            settings=GroupSettings.from_json(obj["settings"]) if obj.get("settings") is not None else None,
            raw=dict(obj),
        )


@dataclass(frozen=True)
class WatchPage:
    """A group's changes after the asked revision; ask from ``revision`` next."""

    node: int
    group: str
    revision: int
    changes: List[WatchEvent]

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "WatchPage":
        return cls(
            node=int(obj.get("node", 0)),
            group=str(obj.get("group", "")),
            revision=int(obj.get("revision", 0)),
            changes=[WatchEvent.from_json(c) for c in obj.get("changes") or []],
        )
