"""A real SQLEnv server in a subprocess on 127.0.0.1, for tests and benches (bounded start and stop times)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Terminate `proc` and wait for it; kill it if it has not exited within `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def rss_mb(pid: int) -> float:
    """A process's resident memory in MB (NaN once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Watch:
    """`/health` every `interval` seconds and the server's RSS peak, on a thread of their own, while the block runs
    (the security benches' witness of a server under a hostile shape)."""

    def __init__(self, port: int, pid: int, *, interval: float = 0.1, timeout: float = 30):
        self.port, self.pid, self.interval, self.timeout = port, pid, interval, timeout
        self.health: list[float] = []
        self.rss_peak = 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                conn.request("GET", "/health")
                conn.getresponse().read()
            except OSError:
                pass
            finally:
                conn.close()
            self.health.append(time.monotonic() - started)
            self.rss_peak = max(self.rss_peak, rss_mb(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> "Watch":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2 * self.timeout)

    @property
    def health_max_s(self) -> float:
        return round(max(self.health, default=float("nan")), 3)


def health_seconds(server, timeout: float) -> float:
    """Seconds a server (anything with a `url`) takes to answer `/health` healthy."""
    started = time.monotonic()
    with urllib.request.urlopen(server.url + "/health", timeout=timeout) as response:
        assert json.loads(response.read())["status"] == "healthy"
    return time.monotonic() - started


class ServerProcess:
    """`python -m sqlenv serve ...` on 127.0.0.1; `start()` waits for `/health`, `stop()` ends it.

    Args:
        args: the `serve` arguments besides host and port (default: the built-in dataset's train split).
        port: the port (default: a free one, kept across restarts).
        command: a whole command line instead of `python -m sqlenv serve <args>`; `{port}` is filled in.
    """

    def __init__(self, args: list[str] | None = None, port: int | None = None, command: list[str] | None = None):
        self.port = port or free_port()
        self.command = command
        self.args = ["--dataset", "builtin", "--split", "train"] if args is None else list(args)
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks on a full pipe

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> "ServerProcess":
        if self.command is not None:
            cmd = [part.replace("{port}", str(self.port)) for part in self.command]
        else:
            cmd = [sys.executable, "-m", "sqlenv", "serve", *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log[-2000:]}")
            try:
                if get_json(self.url + "/health", timeout=1.0).get("status") == "healthy":
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not healthy within {timeout:g} s: {self.log[-2000:]}")

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        end_process(self.proc, timeout)
        self.proc = None

    @property
    def log(self) -> str:
        """Everything the server printed so far."""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def restart(self) -> None:
        self.stop()
        self.start()

    def sessions(self) -> dict:
        """`GET /sessions`: {"open": environments open now, "max": the session limit}."""
        return get_json(self.url + "/sessions")

    def wait_sessions(self, expected: int, timeout: float = 15.0) -> int:
        """Poll `/sessions` until `open == expected` (the server closes a dropped session asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.sessions()["open"]
            if now == expected or time.monotonic() > deadline:
                return now
            time.sleep(0.1)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
