"""``RotaClient``: the typed, thread-safe client of Rota's worker and job API.

Every write goes to the leader when it is known (learned from ``GET /cluster``, with the
members the client was not given), else to the nodes in turn, under one request id until its answer is definite, so a write applies
exactly once however often it is retried. Reads and waits go to any node (the leader
first when known). A definite answer is the write's outcome (its tasks, or the cluster's
refusal: :class:`~rota.errors.Refused`) or a 4xx (:class:`~rota.errors.Rejected`);
anything else (no connection, a timeout, a dropped connection, a 5xx, a body that does
not parse) is retried on the next node after a short pause, until ``give_up_after``
seconds have passed (:class:`~rota.errors.Unavailable`). A node that cannot be talked to
as the client is set up (a TLS certificate the client does not accept, TLS on one side
only) is no reason to wait: when no node of a round answered and one failed so, the call
raises :class:`~rota.errors.Misconfigured` at once.

Durations on the wire are milliseconds and keep their ``_ms`` names here; the client's
own transport settings (``call_timeout``, ``give_up_after``) are seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import ssl
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)
from urllib.parse import quote

from ._http import Cancel, CancelledError, Node, Pool, Response, SetupError, TransportError, check_token, split_status
from .errors import Cancelled, Forgotten, Misconfigured, NotFound, Refused, Rejected, Unavailable
from .types import (
    Add,
    AddLike,
    Backoff,
    ChangeLike,
    GroupSettings,
    Job,
    JobPage,
    JobWait,
    Task,
    WatchPage,
    add_json,
    change_json,
    key_list,
)

if TYPE_CHECKING:  # pragma: no cover
    from .lease import Lease
    from .worker import Handler, Worker

CALL_TIMEOUT = 3.0
"""Deadline of one call in seconds (a waiting call gets its wait on top): a call that
takes seconds met a frozen or cut-off node, and the next one should be tried."""

GIVE_UP_AFTER = 30.0
"""How long a call is retried, in seconds, before the client gives up on a definite answer."""

RETRY_PAUSE = 0.1
"""Pause between two attempts, so that a cluster electing a leader is not flooded."""

WAIT_MS_MAX = 60_000
"""Longest wait a request may ask for (``wait_ms``)."""

CLAIM_COUNT_MAX = 1_000
"""Most tasks one claim may take (:meth:`RotaClient.claim_many`)."""

RELAY_RECHECK_EVERY = 10.0
"""How often (seconds) a client that calls through a relay, because the leader did not
answer it, looks again whether the leader does."""

REDISCOVER_PAUSE = 1.0
"""Least time between two looks for the leader while none is known."""

LEADER_LOOKUP_TIMEOUT = 1.0
"""Longest wait (seconds) for one node's ``GET /cluster`` when looking for the leader:
any node answers it from memory, so one that takes longer is paused or overloaded."""

WAIT_PROBE_EVERY = 2.0
"""While a blocking call waits at a node, how often (seconds) the client checks, with a
``GET /cluster`` of at most ``LEADER_LOOKUP_TIMEOUT``, that the node still answers: a node
that froze would otherwise hold the call for its whole wait while a new leader elsewhere
has work. A call that returns sooner checks nothing."""

NODES_KNOWN_MAX = 64
"""Most nodes a client keeps, given and learned."""

SLOW_DOWN_MAX = 10.0
"""Longest pause, in seconds, that a 429's ``Retry-After`` can impose before the same node
is asked again (a longer one is cut to this)."""

_SLOW_DOWN_DEFAULT = 1.0

NEXT_RETRY_AFTER = 60.0
"""Seconds a client that found a finish with ``next`` not taken sends finish and claim
apart before it tries ``next`` again (a rolling upgrade may have completed)."""

NEXT_NOT_READ_BY_ALL = "cannot log a finish with `next`"
"""What a leader's 409 says when it cannot log a finish with ``next`` yet."""


def next_not_taken(status: int, message: str) -> bool:
    """Whether a node's answer says the cluster takes no finish with ``next`` yet: the
    leader's 409, or the 400 of a node whose build predates ``next``. Nothing was
    written; send the finish without ``next``, then a claim."""
    if status == 409:
        return NEXT_NOT_READ_BY_ALL in message
    if status == 400:
        return "unknown field `next`" in message
    return False


WAIT_QUERY_BYTES_MAX = 8 * 1024
"""Longest ``GET /jobs/wait`` path and query sent (proxies in front of nodes often take
no longer a request line: nginx's default); a longer one goes as ``POST /jobs/wait`` with
its parameters in a JSON body."""

TASK_IDS_MAX = 10_000
"""Most task ids in one :meth:`RotaClient.tasks` (a node's limit for one read)."""

TASKS_PATH_BYTES_MAX = WAIT_QUERY_BYTES_MAX
"""Longest ``GET /tasks/...`` path sent, for the same reason: more ids are read in
several requests."""

WAIT_QUERY_BYTES_MAX_HTTP1 = 60 * 1024
"""Longest ``GET /jobs/wait`` path and query a node takes (a request line of up to 64
KiB): what is sent to a build before the POST, which answers it 405."""

_MIN_TIMEOUT = 0.05
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1

T = TypeVar("T")
TaskRef = Union[int, Task]
# What one attempt came to: (True, value) is definite; (False, why) is worth a retry.
_Interpret = Callable[[Node, Response], Tuple[bool, Any]]


def _task_id(task: TaskRef) -> int:
    return task.id if isinstance(task, Task) else int(task)


def _wait_ms(wait_ms: Optional[float]) -> int:
    if not wait_ms or wait_ms < 0:
        return 0
    return min(int(wait_ms), WAIT_MS_MAX)


def _query(**params: Any) -> str:
    parts = []
    for name, value in params.items():
        if value is None:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, bool):
                v = "1" if v else "0"
            parts.append(f"{name}={quote(str(v), safe='')}")
    return ("?" + "&".join(parts)) if parts else ""


# A 408 (the body came too slowly) or 429 (too many requests): the node did not take the
# request, so sending it again is safe, as after a 5xx.
_NOT_TAKEN = (408, 429)


def _slow_down_pause(response: Response) -> Optional[float]:
    """For a 429, how long the node asks the client to wait before it asks again: its
    ``Retry-After`` in seconds (a date or nonsense counts as 1 s), at most
    :data:`SLOW_DOWN_MAX`. ``None`` for any other status: another node may answer."""
    if response.status != 429:
        return None
    text = response.headers.get("retry-after", "").strip()
    seconds = float(int(text)) if text.isdigit() else _SLOW_DOWN_DEFAULT
    return min(seconds, SLOW_DOWN_MAX)


# Made once: ``json.dumps`` with options and ``json.loads`` of bytes each cost a few
# microseconds more per call, on every request.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))
_JSON_DECODER = json.JSONDecoder()


def _json_of(body: bytes) -> Any:
    """The JSON document in an answer's body (UTF-8, as every node sends; a byte-order
    mark, which a proxy may add, is skipped); a ``ValueError`` if it is not one."""
    return _JSON_DECODER.decode(body.decode("utf-8-sig"))


def _write_answer(node: Node, response: Response) -> Tuple[bool, Any]:
    """A write's answer: its tasks, a refusal or a rejection (definite), or a retry."""
    status = response.status
    if status in _NOT_TAKEN:
        return False, "status {}: {}".format(*split_status(response))
    if 400 <= status < 500:
        raise Rejected(*split_status(response), node=node.addr)
    if not 200 <= status < 300:
        return False, "status {}: {}".format(*split_status(response))
    try:
        obj = _json_of(response.body)
    except ValueError as e:
        return False, f"bad body: {e}"
    if isinstance(obj, dict):
        if isinstance(obj.get("tasks"), list):
            return True, [Task.from_json(t) for t in obj["tasks"]]
        if isinstance(obj.get("errors"), list):
            raise Refused([str(e) for e in obj["errors"]])
    return False, "an answer with neither tasks nor errors"


def _object_answer(node: Node, response: Response) -> Tuple[bool, Any]:
    """An answer that is a JSON document on 2xx (reads, settings changes)."""
    status = response.status
    if 200 <= status < 300:
        try:
            return True, _json_of(response.body)
        except ValueError as e:
            return False, f"bad body: {e}"
    if status == 404:
        raise NotFound(split_status(response)[1], node=node.addr)
    if status == 410:
        try:
            gone = json.loads(response.body)
            raise Forgotten(str(gone["error"]), int(gone["revision"]), int(gone["oldest"]))
        except (ValueError, KeyError, TypeError) as e:
            return False, f"a 410 without its revisions: {e}"
    if 400 <= status < 500 and status not in _NOT_TAKEN:
        raise Rejected(*split_status(response), node=node.addr)
    return False, "status {}: {}".format(*split_status(response))


class RotaClient:
    """A client of the Rota nodes at ``urls`` that writes as client ``client_id``.

    ``urls``: node addresses (``host:port``, ``http://host:port``), a list or one
    comma-separated string; give every node of the cluster, so that the client can go
    on when some are down (it also learns the other members from any node that answers). ``client_id``: the owner of every task this client writes
    (a signed 64-bit integer); ``None`` picks a random one, unique in practice.
    ``token``: the bearer token sent with every request (a node with ``--auth=tokens``
    needs one); ``None`` reads ``ROTA_TOKEN`` from the environment, if set. ``ca``: the
    path of the cluster's CA certificate (PEM): every node is then dialled over TLS and
    must present a certificate it signed; ``None`` reads ``ROTA_CA``, if set (``https://``
    URLs without a CA use the system's trust store).

    One client may be shared by any number of threads: connections are pooled per node
    and kept alive.
    """

    def __init__(
        self,
        urls: Union[str, Iterable[str]],
        client_id: Optional[int] = None,
        *,
        call_timeout: float = CALL_TIMEOUT,
        give_up_after: float = GIVE_UP_AFTER,
        retry_pause: float = RETRY_PAUSE,
        token: Optional[str] = None,
        ca: Optional[str] = None,
    ) -> None:
        if ca is None:
            ca = os.environ.get("ROTA_CA") or None
        tls = ssl.create_default_context(cafile=ca) if ca is not None else None
        if token is None:
            token = os.environ.get("ROTA_TOKEN") or None
        if token is not None:
            token = check_token(token)
        if isinstance(urls, str):
            urls = urls.split(",")
        nodes: List[Node] = []
        for url in urls:
            if url.strip():
                node = Node.parse(url)
                if all(n.addr != node.addr for n in nodes):
                    nodes.append(node)
        if not nodes:
            raise ValueError("give at least one node address")
        if client_id is None:
            client_id = secrets.randbits(62) + 1
        if isinstance(client_id, bool) or not isinstance(client_id, int):
            raise TypeError(f"client_id must be an int, not {type(client_id).__name__}")
        if not _I64_MIN <= client_id <= _I64_MAX:
            raise ValueError(f"client_id {client_id} is not a signed 64-bit integer")
        self._given = list(nodes)
        self._nodes = nodes
        self._client_id = client_id
        self.call_timeout = float(call_timeout)
        self.give_up_after = float(give_up_after)
        self.retry_pause = float(retry_pause)
        self._pool = Pool(token=token, tls=tls, ca=ca)
        # Unique across processes and restarts, so that no two clients' request ids meet.
        self._id_prefix = f"c{client_id}-{secrets.token_hex(8)}"
        self._sent = itertools.count()
        self._sent_lock = threading.Lock()
        self._preferred = 0
        self._preferred_lock = threading.Lock()
        # Whether to look for the leader before the next call: before the first one, and
        # after a failed attempt (leadership may have moved).
        self._discover_needed = True
        self._next_discovery = 0.0
        # A node a call left for another that answered, and when (monotonic) to look at
        # it again: named leader by a lookup, it is preferred only once it answers this
        # client itself, so that a client cut off from the leader alone calls through a
        # relay, and looks again every RELAY_RECHECK_EVERY seconds.
        self._doubted: Optional[Tuple[str, float]] = None
        self._discover_lock = threading.Lock()
        self._retries = 0
        # Before this monotonic time, finish_and_claim sends its two parts apart.
        self._next_retry_at = 0.0
        # When each node last answered a waiting call's probe (monotonic), by address.
        self._heard: Dict[str, float] = {}
        self._heard_lock = threading.Lock()

    # -- identity -----------------------------------------------------------------

    @property
    def client_id(self) -> int:
        """The client id this client writes as."""
        return self._client_id

    @property
    def urls(self) -> List[str]:
        """The nodes' addresses (``host:port``), in the order given."""
        return [n.addr for n in self._given]

    @property
    def known_urls(self) -> List[str]:
        """Every node this client may call now: those given, then the other members it
        learned of from ``GET /cluster``."""
        with self._preferred_lock:
            return [n.addr for n in self._nodes]

    @property
    def preferred(self) -> str:
        """The node tried first: the leader once it is known."""
        with self._preferred_lock:
            return self._nodes[self._preferred].addr

    @property
    def retries(self) -> int:
        """Attempts that got no definite answer and were retried (connection failures,
        timeouts, 5xx answers), over the client's life."""
        return self._retries

    def next_request_id(self) -> str:
        """A request id no other write of any client will use (at most 64 bytes)."""
        with self._sent_lock:
            n = next(self._sent)
        return f"{self._id_prefix}-{n}"

    def close(self) -> None:
        """Closes the pooled connections (the client stays usable)."""
        self._pool.close()

    def __enter__(self) -> "RotaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RotaClient({self.urls!r}, client_id={self._client_id})"

    # -- node choice ----------------------------------------------------------------

    def _order(self) -> List[Node]:
        with self._preferred_lock:
            first, nodes = self._preferred, self._nodes
        n = len(nodes)
        return [nodes[(first + i) % n] for i in range(n)]

    def _prefer(self, addr: str) -> None:
        with self._preferred_lock:
            for i, node in enumerate(self._nodes):
                if node.addr == addr:
                    self._preferred = i
                    return

    def _member(self, api_addr: object) -> Optional[Node]:
        """A member named by ``GET /cluster``, dialled as the given nodes are (TLS if any
        of them is)."""
        https = any(n.https for n in self._given)
        try:
            return Node.parse(("https://" if https else "") + str(api_addr))
        except ValueError:
            return None

    def _learn(self, status: Dict[str, Any]) -> None:
        """Keeps the given nodes, then the members of ``status`` not among them (a
        removed member is forgotten); the preferred node stays first."""
        members = [
            self._member(m["api_addr"])
            for m in status.get("nodes") or []
            if isinstance(m, dict) and isinstance(m.get("api_addr"), str) and m["api_addr"].strip()
        ]
        with self._preferred_lock:
            preferred = self._nodes[self._preferred].addr
            nodes = list(self._given)
            for node in members:
                if node is not None and len(nodes) < NODES_KNOWN_MAX and all(n.addr != node.addr for n in nodes):
                    nodes.append(node)
            self._nodes = nodes
            self._preferred = next((i for i, n in enumerate(nodes) if n.addr == preferred), 0)

    def _cluster_status(self, node: Node) -> Optional[Dict[str, Any]]:
        try:
            timeout = min(self.call_timeout, LEADER_LOOKUP_TIMEOUT)
            response = self._pool.request(node, "GET", "/cluster", None, timeout)
            status = json.loads(response.body) if response.status == 200 else None
        except (TransportError, ValueError):
            return None
        return status if isinstance(status, dict) else None

    def _still_answers(self, node: Node) -> bool:
        """Whether ``node`` answered a ``GET /cluster`` within ``WAIT_PROBE_EVERY``: this
        call's, or one another waiting call of this client made meanwhile, so that many
        calls waiting at one node cost one probe. Any HTTP answer counts (a 429, 401 or
        503 comes from a node that is not frozen); only no answer in time is silence."""
        now = time.monotonic()
        with self._heard_lock:
            if now - self._heard.get(node.addr, -WAIT_PROBE_EVERY) < WAIT_PROBE_EVERY:
                return True
        try:
            timeout = min(self.call_timeout, LEADER_LOOKUP_TIMEOUT)
            self._pool.request(node, "GET", "/cluster", None, timeout)
        except TransportError:
            return False
        with self._heard_lock:
            self._heard[node.addr] = time.monotonic()
        return True

    def _look_for_leader(self, doubted: Optional[str] = None) -> Tuple[Optional[str], bool]:
        """Asks the nodes who leads, learning the members this client was not given;
        (the leader's address if it answers, whether any node knew a leader). A learned
        member is preferred only once it has answered itself: the address a node
        advertises may not be reachable from here; so is a leader at ``doubted`` (a node
        that just failed a call), even if it was given."""
        known = False
        # Learned leaders that did not answer this lookup: each costs a lookup timeout,
        # so one that every node names is asked once, not once per node.
        silent: List[str] = []
        for node in self._order():
            if node.addr in silent:
                continue
            status = self._cluster_status(node)
            if status is None:
                continue
            self._learn(status)
            if status.get("leader") is None:
                continue
            known = True
            leader = next(
                (m for m in status.get("nodes") or [] if isinstance(m, dict) and m.get("id") == status["leader"]),
                None,
            )
            addr = leader.get("api_addr") if leader is not None else None
            found = self._member(addr) if isinstance(addr, str) and addr.strip() else None
            if found is None:
                continue
            trusted = found.addr != doubted and any(n.addr == found.addr for n in self._given)
            if found.addr == node.addr or trusted:
                self._prefer(found.addr)
                return found.addr, True
            if found.addr in silent:
                continue
            if self._cluster_status(found) is not None:
                self._prefer(found.addr)
                return found.addr, True
            silent.append(found.addr)
        return None, known

    def find_leader(self) -> Optional[str]:
        """Asks the nodes who leads and sends calls there first from now on; the leader's
        address, if one is known and answers. Members the client was not given are
        learned on the way, so that it outlives the nodes it was given."""
        leader, known = self._look_for_leader()
        if known:
            self._discover_needed = False
        return leader

    def _discovery_due(self) -> bool:
        now = time.monotonic()
        doubted = self._doubted
        return (self._discover_needed and now >= self._next_discovery) or (doubted is not None and now >= doubted[1])

    def _maybe_discover(self) -> None:
        if not self._discovery_due():
            return
        if not self._discover_lock.acquire(blocking=False):
            return  # another thread is looking
        try:
            if self._discovery_due():
                doubted = self._doubted[0] if self._doubted is not None else None
                leader, known = self._look_for_leader(doubted)
                # No leader that answers: keep calling through the relay, and look again.
                self._doubted = (doubted, time.monotonic() + RELAY_RECHECK_EVERY) if leader is None and doubted else None
                if known:
                    self._discover_needed = False
                else:
                    self._next_discovery = time.monotonic() + REDISCOVER_PAUSE
        finally:
            self._discover_lock.release()

    # -- the retry loop -------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]],
        interpret: _Interpret,
        *,
        wait_s: float = 0.0,
        request_id: Optional[str] = None,
        deadline: Optional[float] = None,
        cancel: Optional[Cancel] = None,
    ) -> Any:
        """Sends the request to the nodes in turn (the preferred one first) until one
        gives a definite answer or the deadline (default: ``give_up_after`` plus the
        wait, from now; a ``time.monotonic()`` value) passes. A node that answers 429
        is asked again after its ``Retry-After``, rather than the next node. A round of
        the nodes in which none answered and one cannot be talked to as this client is set
        up (a ``SetupError``: TLS) raises :class:`~rota.errors.Misconfigured` at once:
        waiting cannot fix it, and one node set up wrong among others that answer does not
        stop the call."""
        self._maybe_discover()
        payload = None if body is None else _JSON_ENCODER.encode(body).encode()
        started = time.monotonic()
        limit = deadline if deadline is not None else started + self.give_up_after + wait_s
        last_error = "no node answered"
        first_round = True
        while True:
            order, at = self._order(), 0
            # This round's first node that cannot be talked to as the client is set up,
            # and whether any node answered (then the round's failures may pass).
            setup_error: Optional[SetupError] = None
            answered = False
            while at < len(order):
                node = order[at]
                if cancel is not None and cancel.cancelled:
                    raise Cancelled(f"{method} {path} was cancelled")
                timeout = min(self.call_timeout + wait_s, max(limit - time.monotonic(), _MIN_TIMEOUT))
                pause, slowed = self.retry_pause, False
                try:
                    if wait_s > 0:
                        response = self._waiting_request(node, method, path, payload, timeout, cancel)
                    else:
                        response = self._pool.request(node, method, path, payload, timeout, cancel)
                except CancelledError:
                    raise Cancelled(f"{method} {path} was cancelled") from None
                except SetupError as e:
                    last_error = str(e)
                    if setup_error is None:
                        setup_error = e
                    at += 1
                    pause = 0.0  # on to the next node at once: this one will not change
                except TransportError as e:
                    last_error = str(e)
                    at += 1
                else:
                    answered = True
                    done, value = interpret(node, response)
                    if done:
                        # The first node of the order is the preferred one already.
                        if first_round and at:
                            self._prefer(node.addr)
                            self._doubted = (order[0].addr, time.monotonic())
                        return value
                    last_error = f"{node.addr}: {value}"
                    slow_down = _slow_down_pause(response)
                    if slow_down is None:
                        at += 1
                    else:
                        # A 429: the node is up and asks for fewer requests. Another node
                        # would relay to the same leader, so ask this one again after the
                        # pause it asked for (cut short at the deadline, for a last try).
                        pause, slowed = max(slow_down, self.retry_pause), True
                if not slowed:
                    self._discover_needed = True
                with self._sent_lock:
                    self._retries += 1
                now = time.monotonic()
                if setup_error is not None and not answered and (at >= len(order) or now >= limit):
                    raise Misconfigured(now - started, request_id, setup_error.node, str(setup_error)) from setup_error
                if now >= limit:
                    raise Unavailable(now - started, request_id, last_error)
                pause = min(pause, limit - now)
                if cancel is not None:
                    if cancel.wait(pause):
                        raise Cancelled(f"{method} {path} was cancelled")
                else:
                    time.sleep(pause)
            first_round = False
            # Leadership may have moved: ask before the next round.
            self.find_leader()

    def _waiting_request(
        self,
        node: Node,
        method: str,
        path: str,
        payload: Optional[bytes],
        timeout: float,
        cancel: Optional[Cancel],
    ) -> Response:
        """A call that may wait at ``node``, cut short (a ``TransportError``) if the node
        stops answering ``GET /cluster`` meanwhile (see ``WAIT_PROBE_EVERY``), or by
        ``cancel``. Under its request id elsewhere, a waiting claim is safe to send again."""
        exchange = Cancel() if cancel is None else cancel.child()
        done = threading.Event()
        silent = threading.Event()

        def watch() -> None:
            while not done.wait(WAIT_PROBE_EVERY):
                if not self._still_answers(node):
                    if not done.is_set():
                        silent.set()
                        exchange.cancel()
                    return

        watcher = threading.Thread(target=watch, name=f"rota-wait-probe-{node.addr}", daemon=True)
        watcher.start()
        try:
            return self._pool.request(node, method, path, payload, timeout, exchange)
        except CancelledError:
            if silent.is_set():
                raise TransportError(f"{node.addr} stopped answering while the call waited there") from None
            raise
        finally:
            done.set()
            if cancel is not None:
                cancel.forget(exchange)

    def write(
        self,
        path: str,
        body: Mapping[str, Any],
        request_id: Optional[str] = None,
        *,
        deadline: Optional[float] = None,
        cancel: Optional[Cancel] = None,
    ) -> List[Task]:
        """POSTs the write ``body`` to ``path`` (``/update``, ``/claim``, ``/finish``,
        ``/fail``, ``/cancel``, ``/retry``) under ``request_id`` (default: a fresh one)
        until its answer is definite, and answers the task versions it wrote.

        The same request id always gets the first outcome, so a write retried this way
        (also by the caller, after :class:`~rota.errors.Unavailable`, with the id the
        exception carries) applies once.
        """
        rid = request_id if request_id is not None else self.next_request_id()
        request = dict(body)
        request["requestid"] = rid
        wait_s = _wait_ms(request.get("wait_ms")) / 1000.0 if path == "/claim" else 0.0
        tasks: List[Task] = self._call(
            "POST", path, request, _write_answer,
            wait_s=wait_s, request_id=rid, deadline=deadline, cancel=cancel,
        )
        return tasks

    def _read(self, path: str, wait_ms: int = 0) -> Any:
        return self._call("GET", path, None, _object_answer, wait_s=wait_ms / 1000.0)

    @staticmethod
    def _first(tasks: List[Task], what: str) -> Task:
        if not tasks:
            raise Refused([f"the cluster answered no task for {what}"])
        return tasks[0]

    # -- writes ---------------------------------------------------------------------

    def update(
        self,
        adds: Sequence[AddLike] = (),
        updates: Sequence[ChangeLike] = (),
        deletes: Sequence[TaskRef] = (),
        depends: Sequence[TaskRef] = (),
        *,
        request_id: Optional[str] = None,
    ) -> List[Task]:
        """One all-or-nothing transaction: adds, updates (new versions of tasks this
        client owns, or available ones), deletes, and tasks that must exist. Answers the
        written tasks, adds first, in request order; :class:`~rota.errors.Refused` with
        every reason if any part is refused (then nothing changed). At most 10 000 items
        (adds, updates, deletes, depends and ``after`` keys) in one update."""
        body: Dict[str, Any] = {"clientid": self._client_id}
        if adds:
            body["adds"] = [add_json(a) for a in adds]
        if updates:
            body["updates"] = [change_json(u) for u in updates]
        if deletes:
            body["deletes"] = [_task_id(d) for d in deletes]
        if depends:
            body["depends"] = [_task_id(d) for d in depends]
        return self.write("/update", body, request_id)

    def add(
        self,
        group: str,
        data: str = "",
        *,
        key: Optional[str] = None,
        timespec: Optional[int] = None,
        priority: Optional[int] = None,
        after: Optional[Sequence[str]] = None,
        max_attempts: Optional[int] = None,
        every_ms: Optional[int] = None,
        on_conflict: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> Task:
        """Adds a task with ``data`` to ``group``, available now (or at ``timespec``); with
        a ``key`` it is a job (see :class:`~rota.types.Add` for the other fields). With
        ``on_conflict="keep"`` or ``"resubmit"`` the answer may be the live task."""
        add = Add(
            group=group, data=data, key=key, timespec=timespec, priority=priority,
            after=after, max_attempts=max_attempts, every_ms=every_ms, on_conflict=on_conflict,
        )
        return self._first(self.update(adds=[add], request_id=request_id), "an add")

    def add_many(self, adds: Sequence[AddLike], *, request_id: Optional[str] = None) -> List[Task]:
        """Adds several tasks in one transaction (all or none)."""
        return self.update(adds=adds, request_id=request_id)

    def claim(
        self,
        group: str,
        duration_ms: int = 30_000,
        *,
        wait_ms: int = 0,
        depends: Sequence[TaskRef] = (),
        request_id: Optional[str] = None,
        cancel: Optional[Cancel] = None,
    ) -> Optional[Task]:
        """Claims ``group``'s next available task for ``duration_ms``; ``None`` if there is
        none. With ``wait_ms`` (at most 60 000) the claim waits on the leader for a task
        when none is available; waiting writes nothing to the log. The claimed version's
        id is the fence: pass it downstream."""
        body = self._claim_body(group, duration_ms, wait_ms, depends)
        tasks = self.write("/claim", body, request_id, cancel=cancel)
        return tasks[0] if tasks else None

    def _claim_body(
        self, group: str, duration_ms: int, wait_ms: int, depends: Sequence[TaskRef]
    ) -> Dict[str, Any]:
        """The body of a claim by this client (``/claim``), without a count."""
        body: Dict[str, Any] = {"clientid": self._client_id, "group": group, "duration": int(duration_ms)}
        wait = _wait_ms(wait_ms)
        if wait:
            body["wait_ms"] = wait
        if depends:
            body["depends"] = [_task_id(d) for d in depends]
        return body

    def claim_many(
        self,
        group: str,
        count: int,
        duration_ms: int = 30_000,
        *,
        wait_ms: int = 0,
        depends: Sequence[TaskRef] = (),
        request_id: Optional[str] = None,
        cancel: Optional[Cancel] = None,
    ) -> List[Task]:
        """Claims up to ``count`` (1 to 1 000) of ``group``'s available tasks in one
        request, in the order successive claims would take them; fewer when fewer are
        available (or their data passes 4 MiB), empty when none came within ``wait_ms``.
        Each claimed task is its own version, with its own fence."""
        if not 1 <= int(count) <= CLAIM_COUNT_MAX:
            raise ValueError(f"count {count} is not between 1 and {CLAIM_COUNT_MAX}")
        body = self._claim_body(group, duration_ms, wait_ms, depends)
        body["count"] = int(count)
        return self.write("/claim", body, request_id, cancel=cancel)

    def claim_lease(
        self,
        group: str,
        duration_ms: int = 30_000,
        *,
        wait_ms: int = 0,
        request_id: Optional[str] = None,
        cancel: Optional[Cancel] = None,
        first_sent: Optional[float] = None,
    ) -> Optional["Lease"]:
        """As :meth:`claim`, and holds the task in a :class:`~rota.lease.Lease` that
        renews itself at about a third of ``duration_ms``; ``None`` if no task came.
        When ``request_id`` retries a claim without a definite answer, ``first_sent`` is
        the ``time.monotonic()`` of its first send: the lease is reckoned from then,
        since the claim may have applied at once (default: now)."""
        from .lease import Lease

        sent = time.monotonic() if first_sent is None else first_sent
        task = self.claim(group, duration_ms, wait_ms=wait_ms, request_id=request_id, cancel=cancel)
        if task is None:
            return None
        return Lease(self, task, duration_ms, claimed_at=sent)

    def renew(
        self,
        task: Task,
        duration_ms: int,
        *,
        request_id: Optional[str] = None,
        deadline: Optional[float] = None,
    ) -> Task:
        """Renews an owned task for ``duration_ms`` from now, keeping its data; answers the
        new version, whose id is the fence from now on."""
        change = {"id": task.id, "data": task.data, "timespec": -int(duration_ms)}
        body = {"clientid": self._client_id, "updates": [change]}
        return self._first(self.write("/update", body, request_id, deadline=deadline), "a renewal")

    def release(self, task: Task, *, request_id: Optional[str] = None) -> Task:
        """Gives a claimed task back: a new version, available now, same data (for a job,
        the attempt is ``released``)."""
        body = {"clientid": self._client_id, "updates": [{"id": task.id, "data": task.data}]}
        return self._first(self.write("/update", body, request_id), "a release")

    def delete(self, task: TaskRef, *, request_id: Optional[str] = None) -> None:
        """Deletes a task version (owned by this client, or available)."""
        self.update(deletes=[task], request_id=request_id)

    def finish(self, task: TaskRef, result: Any = None, *, request_id: Optional[str] = None) -> None:
        """Ends the claim of a task version with success and an optional JSON result
        (kept in the job's record, at most 256 KiB). Refused if the id is stale."""
        body: Dict[str, Any] = {"clientid": self._client_id, "id": _task_id(task)}
        if result is not None:
            body["result"] = result
        self.write("/finish", body, request_id)

    def finish_and_claim(
        self,
        task: TaskRef,
        result: Any = None,
        *,
        group: str,
        duration_ms: int = 30_000,
        count: int = 1,
        request_id: Optional[str] = None,
    ) -> List[Task]:
        """Ends the claim of a task version with success and, in the same write (one
        commit), claims up to ``count`` of ``group``'s next tasks for ``duration_ms``: a
        worker's cycle in one request. The claimed versions; empty when none is claimable
        (this claim never waits: follow with a blocking :meth:`claim`). A refusal
        (``Refused``) means neither part applied.

        A cluster that takes no finish with ``next`` yet (a rolling upgrade: an older
        node, or a leader that has not heard from every member) gets the finish and then
        a claim, two writes; the client remembers that for :data:`NEXT_RETRY_AFTER`
        seconds before it asks with ``next`` again."""
        if not 1 <= int(count) <= CLAIM_COUNT_MAX:
            raise ValueError(f"count {count} is not between 1 and {CLAIM_COUNT_MAX}")
        body: Dict[str, Any] = {"clientid": self._client_id, "id": _task_id(task)}
        if result is not None:
            body["result"] = result
        # Nothing was written under an id whose finish with next was not taken, so the
        # finish alone goes under the same id.
        rid = request_id if request_id is not None else self.next_request_id()
        nxt: Dict[str, Any] = {"group": group, "duration": int(duration_ms)}
        if count != 1:
            nxt["count"] = int(count)
        sent_next = time.monotonic() >= self._next_retry_at
        if sent_next:
            try:
                return self.write("/finish", dict(body, next=nxt), rid)
            except Rejected as e:
                if not next_not_taken(e.status, e.message):
                    raise
                self._next_retry_at = time.monotonic() + NEXT_RETRY_AFTER
        try:
            self.write("/finish", body, rid)
        except Rejected as e:
            if not (sent_next and e.status == 422):
                raise
            # The id names a finish with next after all: one sent earlier in this call
            # that was still on its way into the log when a leader refused its retry.
            # Asked again with next, the cluster answers its first outcome.
            return self.write("/finish", dict(body, next=nxt), rid)
        # The finish applied: a claim that fails now is no task claimed, not a failed
        # finish; the caller claims as usual.
        try:
            return self.claim_many(group, count, duration_ms)
        except (Unavailable, Rejected, Refused):
            return []

    def finish_many(
        self,
        finishes: Sequence[Union[TaskRef, Tuple[TaskRef, Any]]],
        *,
        request_id: Optional[str] = None,
    ) -> None:
        """Ends the claims of several task versions (1 to 1000) with success in one
        request, all or none. Each item is a task (or id), or a ``(task, result)`` pair.
        A refusal (``Refused``) names every task that cannot be finished (its lease
        lapsed, it was cancelled); finish the rest again without them."""
        items: List[Dict[str, Any]] = []
        for finish in finishes:
            task, result = finish if isinstance(finish, tuple) else (finish, None)
            item: Dict[str, Any] = {"id": _task_id(task)}
            if result is not None:
                item["result"] = result
            items.append(item)
        self.write("/finish/many", {"clientid": self._client_id, "finishes": items}, request_id)

    def fail(
        self,
        task: TaskRef,
        error: str = "",
        retry_in_ms: Optional[int] = None,
        *,
        request_id: Optional[str] = None,
    ) -> Optional[Task]:
        """Ends the claim of a task version with an error (at most 64 KiB): retried after
        the group's back-off (or ``retry_in_ms``), dead after its last attempt. Answers
        the retry's new version, or ``None`` if the job is now dead."""
        body: Dict[str, Any] = {"clientid": self._client_id, "id": _task_id(task), "error": error}
        if retry_in_ms is not None:
            body["retry_in_ms"] = int(retry_in_ms)
        tasks = self.write("/fail", body, request_id)
        return tasks[0] if tasks else None

    def cancel(self, group: str, keys: Sequence[str], *, request_id: Optional[str] = None) -> None:
        """Cancels the jobs ``keys`` of ``group`` (running or not): a running job's owner
        is refused on its next write; jobs waiting for them are cancelled too."""
        body = {"clientid": self._client_id, "group": group, "keys": key_list("keys", keys)}
        self.write("/cancel", body, request_id)

    def retry(self, group: str, keys: Sequence[str], *, request_id: Optional[str] = None) -> List[Task]:
        """Re-drives dead jobs with a fresh attempt budget; answers their new versions."""
        body = {"clientid": self._client_id, "group": group, "keys": key_list("keys", keys)}
        return self.write("/retry", body, request_id)

    def change_settings(
        self,
        group: str,
        *,
        max_running: Optional[int] = None,
        paused: Optional[bool] = None,
        max_attempts: Optional[int] = None,
        backoff: Optional[Backoff] = None,
        retention_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> GroupSettings:
        """Changes the settings given (the others keep their value); answers the
        settings afterwards (with ``running`` 0: read it with :meth:`settings`)."""
        rid = request_id if request_id is not None else self.next_request_id()
        body: Dict[str, Any] = {"clientid": self._client_id, "requestid": rid}
        if max_running is not None:
            body["max_running"] = int(max_running)
        if paused is not None:
            body["paused"] = bool(paused)
        if max_attempts is not None:
            body["max_attempts"] = int(max_attempts)
        if backoff is not None:
            body["backoff"] = backoff.to_json()
        if retention_ms is not None:
            body["retention_ms"] = int(retention_ms)
        path = f"/groups/{quote(group, safe='')}/settings"
        obj = self._call("PUT", path, body, _object_answer, request_id=rid)
        return GroupSettings.from_json(obj)

    # -- reads ----------------------------------------------------------------------

    def task(self, task_id: int, *, consistency: Optional[str] = None) -> Task:
        """One task version; :class:`~rota.errors.NotFound` if it does not exist (any more).
        ``consistency``: ``"linearizable"`` (default) or ``"stale"`` (this node's state)."""
        obj = self._read(f"/task/{int(task_id)}{_query(consistency=consistency)}")
        return Task.from_json(obj)

    def tasks(self, task_ids: Sequence[int], *, consistency: Optional[str] = None) -> List[Optional[Task]]:
        """Several task versions (at most 10 000), in the order asked; ``None`` where one
        does not exist. Ids past about 8 KiB of path (some 700 ids of 10 digits) are read
        in several requests: each reads one state of the store, but two of them may read
        different ones."""
        ids = [str(int(i)) for i in task_ids]
        if len(ids) > TASK_IDS_MAX:
            raise ValueError(f"{len(ids)} task ids; at most {TASK_IDS_MAX} in one call")
        query = _query(consistency=consistency)
        found: List[Optional[Task]] = []
        room = TASKS_PATH_BYTES_MAX - len("/tasks/") - len(query)
        while ids:
            # Every id takes its digits and a comma; at least one goes in each read.
            count, used = 1, len(ids[0]) + 1
            while count < len(ids) and used + len(ids[count]) + 1 <= room:
                used += len(ids[count]) + 1
                count += 1
            chunk, ids = ids[:count], ids[count:]
            obj = self._read(f"/tasks/{','.join(chunk)}{query}")
            found.extend(None if t is None else Task.from_json(t) for t in obj)
        return found

    def group(
        self,
        name: str,
        *,
        limit: Optional[int] = None,
        owned: bool = False,
        consistency: Optional[str] = None,
    ) -> List[Task]:
        """The tasks of a group by available time, then id (claims take higher
        priorities first); only unowned ones unless ``owned``."""
        query = _query(limit=limit, owned=True if owned else None, consistency=consistency)
        obj = self._read(f"/group/{quote(name, safe='')}{query}")
        return [Task.from_json(t) for t in obj]

    def groups(self, *, consistency: Optional[str] = None) -> List[str]:
        """The names of the groups that hold tasks."""
        return [str(g) for g in self._read(f"/groups{_query(consistency=consistency)}")]

    def job(
        self,
        group: str,
        key: str,
        *,
        wait_ms: int = 0,
        consistency: Optional[str] = None,
    ) -> Job:
        """The record of job ``key`` of ``group``; with ``wait_ms`` (at most 60 000),
        answered once the job has finished or at the deadline. :class:`~rota.errors.NotFound`
        if there is none (never added, or past the retention)."""
        wait = _wait_ms(wait_ms)
        query = _query(group=group, key=key, wait_ms=wait or None, consistency=consistency)
        return Job.from_json(self._read(f"/job{query}", wait))

    def job_by_id(
        self,
        id: int,
        *,
        wait_ms: int = 0,
        consistency: Optional[str] = None,
    ) -> Job:
        """The record of the job with id ``id``: the task id its add answered (until the
        job's next run), or its live task's id; ``wait_ms`` as for :meth:`job`.
        :class:`~rota.errors.NotFound` if no job has that id."""
        wait = _wait_ms(wait_ms)
        query = _query(id=int(id), wait_ms=wait or None, consistency=consistency)
        return Job.from_json(self._read(f"/job{query}", wait))

    def jobs(
        self,
        group: str,
        *,
        state: Optional[str] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
        consistency: Optional[str] = None,
    ) -> JobPage:
        """One page of a group's job records in key order (``limit``: 100 by default, at
        most 1 000); pass the page's ``next`` as ``after`` for the next one."""
        query = _query(group=group, state=state, after=after, limit=limit, consistency=consistency)
        obj = self._read(f"/jobs{query}")
        return JobPage([Job.from_json(j) for j in obj.get("jobs") or []], obj.get("next"))

    def iter_jobs(
        self,
        group: str,
        *,
        state: Optional[str] = None,
        page_size: int = 1000,
        consistency: Optional[str] = None,
    ) -> Iterator[Job]:
        """Every job record of a group (of one ``state`` if given), page by page."""
        after: Optional[str] = None
        while True:
            page = self.jobs(group, state=state, after=after, limit=page_size, consistency=consistency)
            yield from page.jobs
            if page.next is None:
                return
            after = page.next

    def dead(
        self,
        group: str,
        *,
        after: Optional[str] = None,
        limit: Optional[int] = None,
        consistency: Optional[str] = None,
    ) -> JobPage:
        """One page of a group's dead jobs (dead letters), in key order."""
        query = _query(group=group, after=after, limit=limit, consistency=consistency)
        obj = self._read(f"/dead{query}")
        return JobPage([Job.from_json(j) for j in obj.get("jobs") or []], obj.get("next"))

    def wait_jobs(
        self,
        group: str,
        keys: Sequence[str],
        wait_ms: int = 0,
        *,
        consistency: Optional[str] = None,
    ) -> JobWait:
        """The records of jobs ``keys`` (1 to 1 000) of ``group`` once all have finished,
        or as they are after ``wait_ms`` (at most 60 000)."""
        wait = _wait_ms(wait_ms)
        keys = key_list("keys", keys)  # once: any iterable, a generator included
        query = _query(group=group, key=keys, wait_ms=wait, consistency=consistency)
        path = f"/jobs/wait{query}"
        if len(path) <= WAIT_QUERY_BYTES_MAX:
            obj = self._read(path, wait)
        else:
            # More keys than a URL holds: the same read with its parameters in a body.
            body: Dict[str, Any] = {"group": group, "keys": keys, "wait_ms": wait}
            if consistency is not None:
                body["consistency"] = consistency
            try:
                obj = self._call("POST", "/jobs/wait", body, _object_answer, wait_s=wait / 1000.0)
            except Rejected as e:
                # A build before the POST: the GET, if it takes one this long.
                if e.status != 405 or len(path) > WAIT_QUERY_BYTES_MAX_HTTP1:
                    raise
                obj = self._read(path, wait)
        return JobWait(
            finished=bool(obj.get("finished")),
            jobs=[Job.from_json(j) for j in obj.get("jobs") or []],
            missing=[str(k) for k in obj.get("missing") or []],
        )

    def settings(self, group: str, *, consistency: Optional[str] = None) -> GroupSettings:
        """A group's settings (the defaults unless changed), with ``running`` now."""
        path = f"/groups/{quote(group, safe='')}/settings{_query(consistency=consistency)}"
        return GroupSettings.from_json(self._read(path))

    def watch(
        self,
        group: str,
        after: Optional[int] = None,
        wait_ms: int = 0,
        *,
        limit: Optional[int] = None,
    ) -> WatchPage:
        """A group's changes after revision ``after`` (default: from now), waiting up to
        ``wait_ms`` for the first; :class:`~rota.errors.Forgotten` when the node no longer
        keeps them (re-read, then watch from its ``revision``). Served by any node from
        what it applied."""
        wait = _wait_ms(wait_ms)
        query = _query(group=group, after=after, wait_ms=wait, limit=limit)
        return WatchPage.from_json(self._read(f"/watch{query}", wait))

    def cluster(self) -> Dict[str, Any]:
        """``GET /cluster`` of the first node that answers: its view of the cluster."""
        obj: Dict[str, Any] = self._read("/cluster")
        return obj

    # -- workers --------------------------------------------------------------------

    def worker(self, group: str, **options: Any) -> Callable[["Handler"], "Worker"]:
        """A decorator that makes a handler ``f(task, lease)`` a :class:`~rota.worker.Worker`
        of ``group`` (options as :class:`~rota.worker.Worker` takes them)."""
        from .worker import Worker

        def wrap(handler: "Handler") -> "Worker":
            return Worker(self, group, handler, **options)

        return wrap
