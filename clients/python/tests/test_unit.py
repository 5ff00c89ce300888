"""Pieces that need no cluster: addresses, wire shapes, errors."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from rota import Add, Cancel, Change, Job, LeaseLost, Misconfigured, Refused, Rejected, RotaClient, Task, Unavailable
from rota._http import USER_AGENT, Node, Pool, SetupError, TransportError, _Conn
from rota.client import _query

from conftest import read_request


def test_node_addresses_are_normalised() -> None:
    assert Node.parse("http://127.0.0.1:7001/").addr == "127.0.0.1:7001"
    assert Node.parse(" 127.0.0.1:7001 ").addr == "127.0.0.1:7001"
    assert Node.parse("localhost").port == 80
    https = Node.parse("https://rota.example:8443/x")
    assert (https.host, https.port, https.https) == ("rota.example", 8443, True)
    v6 = Node.parse("http://[::1]:7001")
    assert (v6.host, v6.port, v6.addr) == ("::1", 7001, "[::1]:7001")
    with pytest.raises(ValueError):
        Node.parse("http://")
    assert Node.parse("HTTP://h:1").addr == "h:1" and Node.parse("::1").addr == "[::1]:80"
    assert Node.parse("[::1]:7001").port == 7001
    bad_ones = ("ftp://127.0.0.1:7001", "tcp://h:1", "http://[::1", "http://[::1]x", "127.0.0.1:99999", "h:0", ":7001",
                "h:7o01", "h:1:2", "h:", "[::1]:", "h:\uff17\uff10")
    for bad in bad_ones:
        with pytest.raises(ValueError):
            Node.parse(bad)


def test_wire_shapes() -> None:
    add = Add("g", "d", key="k", after=["a"], priority=2, max_attempts=0, every_ms=1000, on_conflict="keep", timespec=-5)
    assert add.to_json() == {
        "group": "g", "data": "d", "key": "k", "timespec": -5, "priority": 2,
        "after": ["a"], "max_attempts": 0, "every_ms": 1000, "on_conflict": "keep",
    }
    assert Add("g").to_json() == {"group": "g", "data": ""}
    assert Change(5).to_json() == {"id": 5}
    assert Change(5, "x", -100).to_json() == {"id": 5, "data": "x", "timespec": -100}
    wire = {"id": 3, "group": "g", "data": "d", "timespec": 9, "ownerid": -4, "key": "k", "attempt": 2, "new_field": 1}
    task = Task.from_json(wire)
    assert (task.id, task.ownerid, task.key, task.priority, task.attempt) == (3, -4, "k", 0, 2)
    assert Task.from_json(task.to_json()) == task
    job = Job.from_json({"group": "g", "key": "k", "state": "dead", "history": [{"run": 1, "attempt": 1, "owner": 7, "started_at": 1, "ended_at": 2, "outcome": "failed", "error": "e"}]})
    assert job.finished and job.history[0].error == "e" and job.result is None


def test_a_lone_string_is_not_taken_for_a_list_of_keys() -> None:
    """``"ab"`` where a list of keys goes would name jobs "a" and "b"."""
    client = RotaClient(["127.0.0.1:1"], give_up_after=0.1)  # never reached
    for call in (client.cancel, client.retry, client.wait_jobs):
        with pytest.raises(TypeError, match="not one str"):
            call("g", "ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a key is a str"):
        client.cancel("g", [1])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        Add("g", key="k", after="ab").to_json()
    assert Add("g", key="k", after=iter(["a", "b"])).to_json()["after"] == ["a", "b"]


def test_a_worker_needs_a_group() -> None:
    from rota import Worker

    client = RotaClient(["127.0.0.1:1"])  # never reached
    for group in ("", None):
        with pytest.raises(ValueError, match="needs a group"):
            Worker(client, group, lambda task, lease: None)  # type: ignore[arg-type]


def test_queries_are_percent_encoded() -> None:
    assert _query(group="a b/c", key=["x&y", "é"], wait_ms=None, owned=True) == "?group=a%20b%2Fc&key=x%26y&key=%C3%A9&owned=1"
    assert _query(limit=None) == ""


def test_errors() -> None:
    refused = Refused(["a", "b"])
    assert refused.errors == ["a", "b"] and "a; b" in str(refused)
    lost = LeaseLost("refused", ["updates: task 2 does not exist"])
    assert isinstance(lost, Refused) and lost.errors == ["updates: task 2 does not exist"]
    assert LeaseLost("expired").reason == "expired"
    gave_up = Unavailable(1.5, "rid", "boom")
    assert gave_up.request_id == "rid" and "rid" in str(gave_up)


def test_a_cancel_aborts_a_blocked_exchange() -> None:
    """A server that never answers: the cancel ends the wait at once."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        node = Node.parse(f"127.0.0.1:{server.getsockname()[1]}")
        cancel = Cancel()
        threading.Timer(0.3, cancel.cancel).start()
        started = time.monotonic()
        with pytest.raises(Exception) as aborted:
            Pool().request(node, "GET", "/", None, 30.0, cancel)
        assert type(aborted.value).__name__ == "CancelledError"
        assert time.monotonic() - started < 5


def test_a_closed_port_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportError):
        Pool().request(Node.parse(f"127.0.0.1:{port}"), "GET", "/", None, 1.0)


def test_a_cancelled_client_call_raises_cancelled() -> None:
    from rota import Cancelled

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        client = RotaClient([f"127.0.0.1:{server.getsockname()[1]}"], call_timeout=30)
        client._discover_needed = False
        cancel = Cancel()
        threading.Timer(0.3, cancel.cancel).start()
        with pytest.raises(Cancelled):
            client.claim("g", 1000, wait_ms=10_000, cancel=cancel)


def test_poll_backoff_grows_to_its_cap_with_bounded_jitter() -> None:
    from rota.worker import poll_backoff

    for _ in range(200):
        assert 0.1 <= poll_backoff(1) <= 0.15
        assert 0.4 <= poll_backoff(3) <= 0.6
        assert 5.0 <= poll_backoff(40) <= 7.5
    assert len({poll_backoff(2) for _ in range(50)}) > 10, "the jitter spreads workers"


def _answering_every_post_empty() -> Tuple[Any, List[Dict[str, Any]]]:
    """A node that answers every POST (a claim) with no task, at once, and 501 to a GET
    (so no leader is learned); the bodies it was sent."""
    import http.server
    import json

    claims: List[Dict[str, Any]] = []

    class Empty(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            claims.append(json.loads(body))
            answer = b'{"tasks":[]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Empty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, claims


def test_a_worker_polls_a_node_that_cannot_wait_with_a_growing_pause() -> None:
    """A node that answers every blocking claim empty at once: the worker neither spins
    nor stops claiming."""
    server, claims = _answering_every_post_empty()
    try:
        from rota import Worker

        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"])
        client._discover_needed = False
        w = Worker(client, "g", lambda task, lease: None, wait_ms=20_000)
        w.start()
        time.sleep(1.6)
        assert w.stop(timeout=5)
        # 100, 200, 400, 800 ms pauses (plus jitter): about 4 to 5 claims, not hundreds.
        assert 2 <= len(claims) <= 8, len(claims)
        assert all(c["wait_ms"] == 20_000 for c in claims)
    finally:
        server.shutdown()
        server.server_close()


def test_a_token_is_sent_as_a_bearer_with_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    import http.server

    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            answer = b"[]"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"127.0.0.1:{server.server_address[1]}"
        monkeypatch.delenv("ROTA_TOKEN", raising=False)
        for client, expected in [
            (RotaClient([url], token="rota_abc_def"), "Bearer rota_abc_def"),
            (RotaClient([url]), None),
        ]:
            client._discover_needed = False
            client.groups(consistency="stale")
            assert seen[-1] == expected
        monkeypatch.setenv("ROTA_TOKEN", "rota_from_env")
        client = RotaClient([url])
        client._discover_needed = False
        client.groups(consistency="stale")
        assert seen[-1] == "Bearer rota_from_env"
        with pytest.raises(ValueError):
            RotaClient([url], token="two\nlines")
    finally:
        server.shutdown()
        server.server_close()


def _silent_listener() -> Tuple[socket.socket, List[socket.socket]]:
    """A listening socket that accepts connections and never answers (a node cut off
    or frozen), and the connections it accepted so far."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted: List[socket.socket] = []

    def count() -> None:
        while True:
            try:
                conn, _ = silent.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=count, daemon=True).start()
    return silent, accepted


def test_a_learned_leader_out_of_reach_is_asked_once_per_lookup() -> None:
    """Every node names a leader this client cannot reach: one lookup asks it once (a
    lookup timeout each), not once per node."""
    import json

    silent, accepted = _silent_listener()
    silent_addr = f"127.0.0.1:{silent.getsockname()[1]}"
    status = json.dumps({"id": 1, "leader": 9, "nodes": [{"id": 9, "api_addr": silent_addr}]}).encode()
    servers = [_json_node(lambda body: (501, {}), get=status)[0] for _ in range(3)]
    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}" for server in servers])
        assert client.find_leader() is None
        assert len(accepted) == 1, f"asked {len(accepted)} times"
        assert silent_addr in client.known_urls, "still a member to try"
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        silent.close()


def test_a_client_cut_off_from_the_leader_alone_calls_through_a_relay() -> None:
    """The leader accepts connections and answers nothing (cut off from this client
    alone); a follower relays every write and names that leader. Once a call left the
    leader for the follower, the next calls go to the follower first, not back to the
    leader and its call timeout every other time."""
    import json

    silent, accepted = _silent_listener()
    silent_addr = f"127.0.0.1:{silent.getsockname()[1]}"
    status = json.dumps({"id": 2, "leader": 1, "nodes": [{"id": 1, "api_addr": silent_addr}]}).encode()
    task = {"id": 1, "group": "g", "data": "", "timespec": 1, "ownerid": 1}
    relay, posts = _json_node(lambda body: (200, {"tasks": [task]}), get=status)
    try:
        client = RotaClient([silent_addr, f"127.0.0.1:{relay.server_address[1]}"], call_timeout=0.3, retry_pause=0.01)
        client.add("g", "1")
        client.add("g", "2")
        tried = len(accepted)
        client.add("g", "3")
        client.add("g", "4")
        assert len(posts) == 4
        assert len(accepted) == tried, "once it did not answer, the leader is not called first again"
        # Some time later the client looks again: still silent, so the relay stays.
        client._doubted = (silent_addr, 0.0)
        client.add("g", "5")
        assert len(posts) == 5 and len(accepted) == tried + 1, "looked at once"
        assert not client._discovery_due(), "and not again for a while"
    finally:
        relay.shutdown()
        relay.server_close()
        silent.close()


def test_a_blocking_claim_leaves_a_node_that_stops_answering() -> None:
    """A node that froze (it accepts connections, answers nothing) while a claim waits
    there: the claim moves on to the next node within a probe or two, not after its
    whole wait."""
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(16)  # the kernel accepts; nobody reads
    server, claims = _answering_every_post_empty()
    try:
        client = RotaClient([f"127.0.0.1:{frozen.getsockname()[1]}", f"127.0.0.1:{server.server_address[1]}"])
        started = time.monotonic()
        assert client.claim("g", 30_000, wait_ms=20_000) is None
        took = time.monotonic() - started
        assert len(claims) == 1, "answered by the node that is up"
        # A leader lookup (1 s on the frozen node), a probe period, a probe: not the
        # 20 s wait plus a call timeout.
        assert took < 10, took
    finally:
        server.shutdown()
        server.server_close()
        frozen.close()


def _serve_bytes(*answers: bytes) -> Tuple[Node, threading.Thread]:
    """A server that reads one request per answer on one connection and writes the
    answer's bytes as they are (closing the connection after the last)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn, server:
            for answer in answers:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    request += chunk
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return Node.parse(f"127.0.0.1:{server.getsockname()[1]}"), thread


def test_answers_in_every_framing_parse_and_keep_the_connection() -> None:
    """Content-Length, chunked (with an extension and a trailer), an interim 100 before
    the answer, folded duplicate headers, and a body that runs to the close: each on
    the same pooled connection while the node keeps it open."""
    node, thread = _serve_bytes(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
    )
    pool = Pool()
    first = pool.request(node, "GET", "/a", None, 5.0)
    assert (first.status, first.body, first.headers["x-a"]) == (200, b"hello", "1, 2")
    assert pool.request(node, "POST", "/b", b"{}", 5.0).body == b"abcde"
    created = pool.request(node, "GET", "/c", None, 5.0)
    assert (created.status, created.body) == (201, b"ok")
    assert pool.request(node, "GET", "/d", None, 5.0).body == b"to the end"
    thread.join(5)


@pytest.mark.parametrize(
    "answer",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * (70 * 1024),
    ],
)
def test_a_malformed_or_cut_answer_is_a_transport_error(answer: bytes) -> None:
    node, thread = _serve_bytes(answer)
    with pytest.raises(TransportError):
        Pool().request(node, "GET", "/", None, 5.0)
    thread.join(5)


def test_a_path_that_would_split_the_request_is_refused() -> None:
    node, _ = _serve_bytes()
    with pytest.raises(ValueError):
        Pool().request(node, "GET", "/x HTTP/1.1\r\nEvil: 1", None, 1.0)


def _recording_node(count: int) -> Tuple[Node, List[bytes], threading.Thread]:
    """A node that answers ``count`` requests on one connection with ``200 {}`` and
    keeps each request's bytes (head and body)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    seen: List[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn, server:
            pending = b""
            for _ in range(count):
                request = read_request(conn, pending)
                if request is None:
                    return
                head, body, pending = request
                seen.append(head + b"\r\n\r\n" + body)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return Node.parse(f"127.0.0.1:{server.getsockname()[1]}"), seen, thread


def test_requests_carry_their_headers_in_one_head() -> None:
    """The header lines rendered once per pool are the ones each request sends: a body's
    type and length only with a body, the token on every request, and headers a caller
    sets replace the pool's."""
    node, seen, thread = _recording_node(4)
    pool = Pool(token="rota_abc_def")
    pool.request(node, "POST", "/claim", b'{"a":1}', 5.0)
    pool.request(node, "GET", "/cluster", None, 5.0)
    pool.request(node, "GET", "/groups", None, 5.0, headers={"Accept": "text/event-stream"})
    pool.request(node, "POST", "/empty", b"", 5.0)
    thread.join(5)
    host = f"Host: {node.addr}"
    agent = f"User-Agent: {USER_AGENT}"
    assert seen[0] == (
        f"POST /claim HTTP/1.1\r\n{host}\r\n{agent}\r\n"
        "Accept: application/json\r\nContent-Type: application/json\r\n"
        "Authorization: Bearer rota_abc_def\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
    ).encode()
    assert seen[1] == (
        f"GET /cluster HTTP/1.1\r\n{host}\r\n{agent}\r\n"
        "Accept: application/json\r\nAuthorization: Bearer rota_abc_def\r\n\r\n"
    ).encode()
    assert b"\r\nAccept: text/event-stream\r\n" in seen[2]
    assert b"application/json" not in seen[2]
    assert seen[3].endswith(b"\r\nContent-Type: application/json\r\nAuthorization: Bearer rota_abc_def\r\nContent-Length: 0\r\n\r\n")
    for bad in ({"X-Evil": "1\r\nInjected: 1"}, {"": "empty"}, {"Two words": "x"}, {"X-Name": "caf\u00e9\u2603"}):
        with pytest.raises(ValueError):
            pool.request(node, "GET", "/", None, 1.0, headers=bad)
    for token in ("two\nlines", "snow\u2603man"):
        with pytest.raises(ValueError):
            Pool(token=token)


def test_a_connection_sets_its_timeout_only_when_it_changes() -> None:
    """Setting a socket's timeout is a system call; a pooled connection makes it only
    when an exchange asks for another timeout than the last."""

    class Sock:
        def __init__(self) -> None:
            self.timeouts: List[float] = []

        def settimeout(self, timeout: float) -> None:
            self.timeouts.append(timeout)

    sock = Sock()
    conn = _Conn(sock, "node")  # type: ignore[arg-type]
    for timeout in (3.0, 3.0, 3.0, 0.5, 0.5, 3.0):
        conn.set_timeout(timeout)
    assert sock.timeouts == [3.0, 0.5, 3.0]


def test_a_shorter_timeout_applies_on_a_reused_connection() -> None:
    """After an exchange with a long timeout, one with a short timeout on the same
    pooled connection gives up after the short one."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    node = Node.parse(f"127.0.0.1:{server.getsockname()[1]}")
    release = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn, server:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            release.wait(10)  # the second request is read by no one

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    pool = Pool()
    assert pool.request(node, "GET", "/a", None, 30.0).status == 200
    started = time.monotonic()
    with pytest.raises(TransportError, match="did not answer within 0.3 s"):
        pool.request(node, "GET", "/b", None, 0.3)
    assert time.monotonic() - started < 5.0
    release.set()
    thread.join(5)


def _scripted_node(answer_post: Callable[[int], Tuple[int, Dict[str, str]]]) -> Tuple[Any, List[int]]:
    """A node answering each POST with the status and headers ``answer_post`` gives for
    the POSTs before it (200 with ``{"tasks":[]}``, else an error body); counts them."""
    import http.server

    posts: List[int] = []

    class Scripted(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            status, headers = answer_post(len(posts))
            posts.append(status)
            answer = b'{"tasks":[]}' if status == 200 else b'{"error":"rate limit hit"}'
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, posts


def test_a_node_that_answers_429_is_asked_again_and_stays_first() -> None:
    busy, busy_posts = _scripted_node(lambda n: (429, {"Retry-After": "0"}) if n < 2 else (200, {}))
    other, other_posts = _scripted_node(lambda n: (200, {}))
    try:
        urls = [f"127.0.0.1:{s.server_address[1]}" for s in (busy, other)]
        client = RotaClient(urls)
        client._discover_needed = False
        assert client.update(deletes=[]) == []
        assert busy_posts == [429, 429, 200]
        assert other_posts == [], "a 429 is not a reason to go elsewhere"
        assert client.retries == 2
        assert client.preferred == urls[0]
    finally:
        for server in (busy, other):
            server.shutdown()
            server.server_close()


def test_a_429_pause_is_its_retry_after_cut_at_the_deadline() -> None:
    busy, busy_posts = _scripted_node(lambda n: (429, {"Retry-After": "1"}))
    other, other_posts = _scripted_node(lambda n: (200, {}))
    try:
        urls = [f"127.0.0.1:{s.server_address[1]}" for s in (busy, other)]
        client = RotaClient(urls, give_up_after=1.5)
        client._discover_needed = False
        started = time.monotonic()
        with pytest.raises(Unavailable) as raised:
            client.update(deletes=[])
        # Asked at once, after the 1 s it said, and once more at the deadline (1.5 s).
        assert busy_posts == [429, 429, 429]
        assert other_posts == []
        assert time.monotonic() - started >= 1.5
        assert "429" in str(raised.value) and urls[0] in str(raised.value)
    finally:
        for server in (busy, other):
            server.shutdown()
            server.server_close()


def test_an_error_page_that_is_not_rotas_is_cut() -> None:
    from rota._http import Response, split_status

    page = Response(status=502, headers={}, body=b"<html>" + b"x" * 10_000)
    status, said = split_status(page)
    assert status == 502 and said.startswith("<html>") and len(said) == 200
    assert split_status(Response(status=503, headers={}, body=b"")) == (503, "Service Unavailable")
    assert split_status(Response(status=429, headers={}, body=b'{"error":"slow down"}')) == (429, "slow down")


def _json_node(
    answer: Callable[[Dict[str, Any]], Tuple[int, Dict[str, Any]]], get: Optional[bytes] = None
) -> Tuple[Any, List[Dict[str, Any]]]:
    """A node answering each POST's JSON body with the status and JSON ``answer`` gives
    for it, and every GET with ``get`` (501 without); the bodies it was sent, with the
    path under ``"_path"``."""
    import http.server
    import json

    seen: List[Dict[str, Any]] = []

    class Scripted(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            if get is None:
                self.send_error(501)
                return
            self._send(200, get)

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(dict(body, _path=self.path))
            status, reply = answer(body)
            self._send(status, json.dumps(reply).encode())

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_finish_and_claim_sends_its_parts_apart_to_a_node_that_predates_next() -> None:
    """A node of a build before ``next`` (400, unknown field) gets the finish alone under
    the same request id, then a claim; the client remembers, and asks apart at once."""
    unknown = (
        "invalid /finish body: unknown field `next`, expected one of "
        "`clientid`, `id`, `result`, `requestid` at line 1 column 80"
    )
    server, seen = _json_node(lambda body: (400, {"error": unknown}) if "next" in body else (200, {"tasks": []}))
    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"])
        client._discover_needed = False
        assert client.finish_and_claim(5, {"ok": 1}, group="g", duration_ms=1000) == []
        assert [body["_path"] for body in seen] == ["/finish", "/finish", "/claim"], seen
        with_next, alone, claim = seen
        assert with_next["next"] == {"group": "g", "duration": 1000}
        assert "next" not in alone and alone["result"] == {"ok": 1}
        assert alone["requestid"] == with_next["requestid"], "nothing was written under it"
        assert (claim["group"], claim["duration"], claim["count"]) == ("g", 1000, 1)
        seen.clear()
        assert client.finish_and_claim(6, group="g", duration_ms=1000) == []
        assert [("next" in body) for body in seen] == [False, False], seen
    finally:
        server.shutdown()
        server.server_close()


def test_wait_confirmed_returns_once_an_unconfirmed_lease_is_ended() -> None:
    """A late claim whose first renewal got no definite answer, ended meanwhile (a
    worker's stop gives it back, or abandons it): wait_confirmed answers False at once
    instead of waiting for a renewal that will never come."""
    from rota import Lease

    node, posts = _scripted_node(lambda n: (400, {}))
    try:
        client = RotaClient([f"127.0.0.1:{node.server_address[1]}"])
        client._discover_needed = False
        task = Task(id=9, group="g", data="", timespec=0, ownerid=client.client_id)
        # Five seconds of a thirty-second lease left: late, confirmed by a renewal only.
        lease = Lease(client, task, 30_000, claimed_at=time.monotonic() - 25)
        deadline = time.monotonic() + 5
        while not posts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert posts, "the first renewal was sent"
        lease.abandon()
        started = time.monotonic()
        assert not lease.wait_confirmed(10)
        assert time.monotonic() - started < 5, "waited for a renewal that never comes"
    finally:
        node.shutdown()
        node.server_close()


def test_a_probe_answered_with_an_error_is_not_silence() -> None:
    """A node that answers a waiting call's probe with an error (busy, unauthorised,
    stopping) is not frozen; one probe answers for every call waiting there meanwhile."""
    import http.server

    gets: List[str] = []

    class Busy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            gets.append(self.path)
            answer = b'{"error":"busy"}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"], call_timeout=0.5)
        busy = Node.parse(f"127.0.0.1:{server.server_address[1]}")
        assert client._still_answers(busy)
        assert client._still_answers(busy)
        assert gets == ["/cluster"], "the second call used the first one's probe"
        assert not client._still_answers(Node.parse(f"127.0.0.1:{closed.getsockname()[1]}"))
    finally:
        closed.close()
        server.shutdown()
        server.server_close()


def test_a_finish_alone_refused_as_a_reused_id_asks_again_with_next() -> None:
    """A finish with next refused (409) although an earlier send of it was on its way
    into the log: the finish alone under that id is a reused id (422), and the client
    asks again with next, which the cluster answers with the first outcome."""
    refused = {"error": "this cluster cannot log a finish with `next` yet: ..."}

    def answer(body: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
        if len(seen) == 1:
            return 409, refused
        if "next" not in body:
            return 422, {"error": "request id reused"}
        return 200, {"tasks": []}

    server, seen = _json_node(answer)
    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"])
        client._discover_needed = False
        assert client.finish_and_claim(5, group="g", duration_ms=1000) == []
        assert [("next" in body) for body in seen] == [True, False, True], seen
        assert len({body["requestid"] for body in seen}) == 1, "one request id throughout"
    finally:
        server.shutdown()
        server.server_close()


# -- TLS set up wrong: a configuration error at once, not a retry until give_up_after ----


@pytest.fixture
def tls_files(tmp_path: Path) -> Dict[str, str]:
    """A throwaway cluster CA, another CA, a node certificate the first signed for
    127.0.0.1, and one it signed for another name only (``openssl``)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    for ca in ("ca", "other-ca"):
        run(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=rota test {ca}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
        )
    for node, names in (("node", "IP:127.0.0.1,DNS:localhost"), ("elsewhere", "DNS:rota.example")):
        run(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{node}.key", "-out", f"{node}.csr", "-subj", f"/CN={node}",
        )
        (tmp_path / f"{node}.ext").write_text(f"subjectAltName={names}\n")
        run(
            "x509", "-req", "-in", f"{node}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{node}.pem", "-days", "2", "-extfile", f"{node}.ext",
        )
    return {name: str(tmp_path / f"{name}.pem") for name in ("ca", "other-ca", "node", "elsewhere")}


@pytest.fixture
def no_rota_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROTA_CA", raising=False)
    monkeypatch.delenv("ROTA_TOKEN", raising=False)


def _accepting(handle: Callable[[socket.socket], None]) -> Tuple[socket.socket, str, List[int]]:
    """A listener on 127.0.0.1 that hands each connection to ``handle`` on a thread of its
    own until it is closed: the listener (close it to stop), its address, and one entry
    per connection accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: List[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(1)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}", accepted


def _tls_node(cert: str) -> Tuple[str, List[int], Callable[[], None]]:
    """A node serving TLS with ``cert`` (and its key beside it) on 127.0.0.1: it answers
    every request with ``200 []`` on a connection of its own. Its address, how many
    connections it accepted, and its stop."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, cert[: -len(".pem")] + ".key")

    def answer(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                if read_request(tls) is not None:
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]")
        except OSError:  # a handshake the client broke off, or plain HTTP
            conn.close()

    server, addr, accepted = _accepting(answer)
    return addr, accepted, server.close


@pytest.fixture
def tls_node(tls_files: Dict[str, str]) -> Iterator[Tuple[str, List[int]]]:
    addr, accepted, stop = _tls_node(tls_files["node"])
    try:
        yield addr, accepted
    finally:
        stop()


def test_a_tls_node_answers_a_client_with_its_ca(tls_files: Dict[str, str], tls_node: Tuple[str, List[int]], no_rota_env: None) -> None:
    addr, _ = tls_node
    client = RotaClient(addr, ca=tls_files["ca"], give_up_after=10)
    client._discover_needed = False
    assert client.groups() == []
    client = RotaClient(f"https://{addr}", ca=tls_files["ca"], give_up_after=10)
    client._discover_needed = False
    assert client.groups() == []


def test_a_certificate_another_ca_signed_fails_at_once(
    tls_files: Dict[str, str], tls_node: Tuple[str, List[int]], no_rota_env: None
) -> None:
    """A client given the wrong CA raises at once, naming the node and the CA file to
    check, instead of retrying the handshake until ``give_up_after``; the error is still
    an ``Unavailable`` for code that catches that."""
    addr, accepted = tls_node
    client = RotaClient(addr, ca=tls_files["other-ca"], give_up_after=10)
    started = time.monotonic()
    with pytest.raises(Misconfigured) as raised:
        client.groups()
    assert time.monotonic() - started < 2.0
    error = raised.value
    assert isinstance(error, Unavailable)
    assert error.node == addr
    text = str(error)
    assert addr in text and "certificate" in text
    assert "ca=" in text and "ROTA_CA" in text and tls_files["other-ca"] in text
    # The leader lookup's handshake and the call's: not one per retry pause.
    assert len(accepted) <= 3, accepted


def test_an_https_url_without_a_ca_says_which_trust_store_refused(
    tls_files: Dict[str, str], tls_node: Tuple[str, List[int]], no_rota_env: None
) -> None:
    addr, _ = tls_node
    client = RotaClient(f"https://{addr}", give_up_after=10)
    started = time.monotonic()
    with pytest.raises(Misconfigured, match="system's trust store") as raised:
        client.groups()
    assert time.monotonic() - started < 2.0
    assert addr in str(raised.value) and "ca=" in str(raised.value)


def test_ca_from_the_environment_is_named_too(
    tls_files: Dict[str, str], tls_node: Tuple[str, List[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROTA_CA", tls_files["other-ca"])
    client = RotaClient(tls_node[0], give_up_after=10)
    client._discover_needed = False
    with pytest.raises(Misconfigured, match="ROTA_CA") as raised:
        client.groups()
    assert tls_files["other-ca"] in str(raised.value)


def test_a_certificate_for_another_name_fails_at_once(tls_files: Dict[str, str], no_rota_env: None) -> None:
    addr, _, stop = _tls_node(tls_files["elsewhere"])
    try:
        client = RotaClient(addr, ca=tls_files["ca"], give_up_after=10)
        client._discover_needed = False
        started = time.monotonic()
        with pytest.raises(Misconfigured, match="not valid for '127.0.0.1'") as raised:
            client.groups()
        assert time.monotonic() - started < 2.0
        assert addr in str(raised.value)
    finally:
        stop()


def test_a_node_set_up_wrong_does_not_stop_a_call_another_answers(
    tls_files: Dict[str, str], tls_node: Tuple[str, List[int]], no_rota_env: None
) -> None:
    """The first node's certificate is for another name: the call goes on to the next
    node, which answers, without the retry pause."""
    wrong, _, stop = _tls_node(tls_files["elsewhere"])
    try:
        client = RotaClient([wrong, tls_node[0]], ca=tls_files["ca"], give_up_after=10, retry_pause=5)
        client._discover_needed = False
        started = time.monotonic()
        assert client.groups() == []
        assert time.monotonic() - started < 2.0
    finally:
        stop()


def test_a_tls_client_of_a_plain_http_node_fails_at_once(tls_files: Dict[str, str], no_rota_env: None) -> None:
    """A node serving plain HTTP answers the TLS hello with a 400 (as hyper does)."""

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    server, addr, _ = _accepting(answer)
    try:
        client = RotaClient(f"https://{addr}", ca=tls_files["ca"], give_up_after=10)
        client._discover_needed = False
        started = time.monotonic()
        with pytest.raises(Misconfigured, match="serving plain HTTP") as raised:
            client.groups()
        assert time.monotonic() - started < 2.0
        assert addr in str(raised.value) and "http://" in str(raised.value)
    finally:
        server.close()


def test_a_handshake_the_node_breaks_off_is_still_retried(tls_files: Dict[str, str], no_rota_env: None) -> None:
    """A node that closes the connection during the handshake (restarting, overloaded)
    may answer the next one: retried until give_up_after, as a refused connection is."""
    server, addr, accepted = _accepting(lambda conn: conn.close())
    try:
        client = RotaClient(addr, ca=tls_files["ca"], give_up_after=1.0)
        client._discover_needed = False
        with pytest.raises(Unavailable) as raised:
            client.groups()
        assert not isinstance(raised.value, Misconfigured)
        assert raised.value.waited >= 1.0 and len(accepted) >= 3
    finally:
        server.close()


def test_a_plain_http_client_of_a_tls_node_is_told_to_use_tls(
    tls_files: Dict[str, str], tls_node: Tuple[str, List[int]], no_rota_env: None
) -> None:
    """A node that closes a plain-HTTP connection without a byte of an answer (as
    OpenSSL does) may just be restarting, so it is retried; the error asks whether the
    node serves TLS."""
    client = RotaClient(tls_node[0], give_up_after=1.0)
    client._discover_needed = False
    with pytest.raises(Unavailable) as raised:
        client.groups()
    assert "is the node serving TLS? then use an https:// URL and ca=" in str(raised.value)


def test_a_tls_alert_to_plain_http_fails_at_once_with_the_hint(no_rota_env: None) -> None:
    """A Rota node serving TLS answers a request in plain HTTP with a TLS alert record
    (rustls: ``15 03 03 00 02 02 32``, decode_error) and closes: no HTTP node answers so,
    and the client says to use TLS at once."""
    node, thread = _serve_bytes(b"\x15\x03\x03\x00\x02\x02\x32")
    client = RotaClient(node.addr, give_up_after=10)
    client._discover_needed = False
    started = time.monotonic()
    with pytest.raises(Misconfigured) as raised:
        client.groups()
    assert time.monotonic() - started < 2.0
    text = str(raised.value)
    assert node.addr in text and "is the node serving TLS?" in text and "https://" in text and "ca=" in text
    thread.join(5)
    # At the pool, the same is a SetupError (a TransportError), whichever way it came.
    node, thread = _serve_bytes(b"\x16\x03\x01\x00\x05hello\r\n\r\n")
    with pytest.raises(SetupError):
        Pool().request(node, "GET", "/", None, 5.0)
    thread.join(5)


# -- a renewal rejected with a definite 4xx ends the lease at once ------------------------


@pytest.mark.parametrize(
    "status, message",
    [
        (401, "the token is unknown or revoked; send `Authorization: Bearer <token>`"),
        (403, "this token's role may not write to group g"),
        (400, "update 0: a claim duration of 9000000000 ms is over the cluster's longest"),
        (422, "request id r-1 was already used for a different request"),
    ],
)
def test_a_renewal_rejected_loses_the_lease_at_once(status: int, message: str) -> None:
    """A node answers the renewal with a definite 4xx (the token was revoked while the
    task ran, or no node will take this renewal): the lease is lost at once, as refused,
    with the node's reason, not retried until it runs out and reported as expired."""
    from rota import Lease

    server, seen = _json_node(lambda body: (status, {"error": message}))
    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"])
        client._discover_needed = False
        task = Task(id=9, group="g", data="", timespec=0, ownerid=client.client_id)
        lease = Lease(client, task, 30_000, renew_every_ms=50)
        started = time.monotonic()
        assert lease.wait_lost(5), "still renewing after the token was refused"
        assert time.monotonic() - started < 2.0
        lost = lease.lost_reason
        assert lost is not None and lost.reason == "refused"
        assert str(status) in str(lost) and message in str(lost) and "renewal was refused" in str(lost)
        with pytest.raises(LeaseLost, match="renewal was refused") as checked:
            lease.check()
        assert checked.value.reason == "refused" and checked.value.errors == lost.errors
        time.sleep(0.3)
        assert len(seen) == 1 and seen[0]["_path"] == "/update", "refused once, asked once"
        with pytest.raises(LeaseLost):
            lease.finish()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [503, 421, 425])
def test_a_renewal_without_a_definite_answer_is_still_retried_until_the_lease_runs_out(status: int) -> None:
    from rota import Lease

    server, seen = _json_node(lambda body: (status, {"error": "not now"}))
    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"], retry_pause=0.05)
        client._discover_needed = False
        task = Task(id=9, group="g", data="", timespec=0, ownerid=client.client_id)
        lease = Lease(client, task, 1_500, renew_every_ms=100)
        assert not lease.wait_lost(1.0)
        assert lease.wait_lost(5)
        assert lease.lost_reason is not None and lease.lost_reason.reason == "expired"
        assert len(seen) >= 3
    finally:
        server.shutdown()
        server.server_close()


def test_a_worker_reports_a_lease_lost_to_a_revoked_token(caplog: pytest.LogCaptureFixture) -> None:
    """The handler's ``lease.check()`` raises the refusal, and the worker logs and counts
    the lease as lost with the node's reason."""
    from rota import Worker

    claims: List[int] = []

    def answer(body: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
        if "group" in body:  # a claim: one task, then none
            claims.append(1)
            if len(claims) > 1:
                return 200, {"tasks": []}
            return 200, {"tasks": [{"id": 5, "group": "g", "data": "", "timespec": -30_000, "ownerid": body["clientid"]}]}
        return 401, {"error": "the token is unknown or revoked"}

    server, _ = _json_node(answer)
    seen: List[BaseException] = []

    def handler(task: Task, lease: Any) -> None:
        lease.wait_lost(10)
        try:
            lease.check()
        except LeaseLost as e:
            seen.append(e)
            raise

    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"])
        client._discover_needed = False
        w = Worker(client, "g", handler, lease_ms=300, wait_ms=100)
        with caplog.at_level("WARNING", logger="rota.worker"):
            w.start()
            deadline = time.monotonic() + 5
            while w.lost == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert w.stop(timeout=5)
        assert w.lost == 1 and w.finished == 0
        assert seen and seen[0].reason == "refused" and "401" in str(seen[0])  # type: ignore[attr-defined]
        assert any("lease lost" in r.getMessage() and "401" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        server.shutdown()
        server.server_close()


def test_a_long_wait_for_jobs_goes_as_a_post_and_falls_back_to_the_get_of_an_older_build() -> None:
    """Past 8 KiB of query the wait goes as a POST; a node of a build before the POST
    answers 405, and gets the GET (which it takes up to 64 KiB) after all."""
    import http.server
    import json

    asked: List[str] = []

    class OldNode(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, reply: Dict[str, Any]) -> None:
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            asked.append("POST " + self.path)
            self._answer(405, {"error": "method not allowed"})

        def do_GET(self) -> None:  # noqa: N802
            asked.append("GET " + self.path.split("?")[0])
            self._answer(200, {"finished": False, "jobs": [], "missing": ["k"] * 5})

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OldNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = RotaClient([f"127.0.0.1:{server.server_address[1]}"])
        client._discover_needed = False
        keys = [f"{n:03}" + "k" * 100 for n in range(100)]  # about 10 KiB of query
        waited = client.wait_jobs("g", keys)
        assert asked == ["POST /jobs/wait", "GET /jobs/wait"], asked
        assert waited.finished is False and len(waited.missing) == 5
        # Too long for any GET: the 405 stands.
        asked.clear()
        with pytest.raises(Rejected, match="405"):
            client.wait_jobs("g", [f"{n:03}" + "k" * 250 for n in range(300)])
        assert asked == ["POST /jobs/wait"], asked
    finally:
        server.shutdown()
        server.server_close()
