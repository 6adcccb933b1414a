"""What one request costs the OpenAI-compatible model server (`training.generation.openai_server`, issue 59).

    python bench/security/openai_bodies.py [--body-mb 20] [--server-repo DIR]

Starts the server around the built-in tiny model on 127.0.0.1 (one torch thread; stopped at the end) and, while a
thread asks `/health` every 0.05 s, sends:

1. big: one chat message of `--body-mb` MB (the whole body written, as the issue's client did): the status, seconds
   to the answer, `/health` at its slowest meanwhile, the server's RSS before and at its peak;
2. many: 20,000 short messages: the same figures;
3. fields: `n = "abc"` and `n = 1e400`: the statuses.

`--server-repo DIR` runs the server from another checkout (e.g. `git archive 72f108f | tar -x -C DIR`) to measure
before a change. The machine is shared: times are upper bounds. Prints, last line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from serverproc import ServerProcess, Watch, rss_mb  # noqa: E402


def post(port: int, body: bytes, timeout: float = 300) -> tuple[int | str, float]:
    """Write the whole body (whatever the server answers meanwhile), then read the answer: (status, seconds)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the body was all sent: the answer may still be there to read
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout) as exc:
            return type(exc).__name__, time.monotonic() - started
    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else "no answer"
    return int(status) if status.isdigit() else status, time.monotonic() - started


def measured(server: ServerProcess, name: str, body: bytes) -> dict:
    pid = server.proc.pid
    before = rss_mb(pid)
    with Watch(server.port, pid, interval=0.05, timeout=120) as watch:
        status, seconds = post(server.port, body)
        time.sleep(0.3)
    return {f"{name}_status": status, f"{name}_s": round(seconds, 2),
            f"{name}_health_max_s": watch.health_max_s,
            f"{name}_rss_before_mb": round(before), f"{name}_rss_peak_mb": round(watch.rss_peak)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-mb", type=float, default=20.0, help="MB of the one big message (default 20)")
    parser.add_argument("--server-repo", type=Path, default=REPO, help="the checkout whose server runs")
    args = parser.parse_args()
    if not 0.1 <= args.body_mb <= 100:
        parser.error("--body-mb must be in 0.1..100")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; server from {args.server_repo}")
    command = [sys.executable, "-c", "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
               "runpy.run_module('training.generation.openai_server', run_name='__main__')",
               str(args.server_repo.resolve()), "--model", "builtin:tiny", "--served-name", "tiny", "--port", "{port}",
               "--threads", "1"]
    figures: dict = {"server_repo": str(args.server_repo), "body_mb": args.body_mb}
    message = {"role": "user", "content": "x" * int(args.body_mb * 1_000_000)}
    with ServerProcess(command=command) as server:
        big = json.dumps({"model": "tiny", "max_tokens": 2, "messages": [message]}).encode()
        figures.update(measured(server, "big", big))
        print(json.dumps({k: v for k, v in figures.items() if k.startswith("big")}), flush=True)
        many = json.dumps({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}] * 20_000})
        figures.update(measured(server, "many", many.encode()))
        print(json.dumps({k: v for k, v in figures.items() if k.startswith("many")}), flush=True)
        for name, raw in (("n_abc", b'"abc"'), ("n_1e400", b"1e400")):
            body = b'{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "n": ' + raw + b"}"
            figures[f"{name}_status"] = post(server.port, body)[0]
        figures["server_alive"] = server.proc.poll() is None
    figures["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
