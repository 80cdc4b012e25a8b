"""A tiny LSP client for tests: JSON-RPC with Content-Length framing over a subprocess's stdio.

Answers the server's own requests (workspace/configuration from `config`), keeps notifications, and
exposes `request` / `notify` / `wait_for`.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time


class LspClient:
    def __init__(self, cmd: list[str], cwd: str | None = None, config: dict | None = None, env=None):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     cwd=cwd, env=env)
        self.config = config or {}
        self.next_id = 0
        self.responses: dict[int, dict] = {}
        self.notifications: list[dict] = []
        self.server_requests: list[dict] = []
        self.raw_garbage: list[bytes] = []  # anything on stdout that is not a framed message
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    # ------------------------------------------------------------------ wire
    def _send(self, msg: dict) -> None:
        body = json.dumps(msg).encode("utf-8")
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            headers = {}
            while True:
                line = out.readline()
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    break
                if b":" not in line:
                    self.raw_garbage.append(line)
                    continue
                k, v = line.decode("ascii", "replace").split(":", 1)
                headers[k.strip().lower()] = v.strip()
            if "content-length" not in headers:
                continue
            msg = json.loads(out.read(int(headers["content-length"])))
            if "method" in msg and "id" in msg:  # a request from the server
                self.server_requests.append(msg)
                self._answer(msg)
                continue
            with self.cond:
                if "id" in msg:
                    self.responses[msg["id"]] = msg
                else:
                    self.notifications.append(msg)
                self.cond.notify_all()

    def _answer(self, msg: dict) -> None:
        result = None
        if msg["method"] == "workspace/configuration":
            result = [self.config.get(item.get("section")) for item in msg["params"]["items"]]
        self._send({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    # ------------------------------------------------------------------ API
    def request(self, method: str, params, timeout: float = 15.0):
        with self.cond:
            self.next_id += 1
            rid = self.next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        with self.cond:
            while rid not in self.responses:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no response to {method} in {timeout} s")
                self.cond.wait(left)
            msg = self.responses.pop(rid)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result")

    def notify(self, method: str, params) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def wait_for(self, method: str, pred=lambda p: True, timeout: float = 15.0, after: int = 0) -> dict:
        """The first notification `method` (from index `after`) whose params satisfy `pred`."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for n in self.notifications[after:]:
                    if n["method"] == method and pred(n["params"]):
                        return n["params"]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} matching in {timeout} s")
                self.cond.wait(left)

    def mark(self) -> int:
        with self.cond:
            return len(self.notifications)

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def close(self, timeout: float = 10.0) -> int:
        """shutdown + exit; the server's exit status."""
        try:
            self.request("shutdown", None, timeout=timeout)
            self.notify("exit", None)
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
