#!/usr/bin/env python3
"""The Python client's own CPU per worker cycle, without a network or a cluster.

Runs RotaClient.claim then RotaClient.delete (the seed's cycle) CYCLES times, ROUNDS
times, against a stub socket that answers each request at once with a recorded answer,
and prints the least CPU time per cycle of the rounds: what the client's code costs a
worker per cycle, apart from the nodes and the kernel. Point ROTA_PY at another
checkout's clients/python/src to compare two versions of the client in turn.

Usage: python3 scripts/bench_python_client.py [cycles per round, default 20000] [rounds, default 5]
"""

import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("ROTA_PY", os.path.join(here, "..", "clients", "python", "src")))

import rota._http as http  # noqa: E402
from rota import RotaClient  # noqa: E402

CLAIM_BODY = (
    b'{"tasks":[{"id":123456,"group":"load","data":"payload-12345",'
    b'"timespec":1795910462391,"ownerid":98765432101}]}'
)
DELETE_BODY = b'{"tasks":[]}'


def answer(body: bytes) -> bytes:
    """An answer with the headers a node sends."""
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-rota-node: 1\r\n"
        b"content-length: %d\r\ndate: Sat, 28 Nov 2026 23:00:00 GMT\r\n\r\n" % len(body)
    ) + body


class StubSocket:
    """Answers a claim with one task and anything else with no task."""

    def __init__(self) -> None:
        self.pending = b""

    def settimeout(self, timeout: float) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        self.pending = answer(CLAIM_BODY if data.startswith(b"POST /claim ") else DELETE_BODY)

    def recv(self, size: int) -> bytes:
        data, self.pending = self.pending[:size], self.pending[size:]
        return data

    def close(self) -> None:
        pass


def main() -> None:
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    http.Pool._connect = lambda self, node, timeout: http._Conn(StubSocket(), node.host)  # type: ignore[assignment]
    client = RotaClient(["http://127.0.0.1:1"])
    client._discover_needed = False
    for _ in range(cycles // 10):  # warm up
        client.delete(client.claim("load", duration_ms=60_000))
    per_cycle = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(cycles):
            client.delete(client.claim("load", duration_ms=60_000))
        per_cycle.append((time.process_time() - started) / cycles * 1e6)
    shown = " ".join(f"{us:.1f}" for us in per_cycle)
    print(f"client CPU per claim + delete, no network: least {min(per_cycle):.1f} us (rounds: {shown})")


if __name__ == "__main__":
    main()
