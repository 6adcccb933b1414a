"""The server a Space runs (`--web`) under issue 43's shapes: a UI socket that never reads, 1,000 steps of 1 MB
arguments, uploads and Gradio sessions under `/web`, and 16 MiB WebSocket messages of `{}`s.

    python bench/security/web_server.py [--steps 1000] [--server-repo DIR]

Starts `python -m sqlenv serve --web` on 127.0.0.1 (a free port; Gradio's temp folder one of the bench's own;
stopped at the end) and plays each shape against it, bounded in count and time:

1. UI socket: a WebSocket handshake to `/ws/ui` that is never read, and a session on `/ws` that asks for 30 MB of
   replies and never reads them; then 5 visitors at once take 5 steps of 1 MB arguments each the way the page
   steps (`POST /web/step` where the server has it, else over `/ws`, as SQLEnv's page does), each step given
   `--wait` seconds (a visit ends at a step not answered), and one honest session 25 steps over `/ws`: how many
   were answered, and the longest wait.
2. 1 MB arguments: `--steps` steps of 1,000,000-character arguments the page's way (`/web/step`, else `/ws`,
   resetting as episodes end); the server's RSS before, and at rest after (past the memory trim).
3. Uploads: 50 files of 0.9 MB to `/web/gradio_api/upload`: the replies, and the bytes left in the temp folder.
4. Gradio sessions: 200 event calls with 0.96 MB inputs, each with a new session hash: the replies, RSS after.
5. Large messages: a 16 MiB message of `{}`s on one connection, then on four at once, then 1 MiB of them on
   twelve at once, while an honest session steps and `/health` is asked every 0.1 s: whether each was parsed
   (answered) or its connection closed, the longest honest step and `/health`, and RSS after.

`--server-repo DIR` runs the server from another checkout (e.g. `git archive main | tar -x -C DIR`, with DIR's
`data/builtin` built) to measure the same shapes before a change. The machine is shared: times are upper bounds.
Prints, last line one JSON object.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from serverproc import ServerProcess  # noqa: E402
from soak import UI_HANDSHAKE, many_values, upload_body  # noqa: E402  (bench/security/, the script's folder)

from sqlenv.server.app import TRIM_INTERVAL_S  # noqa: E402

MB = 1_000_000
MIB = 1024 * 1024


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def http(url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 60.0) -> int:
    """The reply's status; 0 when none came within `timeout` or the connection failed."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return 0


def connect(port: int, **kwargs):
    from websockets.sync.client import connect as ws_connect

    return ws_connect(f"ws://127.0.0.1:{port}/ws", proxy=None, compression=None, open_timeout=30, max_size=None,
                      **kwargs)


def ws_request(ws, message: dict, timeout: float = 60.0) -> dict:
    ws.send(json.dumps(message))
    return json.loads(ws.recv(timeout=timeout))


def serves_web_step(url: str) -> bool:
    """Whether the server has OpenEnv's shared-episode `POST /web/step` (404 where it has not)."""
    return http(url + "/web/step", json.dumps({"action": {"action_type": "QUERY", "argument": "SELECT 1"}}).encode(),
                timeout=30) != 404


def ui_socket(port: int) -> tuple[socket.socket, bool]:
    """A WebSocket handshake to `/ws/ui`, never read after its reply's status line: (the socket, accepted)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(UI_HANDSHAKE)
    return sock, sock.recv(12).endswith(b"101")


class Stepper:
    """Steps the page's way: `POST /web/step` on OpenEnv's web interface, else a `/ws` session of its own (reset
    whenever its episode ends)."""

    def __init__(self, url: str, port: int, web_step: bool):
        self.url, self.web_step = url, web_step
        self.ws = None if web_step else connect(port)
        self.done = True

    def step(self, argument: str, timeout: float) -> bool:
        """One step; whether it was answered within `timeout` seconds."""
        action = {"action_type": "QUERY", "argument": argument}
        if self.web_step:
            return http(self.url + "/web/step", json.dumps({"action": action}).encode(), timeout=timeout) == 200
        if self.done:
            ws_request(self.ws, {"type": "reset", "data": {}}, timeout)
        reply = ws_request(self.ws, {"type": "step", "data": action}, timeout)
        self.done = reply["data"]["done"]
        return reply["type"] == "observation"

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()


def shape_ui_socket(server: ServerProcess, web_step: bool, wait_s: float) -> dict:
    sock, accepted = ui_socket(server.port)
    silent = connect(server.port, max_queue=1)  # stops reading once a reply waits
    silent.send(json.dumps({"type": "reset", "data": {}}))
    silent.send(json.dumps({"type": "step", "data": {"action_type": "ANSWER", "argument": "7" * MB}}))
    for _ in range(30):
        silent.send(json.dumps({"type": "state"}))
    page_waits: list[float] = []
    argument = "x" * MB  # OpenEnv's web interface pushed its whole log, arguments and all, to every UI socket

    def visitor(_: int) -> None:  # 5 steps, each given `wait_s`; a step not answered ends the visit
        stepper = Stepper(server.url, server.port, web_step)
        try:
            for _ in range(5):
                started = time.monotonic()
                if not stepper.step(argument, wait_s):
                    return
                page_waits.append(time.monotonic() - started)
        except Exception:  # noqa: BLE001 - not answered in time
            pass
        finally:
            stepper.close()

    with concurrent.futures.ThreadPoolExecutor(5) as pool:  # 5 visitors at once (within the per-client limit)
        list(pool.map(visitor, range(5)))
    honest = Stepper(server.url, server.port, web_step=False)
    honest_waits = []
    for _ in range(25):
        started = time.monotonic()
        honest.step("SELECT 1", 60)
        honest_waits.append(time.monotonic() - started)
    honest.close()
    sock.close()
    silent.close_socket()
    return {"ui_socket_accepted": accepted, "page_steps_answered": len(page_waits), "page_steps_sent": 25,
            "page_step_max_s": round(max(page_waits, default=float("nan")), 3),
            "honest_ws_step_max_s": round(max(honest_waits), 3), "page_way": "/web/step" if web_step else "/ws"}


def shape_big_arguments(server: ServerProcess, web_step: bool, steps: int) -> dict:
    before, sessions = rss_mb(server.proc.pid), server.sessions()["open"]
    stepper = Stepper(server.url, server.port, web_step)
    argument = "x" * MB
    started, answered, peak = time.monotonic(), 0, before
    for i in range(steps):
        answered += stepper.step(argument, 60)
        if i % 50 == 0:
            peak = max(peak, rss_mb(server.proc.pid))
    took = time.monotonic() - started
    stepper.close()
    server.wait_sessions(sessions, timeout=30)
    time.sleep(TRIM_INTERVAL_S + 2.0)  # past the server's memory trim: what is still held
    after = rss_mb(server.proc.pid)
    return {"big_steps": steps, "big_steps_answered": answered, "big_steps_s": round(took, 1),
            "big_rss_before_mb": round(before), "big_rss_peak_mb": round(peak), "big_rss_after_mb": round(after),
            "big_rss_growth_mb": round(after - before)}


def shape_uploads(server: ServerProcess, temp: Path) -> dict:
    statuses: dict[int, int] = {}
    for _ in range(50):
        boundary = uuid.uuid4().hex
        status = http(server.url + "/web/gradio_api/upload", upload_body(boundary),
                      {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        statuses[status] = statuses.get(status, 0) + 1
    kept = sum(p.stat().st_size for p in temp.rglob("*") if p.is_file())
    return {"upload_statuses": statuses, "upload_bytes_kept": kept}


def shape_gradio_sessions(server: ServerProcess, count: int = 200) -> dict:
    before = rss_mb(server.proc.pid)
    statuses: dict[int, int] = {}
    for _ in range(count):
        body = json.dumps({"data": [[], "QUERY", "x" * 960_000], "fn_index": 1, "trigger_id": 1,
                           "session_hash": uuid.uuid4().hex[:11]}).encode()
        status = http(server.url + "/web/gradio_api/queue/join", body)
        statuses[status] = statuses.get(status, 0) + 1
    time.sleep(TRIM_INTERVAL_S + 2.0)
    return {"gradio_calls": count, "gradio_statuses": statuses,
            "gradio_rss_growth_mb": round(rss_mb(server.proc.pid) - before)}


def shape_large_messages(server: ServerProcess) -> dict:
    before = rss_mb(server.proc.pid)
    stop = threading.Event()
    health: list[float] = []
    steps: list[float] = []
    peak = [before]

    def poll_health() -> None:  # and the server's RSS at its highest
        while not stop.is_set():
            started = time.monotonic()
            http(server.url + "/health", timeout=30)
            health.append(time.monotonic() - started)
            peak[0] = max(peak[0], rss_mb(server.proc.pid))
            stop.wait(0.1)

    def honest_steps() -> None:
        with connect(server.port) as ws:
            ws_request(ws, {"type": "reset", "data": {"step_budget": 1000}})
            while not stop.is_set():
                started = time.monotonic()
                ws_request(ws, {"type": "step", "data": {"action_type": "QUERY", "argument": "SELECT 1"}})
                steps.append(time.monotonic() - started)
                stop.wait(0.05)

    big = many_values(16 * MIB)
    under_limit = many_values(MIB)  # under the size limit, 350,000 objects
    outcomes: list[str] = []

    def send_big(message: str = big) -> None:
        with connect(server.port) as ws:
            ws_request(ws, {"type": "reset", "data": {}})
            try:
                ws.send(message)
                ws.recv(timeout=60)  # OpenEnv answers an error, once it has parsed the message
                outcomes.append("parsed")
            except Exception:  # noqa: BLE001 - closed by the server (while the message was still going out)
                outcomes.append("closed")

    watchers = [threading.Thread(target=poll_health), threading.Thread(target=honest_steps)]
    for thread in watchers:
        thread.start()
    time.sleep(1.0)
    send_big()
    one_peak = rss_mb(server.proc.pid)  # once its reply came (or its connection closed)
    attackers = [threading.Thread(target=send_big) for _ in range(4)]
    for thread in attackers:
        thread.start()
    for thread in attackers:
        thread.join(120)
    four_peak = rss_mb(server.proc.pid)
    attackers = [threading.Thread(target=send_big, args=(under_limit,)) for _ in range(12)]
    for thread in attackers:
        thread.start()
    for thread in attackers:
        thread.join(120)
    time.sleep(1.0)
    stop.set()
    for thread in watchers:
        thread.join(60)
    return {"large_messages_sent": "1 + 4 of 16 MiB, then 12 of 1 MiB", "large_outcomes": outcomes,
            "large_max_health_s": round(max(health), 3),
            "large_max_honest_step_s": round(max(steps), 3), "large_honest_steps": len(steps),
            "large_rss_peak_growth_mb": round(peak[0] - before), "large_rss_after_one_mb": round(one_peak - before),
            "large_rss_after_four_mb": round(four_peak - before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps of 1 MB arguments (default 1,000)")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds each page step is given (default 10)")
    parser.add_argument("--server-repo", type=Path, default=REPO,
                        help="the checkout whose `sqlenv` the server runs (default this one)")
    args = parser.parse_args()
    # The client library logs a server's close in the middle of a 16 MiB send, and wants `with` around connect().
    logging.getLogger("websockets").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="connect\\(\\) must be used as a context manager")
    if not 1 <= args.steps <= 5000:
        parser.error("--steps must be in 1..5000")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; server from {args.server_repo}")
    temp = Path(tempfile.mkdtemp(prefix="web-bench-gradio-"))
    os.environ["GRADIO_TEMP_DIR"] = str(temp)
    serve_args = ["serve", "--dataset", "builtin", "--split", "train", "--host", "127.0.0.1", "--port", "{port}",
                  "--web"]
    command = [sys.executable, "-c", "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
               "runpy.run_module('sqlenv', run_name='__main__')", str(args.server_repo.resolve()), *serve_args]
    figures: dict = {}
    with ServerProcess(command=command) as server:
        figures["rss_start_mb"] = round(rss_mb(server.proc.pid))
        web_step = serves_web_step(server.url)
        for name, shape in (("ui socket", lambda: shape_ui_socket(server, web_step, args.wait)),
                            ("1 MB arguments", lambda: shape_big_arguments(server, web_step, args.steps)),
                            ("uploads", lambda: shape_uploads(server, temp)),
                            ("Gradio sessions", lambda: shape_gradio_sessions(server)),
                            ("large messages", lambda: shape_large_messages(server))):
            started = time.monotonic()
            result = shape()
            print(f"{name} ({time.monotonic() - started:.0f} s): {json.dumps(result)}", flush=True)
            figures.update(result)
        figures["server_alive"] = server.proc.poll() is None
        figures["rss_end_mb"] = round(rss_mb(server.proc.pid))
    figures["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
