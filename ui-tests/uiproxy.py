"""A stand-in for a node's /ui while the rota-node binary predates the files in
raft-node/ui: serves /ui and /ui/<path> from the work tree with the node's headers
(content security policy, nosniff) and forwards every other request, /ui/config
included, to a real node. Used by the tests when ROTA_UI_ASSETS=tree; by hand:

    python3 ui-tests/uiproxy.py http://127.0.0.1:7001 8080   # then open http://127.0.0.1:8080/ui
"""

from __future__ import annotations

import http.client
import http.server
import os
import sys
import threading
import urllib.parse

UI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "raft-node", "ui")

# Keep in step with raft-node/src/ui.rs.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "mjs": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
    "png": "image/png",
    "json": "application/json",
    "txt": "text/plain; charset=utf-8",
}


def content_type(path: str) -> str:
    if path.endswith("LICENSE"):
        return "text/plain; charset=utf-8"
    return TYPES.get(path.rsplit(".", 1)[-1], "application/octet-stream")


class Handler(http.server.BaseHTTPRequestHandler):
    backend: tuple[str, int] = ("127.0.0.1", 0)
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _asset(self) -> bool:
        path = urllib.parse.urlsplit(self.path).path
        if path in ("/ui", "/ui/"):
            rel = "index.html"
        elif path.startswith("/ui/") and path != "/ui/config":
            rel = urllib.parse.unquote(path[len("/ui/"):])
        else:
            return False
        full = os.path.realpath(os.path.join(UI_DIR, rel))
        if not full.startswith(os.path.realpath(UI_DIR) + os.sep) or not os.path.isfile(full):
            body = b'{"error":"no dashboard file"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
        else:
            with open(full, "rb") as f:
                body = f.read()
            self.send_response(200)
            self.send_header("Content-Type", content_type(rel))
            self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(*self.backend, timeout=90)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError as e:
            data = ('{"error":"proxy: %s"}' % e).encode()
            self.send_response(502)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        finally:
            conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if not self._asset():
            self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()


class Proxy:
    """A proxy in a thread: serves the tree's /ui, forwards the rest to `backend_url`."""

    def __init__(self, backend_url: str, port: int = 0) -> None:
        u = urllib.parse.urlsplit(backend_url)
        handler = type("BoundHandler", (Handler,), {"backend": (u.hostname, u.port)})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        # A browser that leaves a page drops its long polls: not worth a traceback.
        self.server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    p = Proxy(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(p.url + "/ui", flush=True)
    try:
        p.thread.join()
    except KeyboardInterrupt:
        p.close()
