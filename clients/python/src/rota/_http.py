"""A small HTTP/1.1 client on plain sockets with a keep-alive pool per node.

Thread-safe: a connection is taken from the pool for one exchange and put back after
it, so any number of threads share one pool. A pooled connection that the node closed
meanwhile is retried once on a fresh connection (every write this client sends carries
a request id, so a resend applies once). Only a status line proves that a node
answered: every other failure is a :class:`TransportError`, whose outcome is unknown;
one that retrying cannot fix (a TLS certificate the client does not accept, a node that
answers in TLS over plain HTTP) is a :class:`SetupError`.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import re
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Set, Tuple

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
        scheme = text[:8].lower()
        if scheme.startswith("https://"):
            https, text = True, text[len("https://"):]
        elif scheme.startswith("http://"):
            text = text[len("http://"):]
        elif "://" in text:
            raise ValueError(f"{url!r}: a node address is host:port, http://host:port or https://host:port")
        text = text.split("/", 1)[0]
        if not text:
            raise ValueError(f"no node address in {url!r}")
        if text.startswith("["):  # [v6]:port
            end = text.find("]")
            if end < 0:
                raise ValueError(f"{url!r}: an IPv6 address opened with [ is not closed with ]")
            host, rest = text[1:end], text[end + 1:]
            if rest and not rest.startswith(":"):
                raise ValueError(f"{url!r}: after [host] comes :port or nothing")
            port_text = rest[1:] if rest else None
        elif text.count(":") == 1:
            host, port_text = text.split(":", 1)
        else:
            host, port_text = text, None
            if ":" in host:
                try:
                    ipaddress.IPv6Address(host)
                except ValueError:
                    raise ValueError(f"{url!r}: not host:port (an IPv6 address with a port goes in [brackets])") from None
        if not host:
            raise ValueError(f"no host in {url!r}")
        if port_text is not None and not (port_text.isascii() and port_text.isdigit()):
            raise ValueError(f"{url!r}: the port {port_text!r} is not a number")
        port = int(port_text) if port_text else (443 if https else 80)
        if not 1 <= port <= 65535:
            raise ValueError(f"{url!r}: the port {port} is not between 1 and 65535")
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


class SetupError(TransportError):
    """No request reached ``node`` (an address), and none will while the client is set
    up as it is: a TLS handshake failed for good (a certificate the client does not
    accept, a node that does not speak TLS), or the node answered in TLS over plain HTTP.
    The message names the node and what to check."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        super().__init__(message)


class CancelledError(Exception):
    """The exchange was aborted through its :class:`Cancel`."""


class Cancel:
    """Aborts the exchanges registered with it from another thread (a worker that stops
    while its claims wait): their sockets are shut down, so a blocked read returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._socks: Set[socket.socket] = set()
        self._children: Set["Cancel"] = set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleeps up to ``timeout`` seconds, less if cancelled; whether it was."""
        return self._cancelled.wait(timeout)

    def child(self) -> "Cancel":
        """A ``Cancel`` that this one's cancel cancels too (and that may be cancelled
        alone); :meth:`forget` it once its exchange is over."""
        child = Cancel()
        with self._lock:
            if self._cancelled.is_set():
                child._cancelled.set()
            else:
                self._children.add(child)
        return child

    def forget(self, child: "Cancel") -> None:
        """Stops passing a cancel on to ``child``."""
        with self._lock:
            self._children.discard(child)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled.set()
            socks = list(self._socks)
            children = list(self._children)
            self._children.clear()
        for child in children:
            child.cancel()
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


HEAD_BYTES_MAX = 64 * 1024
"""The most an answer's status line and headers may take; a longer head is an error."""

_RECV_BYTES = 64 * 1024

# What a request path may not hold (it would end the line early), and what a header
# name is (RFC 9110, section 5.1: a token).
_NOT_IN_PATH = re.compile(r"[ \r\n\t]")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class _Closed(Exception):
    """The node closed the connection before any byte of an answer."""


class _Malformed(Exception):
    """The bytes that came are no HTTP/1.1 answer."""


class _TlsAnswer(_Malformed):
    """The bytes that came are a TLS record: the node speaks TLS."""


def _is_tls_record(data: bytes) -> bool:
    """Whether ``data`` starts as a TLS record does: an alert (0x15) or a handshake
    (0x16), then the major version 3. Only asked of an answer that is no HTTP."""
    return len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03


# Failures of a reused keep-alive connection that mean the node closed it while idle.
_STALE = (_Closed, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class _Conn:
    """One keep-alive HTTP/1.1 connection: the socket, and the bytes read past the last
    answer. Requests and answers are written and parsed here rather than by
    ``http.client``, whose header parsing (the ``email`` package) and per-answer file
    objects cost more CPU than the rest of a small exchange."""

    __slots__ = ("sock", "host", "buf", "answered", "timeout")

    def __init__(self, sock: socket.socket, host: str) -> None:
        self.sock = sock
        self.host = host
        self.buf = b""
        # Whether any byte of the current exchange's answer came: only before the first
        # may a failure mean the node had closed the idle connection (and a resend is safe).
        self.answered = False
        # The timeout last set on the socket: setting it costs a system call, and
        # almost every exchange asks for the same one.
        self.timeout: Optional[float] = None

    def set_timeout(self, timeout: float) -> None:
        if timeout != self.timeout:
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, method: str, path: str, headers: str, body: Optional[bytes]) -> None:
        """Writes the request in one system call: head and body together. ``headers``
        are header lines, each ending in CRLF."""
        self.answered = False
        if body is not None or method in ("POST", "PUT"):
            length = f"Content-Length: {len(body or b'')}\r\n"
        else:
            length = ""
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{headers}{length}\r\n".encode("latin-1")
        self.sock.sendall(head + body if body else head)

    def _fill(self) -> bool:
        """Reads what the socket has into the buffer; whether anything came."""
        chunk = self.sock.recv(_RECV_BYTES)
        if not chunk:
            return False
        self.answered = True
        self.buf += chunk
        return True

    def _take(self, n: int) -> bytes:
        """The next ``n`` bytes; a large body is gathered in parts, not appended to."""
        parts, have = [self.buf], len(self.buf)
        while have < n:
            chunk = self.sock.recv(max(_RECV_BYTES, min(n - have, 1 << 20)))
            if not chunk:
                raise _Malformed("the connection closed inside the body")
            self.answered = True
            parts.append(chunk)
            have += len(chunk)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.buf = data[n:]
        return data[:n] if len(data) > n else data

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line, self.buf = self.buf[:end], self.buf[end + 2:]
                return line
            if len(self.buf) > HEAD_BYTES_MAX:
                raise _Malformed("a line longer than 64 KiB")
            if not self._fill():
                raise _Malformed("the connection closed inside a chunk")

    def _head(self) -> Tuple[str, int, Dict[str, str]]:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self.buf) > HEAD_BYTES_MAX:
                raise _Malformed("an answer head longer than 64 KiB")
            if not self._fill():
                if self.answered:
                    if _is_tls_record(self.buf):
                        raise _TlsAnswer(f"the answer is a TLS record ({self.buf[:8].hex(' ')}), not HTTP")
                    raise _Malformed("the connection closed inside the answer's head")
                raise _Closed("the node closed the connection without an answer")
        head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:]
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            if _is_tls_record(head[:2].encode("latin-1")):
                raise _TlsAnswer(f"the answer is a TLS record ({head[:8].encode('latin-1').hex(' ')}), not HTTP")
            raise _Malformed(f"not a status line: {lines[0][:80]!r}")
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise _Malformed(f"not a header line: {line[:80]!r}")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return parts[0], int(parts[1]), headers

    def answer(self, method: str) -> Tuple[int, Dict[str, str], bytes, bool]:
        """Reads one answer: status, headers (lowercase names), body, and whether the
        connection must close after it."""
        version, status, headers = self._head()
        while 100 <= status < 200:  # an interim answer: the real one follows
            version, status, headers = self._head()
        connection = headers.get("connection", "").lower()
        will_close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if method == "HEAD" or status in (204, 304):
            return status, headers, b"", will_close
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, self._chunked(), will_close
        length = headers.get("content-length")
        if length is not None:
            if not (length.isascii() and length.isdigit()):
                raise _Malformed(f"not a content length: {length[:20]!r}")
            return status, headers, self._take(int(length)), will_close
        parts = [self.buf]  # no length: the body runs to the end of the connection
        while True:
            chunk = self.sock.recv(_RECV_BYTES)
            if not chunk:
                break
            parts.append(chunk)
        self.buf = b""
        return status, headers, b"".join(parts), True

    def _chunked(self) -> bytes:
        chunks = []
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                raise _Malformed(f"not a chunk size: {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                while self._line():  # trailers, up to the blank line
                    pass
                return b"".join(chunks)
            chunks.append(self._take(size))
            if self._line():
                raise _Malformed("a chunk longer than its size")


def check_token(token: str) -> str:
    """A bearer token as sent: stripped, and refused (``ValueError``) unless it is one
    non-empty line that an HTTP header can carry, so it fails when it is given rather
    than at every request."""
    if not token.strip() or any(c in token for c in "\r\n"):
        raise ValueError("token must be a non-empty single line")
    token.encode("latin-1")  # a UnicodeEncodeError is a ValueError
    return token.strip()


class Pool:
    """Keep-alive connections per node, shared by every thread."""

    def __init__(
        self,
        idle_per_node: int = IDLE_PER_NODE_MAX,
        token: Optional[str] = None,
        tls: Optional[ssl.SSLContext] = None,
        ca: Optional[str] = None,
    ) -> None:
        self._lock = threading.Lock()
        self._idle: Dict[str, List["_Conn"]] = {}
        self._idle_max = idle_per_node
        self._authorization = f"Bearer {check_token(token)}" if token else None
        # The header lines every request carries, rendered once: building them per
        # request cost as much CPU as the rest of the request's head.
        authorization = f"Authorization: {self._authorization}\r\n" if self._authorization else ""
        common = f"User-Agent: {USER_AGENT}\r\nAccept: application/json\r\n"
        self._lines = common + authorization
        self._lines_json = common + "Content-Type: application/json\r\n" + authorization
        # With a context (a cluster CA), every node is dialled over TLS.
        self._tls = tls
        # The CA file the context trusts, named in the error of a certificate refused.
        self._ca = ca

    def _take(self, node: Node) -> Optional["_Conn"]:
        with self._lock:
            idle = self._idle.get(node.addr)
            if idle:
                return idle.pop()
        return None

    def _put(self, node: Node, conn: "_Conn") -> None:
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

    def _connect(self, node: Node, timeout: float) -> "_Conn":
        sock = socket.create_connection((node.host, node.port), timeout=timeout)
        try:
            # Small request/response pairs: waiting to coalesce only adds latency.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if node.https or self._tls is not None:
            context = self._tls or ssl.create_default_context()
            try:
                sock = context.wrap_socket(sock, server_hostname=node.host)
            except BaseException:
                sock.close()
                raise
        shown = f"[{node.host}]" if ":" in node.host else node.host
        conn = _Conn(sock, f"{shown}:{node.port}")
        conn.timeout = timeout  # create_connection set it, and TLS kept it
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
        if not path.startswith("/") or _NOT_IN_PATH.search(path):
            raise ValueError(f"not a request path: {path!r}")
        lines = self._lines if body is None else self._lines_json
        if headers:
            lines = self._with_headers(body is not None, headers)
        conn = self._take(node)
        if conn is not None:
            try:
                return self._exchange(node, conn, method, path, body, timeout, cancel, lines)
            except _Stale:
                pass  # the node closed it while it was idle: once more on a new one
        try:
            conn = self._connect(node, timeout)
        except CancelledError:
            raise
        except ssl.SSLError as e:
            problem = self._tls_problem(node, e)
            if problem is not None:
                raise SetupError(node.addr, problem) from e
            raise TransportError(f"cannot connect to {node.addr}: {_describe(e)}") from e
        except OSError as e:
            raise TransportError(f"cannot connect to {node.addr}: {_describe(e)}") from e
        try:
            return self._exchange(node, conn, method, path, body, timeout, cancel, lines)
        except _Stale as stale:
            # A new connection closed before any byte of an answer: a node serving TLS
            # may do that to a request in plain HTTP.
            hint = _SERVING_TLS_HINT if not isinstance(conn.sock, ssl.SSLSocket) else ""
            raise TransportError(f"{stale}{hint}") from stale.__cause__

    def _tls_problem(self, node: Node, e: ssl.SSLError) -> Optional[str]:
        """What is wrong, naming ``node`` and what to check, when a TLS handshake failed
        in a way that retrying cannot fix; ``None`` for one that it may (the node closed
        the connection or reset it meanwhile)."""
        if isinstance(e, ssl.SSLCertVerificationError):
            said = e.verify_message or e.reason or str(e)
            if e.verify_code in (_X509_HOSTNAME_MISMATCH, _X509_IP_ADDRESS_MISMATCH):
                return (
                    f"{node.addr}: the node's TLS certificate is not valid for {node.host!r} ({said}): "
                    "use a node address its certificate names, or give the node a certificate for this one"
                )
            if self._ca is not None:
                check = (
                    f"check the CA file {self._ca!r} (ca= or ROTA_CA): it must be the CA "
                    "that signed the nodes' certificates"
                )
            else:
                check = (
                    "no CA file was given (ca= or ROTA_CA), so the system's trust store was used: "
                    "give the cluster's CA"
                )
            return f"{node.addr}: the node's TLS certificate was not accepted ({said}); {check}"
        if isinstance(e, _TLS_MAY_PASS):
            return None
        reason = e.reason or ""
        if "INTERNAL_ERROR" in reason or reason == "UNEXPECTED_EOF_WHILE_READING":
            # The node's own trouble, or a connection cut mid-handshake (a restart), which
            # some OpenSSL and Python pairs report without SSLEOFError: both may pass.
            return None
        if reason in _NOT_TLS_REASONS:
            return (
                f"{node.addr} does not answer in TLS ({_describe(e)}): is the node serving plain HTTP? "
                "then use http:// URLs and no CA (ca= or ROTA_CA)"
            )
        return (
            f"{node.addr}: the TLS handshake failed ({_describe(e)}); check the CA file (ca= or ROTA_CA) "
            "and the URL's scheme (https:// for a node serving TLS)"
        )

    def _with_headers(self, has_body: bool, headers: Mapping[str, str]) -> str:
        """The header lines of a request that sets some of its own (they win)."""
        merged: Dict[str, str] = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if has_body:
            merged["Content-Type"] = "application/json"
        if self._authorization is not None:
            merged["Authorization"] = self._authorization
        merged.update(headers)
        for name, value in merged.items():
            if not _HEADER_NAME.fullmatch(name) or any(c in value for c in "\r\n"):
                raise ValueError(f"not a header: {name!r}: {value!r}")
        lines = "".join(f"{name}: {value}\r\n" for name, value in merged.items())
        lines.encode("latin-1")  # a UnicodeEncodeError (a ValueError) before any byte goes
        return lines

    def _exchange(
        self,
        node: Node,
        conn: "_Conn",
        method: str,
        path: str,
        body: Optional[bytes],
        timeout: float,
        cancel: Optional[Cancel],
        lines: str,
    ) -> Response:
        sock = conn.sock
        try:
            conn.set_timeout(timeout)
            if cancel is not None:
                cancel._attach(sock)
            try:
                try:
                    conn.send(method, path, lines, body)
                except (BrokenPipeError, ConnectionResetError):
                    early = _early_answer(conn, method)
                    if early is None:
                        raise
                    conn.close()
                    return early
                status, answer_headers, data, will_close = conn.answer(method)
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
            if not conn.answered:
                raise _Stale(f"{node.addr}: connection closed: {_describe(e)}") from e
            raise TransportError(f"{node.addr}: connection closed mid-answer: {_describe(e)}") from e
        except (OSError, _Malformed) as e:
            conn.close()
            if cancel is not None and cancel.cancelled:
                raise CancelledError() from e
            if isinstance(e, _TlsAnswer) and not isinstance(sock, ssl.SSLSocket):
                raise SetupError(
                    node.addr,
                    f"{node.addr} answered in TLS to a request in plain HTTP ({e}): is the node serving TLS? "
                    "use an https:// URL and ca= (or ROTA_CA) with the cluster's CA",
                ) from e
            if isinstance(e, socket.timeout):
                raise TransportError(f"{node.addr} did not answer within {timeout:.1f} s") from e
            raise TransportError(f"HTTP exchange with {node.addr} failed: {_describe(e)}") from e
        if will_close:
            conn.close()
        else:
            self._put(node, conn)
        return Response(status=status, headers=answer_headers, body=data)


def _early_answer(conn: "_Conn", method: str) -> Optional[Response]:
    """The answer a node gave before it stopped reading a request whose sending then
    broke, if it is there whole: a node answers a body over its limit with a 413 and
    closes the connection without reading the rest of a large one."""
    try:
        status, headers, data, _ = conn.answer(method)
    except (OSError, _Malformed, _Closed):
        return None
    return Response(status=status, headers=headers, body=data)


class _Stale(TransportError):
    """A connection the node closed; on a reused one, retried on a fresh one."""


_SERVING_TLS_HINT = " (is the node serving TLS? then use an https:// URL and ca=)"

# OpenSSL's verify codes of a certificate that names another host or address.
_X509_HOSTNAME_MISMATCH = 62
_X509_IP_ADDRESS_MISMATCH = 64

# Handshake failures that say the connection broke, not that the two ends disagree: the
# node may have closed or reset it (a restart, an overload), so they are retried.
_TLS_MAY_PASS = (
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
    ssl.SSLSyscallError,
    ssl.SSLWantReadError,
    ssl.SSLWantWriteError,
)

# OpenSSL's reasons for a handshake whose answer is no TLS (a plain-HTTP node's answer).
_NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"}
)


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


ERROR_CHARS_MAX = 200
"""Most characters of a body that is not a Rota error kept as the error's message."""


def split_status(response: Response) -> Tuple[int, str]:
    """The status and the node's ``error`` message (or the body) of an answer."""
    text = response.body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and isinstance(obj.get("error"), str):
            return response.status, obj["error"]
    except ValueError:
        pass
    # Not ours (a proxy's error page, say): the start says enough.
    said = text.strip()[:ERROR_CHARS_MAX]
    return response.status, said or http.client.responses.get(response.status, "")
