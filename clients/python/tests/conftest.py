"""A real local three-node cluster for the whole session, started with ``rota dev up``.

The ``rota`` binary comes from ``ROTA_BIN`` (default ``~/.cache/rota/target/debug/rota``);
it finds ``rota-node`` beside itself or through ``ROTA_NODE_BIN``. The cluster lives in
``ROTA_TEST_DIR`` if set (scripts/test-python sets it, to stop it whatever happens),
else in a temporary directory, and is stopped with ``rota dev down`` at the end, also
when tests fail.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from rota import RotaClient

NODES = 3


def read_request(conn: socket.socket, pending: bytes = b"") -> Optional[Tuple[bytes, bytes, bytes]]:
    """Reads one HTTP/1.1 request with a Content-Length body (or none) off ``conn``,
    after the bytes already read (``pending``): its head (without the blank line), its
    body, and the bytes read past it; ``None`` if the connection closed first."""
    while b"\r\n\r\n" not in pending:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        pending += chunk
    head, _, rest = pending.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return head, rest[:length], rest[length:]


def rota_bin() -> str:
    path = os.environ.get("ROTA_BIN") or os.path.expanduser("~/.cache/rota/target/debug/rota")
    if not os.path.isfile(path):
        pytest.exit(f"no rota binary at {path}: build it (cargo build -p cli -p raft-node) or set ROTA_BIN", 2)
    return path


class Cluster:
    """The local cluster: its URLs, and ways to kill and restart its nodes."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.dir = directory
        self.urls: List[str] = []

    def up(self) -> List[str]:
        """``rota dev up``: starts (or restarts) every node that is not running and
        returns once all are ready."""
        out = subprocess.run(
            [self.binary, "dev", "up", "--nodes", str(NODES), "--dir", str(self.dir)],
            check=True, capture_output=True, text=True, timeout=120,
        )
        self.urls = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        assert len(self.urls) == NODES, out.stdout + out.stderr
        return self.urls

    def down(self) -> None:
        subprocess.run(
            [self.binary, "dev", "down", "--dir", str(self.dir)],
            check=False, capture_output=True, text=True, timeout=120,
        )

    def status(self, url: str) -> Dict[str, object]:
        with urllib.request.urlopen(url + "/cluster", timeout=5) as answer:
            obj: Dict[str, object] = json.loads(answer.read())
            return obj

    def url_of(self, node_id: int) -> str:
        cluster = json.loads((self.dir / "cluster.json").read_text())
        for node in cluster["nodes"]:
            if node["id"] == node_id:
                return f"http://127.0.0.1:{node['api_port']}"
        raise KeyError(node_id)

    def leader_id(self, timeout: float = 20.0) -> int:
        """The leader's id as the nodes that answer see it."""
        deadline = time.monotonic() + timeout
        while True:
            for url in self.urls:
                try:
                    leader = self.status(url).get("leader")
                except OSError:
                    continue
                if isinstance(leader, int):
                    return leader
            if time.monotonic() > deadline:
                raise TimeoutError("no leader")
            time.sleep(0.1)

    def leader_url(self) -> str:
        return self.url_of(self.leader_id())

    def follower_urls(self) -> List[str]:
        leader = self.leader_url()
        return [u for u in self.urls if u != leader]

    def pid(self, node_id: int) -> int:
        return int((self.dir / f"node-{node_id}.pid").read_text().strip())

    def kill(self, node_id: int) -> None:
        """SIGKILL of node ``node_id`` through its pid file; returns once it is gone."""
        pid = self.pid(node_id)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return
            if state in ("Z", "X"):
                return
            time.sleep(0.02)
        raise TimeoutError(f"node {node_id} (pid {pid}) did not exit")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    given = os.environ.get("ROTA_TEST_DIR")
    directory = Path(given) if given else tmp_path_factory.mktemp("rota-dev")
    c = Cluster(rota_bin(), directory)
    try:
        c.up()
        yield c
    finally:
        c.down()


@pytest.fixture
def client(cluster: Cluster) -> Iterator[RotaClient]:
    with RotaClient(cluster.urls) as c:
        yield c


@pytest.fixture
def group() -> str:
    """A group name no other test uses."""
    return "py-" + uuid.uuid4().hex[:12]


def wait_until(predicate, timeout: float = 10.0, every: float = 0.05, what: Optional[str] = None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what or "condition not met in time")
        time.sleep(every)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "drain: the 10 000-task drain with a node restart (slow)")


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """The drain (it restarts a node) runs last, after the quick tests."""
    items.sort(key=lambda item: item.get_closest_marker("drain") is not None)
