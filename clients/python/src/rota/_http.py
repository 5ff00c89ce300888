"""A small HTTP/1.1 client on ``http.client`` with a keep-alive pool per node.

Thread-safe: a connection is taken from the pool for one exchange and put back after
it, so any number of threads share one pool. A pooled connection that the node closed
meanwhile is retried once on a fresh connection (every write this client sends carries
a request id, so a resend applies once). Only a status line proves that a node
answered: every other failure is a :class:`TransportError`, whose outcome is unknown.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Union

Connection = Union[http.client.HTTPConnection, http.client.HTTPSConnection]

IDLE_PER_NODE_MAX = 64
"""Idle connections kept per node; more are closed after use."""

USER_AGENT = "rota-client-python/0.1"


@dataclass(frozen=True)
class Node:
    """A node's address: ``addr`` is ``host:port``, as ``GET /cluster`` names nodes."""

    addr: str
    host: str
    port: int
    https: bool = False

    @classmethod
    def parse(cls, url: str) -> "Node":
        """``host:port``, ``http://host:port/`` or ``https://host:port``."""
        text = url.strip()
        https = False
        if text.startswith("https://"):
            https, text = True, text[len("https://"):]
        elif text.startswith("http://"):
            text = text[len("http://"):]
        text = text.split("/", 1)[0]
        if not text:
            raise ValueError(f"no node address in {url!r}")
        if text.startswith("["):  # [v6]:port
            end = text.find("]")
            host, rest = text[1:end], text[end + 1:]
            port_text = rest[1:] if rest.startswith(":") else ""
        elif text.count(":") == 1:
            host, port_text = text.split(":", 1)
        else:
            host, port_text = text, ""
        port = int(port_text) if port_text else (443 if https else 80)
        shown = f"[{host}]" if ":" in host else host
        return cls(addr=f"{shown}:{port}", host=host, port=port, https=https)


@dataclass(frozen=True)
class Response:
    """A response read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class TransportError(Exception):
    """The exchange failed before a whole answer came: its outcome is unknown."""


class CancelledError(Exception):
    """The exchange was aborted through its :class:`Cancel`."""


class Cancel:
    """Aborts the exchanges registered with it from another thread (a worker that stops
    while its claims wait): their sockets are shut down, so a blocked read returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._socks: Set[socket.socket] = set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleeps up to ``timeout`` seconds, less if cancelled; whether it was."""
        return self._cancelled.wait(timeout)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled.set()
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _attach(self, sock: Optional[socket.socket]) -> None:
        if sock is None:
            return
        with self._lock:
            if self._cancelled.is_set():
                raise CancelledError()
            self._socks.add(sock)

    def _detach(self, sock: Optional[socket.socket]) -> None:
        if sock is None:
            return
        with self._lock:
            self._socks.discard(sock)


# Failures of a reused keep-alive connection that mean the node closed it while idle.
_STALE = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)


class _HTTPConnection(http.client.HTTPConnection):
    """``http.client``'s connection, sending a request's head and body in one write.

    ``http.client`` writes them apart: two system calls and two TCP segments per request
    for both ends, where one does (``_buffer`` is ``http.client``'s own head buffer)."""

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        buffer = getattr(self, "_buffer", None)
        if isinstance(message_body, bytes) and not encode_chunked and isinstance(buffer, list):
            buffer.extend((b"", b""))
            head = b"\r\n".join(buffer)
            del buffer[:]
            self.send(head + message_body)
            return
        super()._send_output(message_body, encode_chunked=encode_chunked)


class Pool:
    """Keep-alive connections per node, shared by every thread."""

    def __init__(
        self,
        idle_per_node: int = IDLE_PER_NODE_MAX,
        token: Optional[str] = None,
        tls: Optional[ssl.SSLContext] = None,
    ) -> None:
        self._lock = threading.Lock()
        self._idle: Dict[str, List[Connection]] = {}
        self._idle_max = idle_per_node
        self._authorization = f"Bearer {token}" if token else None
        # With a context (a cluster CA), every node is dialled over TLS.
        self._tls = tls

    def _take(self, node: Node) -> Optional[Connection]:
        with self._lock:
            idle = self._idle.get(node.addr)
            if idle:
                return idle.pop()
        return None

    def _put(self, node: Node, conn: Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(node.addr, [])
            if len(idle) < self._idle_max:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Closes every idle connection."""
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()

    def _connect(self, node: Node, timeout: float) -> Connection:
        conn: Connection
        if node.https or self._tls is not None:
            conn = http.client.HTTPSConnection(node.host, node.port, timeout=timeout, context=self._tls)
        else:
            conn = _HTTPConnection(node.host, node.port, timeout=timeout)
        conn.connect()
        if conn.sock is not None:
            try:
                # Small request/response pairs: waiting to coalesce only adds latency.
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        return conn

    def request(
        self,
        node: Node,
        method: str,
        path: str,
        body: Optional[bytes],
        timeout: float,
        cancel: Optional[Cancel] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Response:
        """One exchange with ``node``; ``timeout`` bounds the connect and every read."""
        all_headers: Dict[str, str] = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if body is not None:
            all_headers["Content-Type"] = "application/json"
        if self._authorization is not None:
            all_headers["Authorization"] = self._authorization
        if headers:
            all_headers.update(headers)
        conn = self._take(node)
        if conn is not None:
            try:
                return self._exchange(node, conn, method, path, body, timeout, cancel, all_headers)
            except _Stale:
                pass  # the node closed it while it was idle: once more on a new one
        try:
            conn = self._connect(node, timeout)
        except CancelledError:
            raise
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(f"cannot connect to {node.addr}: {_describe(e)}") from e
        try:
            return self._exchange(node, conn, method, path, body, timeout, cancel, all_headers)
        except _Stale as stale:
            raise TransportError(str(stale)) from stale.__cause__

    def _exchange(
        self,
        node: Node,
        conn: Connection,
        method: str,
        path: str,
        body: Optional[bytes],
        timeout: float,
        cancel: Optional[Cancel],
        headers: Dict[str, str],
    ) -> Response:
        sock = conn.sock
        try:
            if sock is not None:
                sock.settimeout(timeout)
            if cancel is not None:
                cancel._attach(sock)
            try:
                conn.request(method, path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
            finally:
                if cancel is not None:
                    cancel._detach(sock)
        except CancelledError:
            conn.close()
            raise
        except _STALE as e:
            conn.close()
            if cancel is not None and cancel.cancelled:
                raise CancelledError() from e
            raise _Stale(f"{node.addr}: connection closed: {_describe(e)}") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if cancel is not None and cancel.cancelled:
                raise CancelledError() from e
            if isinstance(e, socket.timeout):
                raise TransportError(f"{node.addr} did not answer within {timeout:.1f} s") from e
            raise TransportError(f"HTTP exchange with {node.addr} failed: {_describe(e)}") from e
        response = Response(
            status=answer.status,
            headers={k.lower(): v for k, v in answer.getheaders()},
            body=data,
        )
        if answer.will_close:
            conn.close()
        else:
            self._put(node, conn)
        return response


class _Stale(TransportError):
    """A connection the node closed; on a reused one, retried on a fresh one."""


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def split_status(response: Response) -> Tuple[int, str]:
    """The status and the node's ``error`` message (or the body) of an answer."""
    text = response.body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and isinstance(obj.get("error"), str):
            return response.status, obj["error"]
    except ValueError:
        pass
    return response.status, text.strip() or http.client.responses.get(response.status, "")
