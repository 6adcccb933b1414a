"""Hostile visitors against the public dashboard: half-sent request heads, login-throttle spellings, and Play.

The figures of issue 43's findings 6, 8 and 10, measured on `python app.py` (of `--repo`, default this checkout,
so that another checkout, such as the commit before the fixes, is measured the same way) on 127.0.0.1, with an owner
password set. Clients on other loopback addresses (127.0.x.y) are other clients. Two apps are started in turn:

- no proxy in front (clients are TCP peers), its descriptor limit lowered to `--app-fds` (8,192) so that a flood
  can reach it:
  - `heads_300`: 300 connections from one client send part of a request head and wait: how many the app closes
    at once, how many by the head deadline, how many it still holds after `--heads-wait` seconds;
  - `heads_flood`: `--flood` (20,000) such connections from 200 clients, as fast as they can be opened (the
    attacker keeps every connection the app keeps), while an honest client GETs / every 0.25 s: honest GETs
    answered, their slowest, and the most descriptors the app held;
  - `play_evict`: an honest visitor opens a Play episode, another client calls New episode 16 times: does the
    honest visitor's next step find its episode;
  - `play_slow`: an honest visitor steps every 0.5 s while 8 visitors run 5 s queries back to back, from 8
    clients and then from one client (whose steps past 2 are refused: pressed again a second later): the honest
    step's median and slowest latency;
- one trusted proxy (`SQLENV_PROXY_HOPS=1`): wrong passwords until the throttle refuses, for a direct client (the
  control), a client that sends an X-Forwarded-For line of its own before the proxy's, and a client that takes a
  new IPv6 address of one /64 each try (`throttled_after`: tries answered "wrong password" before the refusal;
  null: not refused in 8).

    python bench/security/dashboard_hostile.py [--repo PATH] [--flood 20000] [--heads-wait 20] [--play-s 15]

The last line is one JSON object. Loops are bounded (counts and phase times); only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the tests' helpers: a free port, Gradio's event protocol

from app_server import app_config, call_event, wait_http  # noqa: E402
from serverproc import end_process, free_port  # noqa: E402

PASSWORD = "bench password, long and random enough"
SLOW_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"  # stopped at 5 s
PARTIAL_HEAD = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@contextlib.contextmanager
def app(repo: Path, env: dict[str, str], fds: int | None = None):
    """`python app.py` of `repo` on a free port with a password and fresh runs/ and data/; yields (url, pid)."""
    root = Path(tempfile.mkdtemp(prefix="sqlenv-hostile-"))
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SQLENV_", "SPACE_", "OAUTH_"))}
    full_env.update(SQLENV_ADMIN_PASSWORD=PASSWORD, SQLENV_RUNS_DIR=str(root / "runs"),
                    SQLENV_DATA_DIR=str(root / "data"), GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=str(repo),
                    PYTHONUNBUFFERED="1", **env)

    def limit_fds():
        if fds:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))

    with open(root / "app.log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(repo / "app.py"), "--host", "127.0.0.1", "--port", str(port)],
                                cwd=repo, env=full_env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit_fds)
        try:
            wait_http(f"http://127.0.0.1:{port}/", proc)
            yield f"http://127.0.0.1:{port}/", proc.pid
        finally:
            end_process(proc)
            shutil.rmtree(root, ignore_errors=True)


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def partial_head(port: int, source: str) -> socket.socket | None:
    """A connection from `source` that sent part of a request head; None when it could not be opened here."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(source, 0))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return None
        raise  # refused, or not accepted in time: the app is not taking connections
    try:
        sock.sendall(PARTIAL_HEAD)
    except OSError:
        pass  # closed as it was accepted
    sock.setblocking(False)
    return sock


def reap(socks: list[socket.socket]) -> list[socket.socket]:
    """Close the connections the server closed; the rest, still held (non-blocking reads: select() cannot watch
    descriptors past 1,024)."""
    held = []
    for sock in socks:
        try:
            if sock.recv(65536):
                held.append(sock)  # an answer: not closed yet
                continue
        except BlockingIOError:
            held.append(sock)
            continue
        except OSError:
            pass
        sock.close()
    return held


def heads_300(url: str, wait_s: float) -> dict:
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    sent = time.monotonic()
    socks = [s for s in (partial_head(port, "127.0.0.2") for _ in range(300)) if s is not None]
    closed_at: list[float] = []
    held = socks
    while held and time.monotonic() - sent < wait_s:
        before = len(held)
        held = reap(held)
        closed_at += [time.monotonic() - sent] * (before - len(held))
        time.sleep(0.1)
    for sock in held:
        sock.close()
    return {"heads_300_closed_within_1s": sum(t <= 1.0 for t in closed_at),
            "heads_300_closed_by_s": round(max(closed_at), 1) if closed_at else None,
            f"heads_300_held_at_{wait_s:g}s": len(held)}


def heads_flood(url: str, pid: int, attempts: int) -> dict:
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    stop = threading.Event()
    honest: list[float | None] = []  # seconds per GET, None: failed

    def honest_gets():
        import httpx

        while not stop.is_set():
            started = time.monotonic()
            try:
                ok = httpx.get(url, timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            honest.append(time.monotonic() - started if ok else None)
            stop.wait(0.25)

    peak_fds = open_fds(pid)
    thread = threading.Thread(target=honest_gets, daemon=True)
    thread.start()
    held: list[socket.socket] = []
    started = time.monotonic()
    made = failed = 0
    while made < attempts and failed < 20 and time.monotonic() - started < 120:
        try:
            sock = partial_head(port, f"127.0.1.{1 + made % 200}")
        except OSError:
            failed += 1
            continue
        if sock is None:  # this process is out of descriptors: drop what the app closed
            held = reap(held)
            if len(held) > resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256:
                break
            continue
        held.append(sock)
        made += 1
        if made % 1000 == 0:
            held = reap(held)
            peak_fds = max(peak_fds, open_fds(pid))
    for _ in range(20):  # the attack held for 5 s more, honest GETs going on
        peak_fds = max(peak_fds, open_fds(pid))
        time.sleep(0.25)
    stop.set()
    thread.join(10)
    held = reap(held)
    result = {"flood_attempts": made, "flood_connects_failed": failed, "flood_seconds": round(time.monotonic() - started, 1),
              "flood_held_at_end": len(held), "flood_app_fds_peak": peak_fds,
              "flood_honest_gets": len(honest), "flood_honest_answered": sum(t is not None for t in honest),
              "flood_honest_slowest_s": round(max((t for t in honest if t is not None), default=0), 2)}
    for sock in held:
        sock.close()
    return result


def dependency(config: dict, api_name: str) -> dict:
    return next(d for d in config["dependencies"] if d.get("api_name") == api_name and d.get("backend_fn"))


def play(url: str, config: dict, fn: str, data: list, session: str, source: str = "127.0.0.1") -> dict:
    dep = dependency(config, fn)
    return call_event(url, dep["id"], data, queued=dep.get("queue", True) is not False, session_hash=session,
                      source=source, timeout=120)


def new_episode(url, config, session, source="127.0.0.1") -> dict:
    return play(url, config, "new_episode", ["builtin", "eval", "random", 100, None], session, source)


def step(url, config, session, sql, source="127.0.0.1") -> dict:
    return play(url, config, "do_step", ["QUERY", sql, None], session, source)


def play_evict(url: str, config: dict) -> dict:
    new_episode(url, config, "honest-evict")
    started = time.monotonic()
    for i in range(16):
        new_episode(url, config, f"anon-{i}", "127.0.0.2")
    calls_s = time.monotonic() - started
    answer = step(url, config, "honest-evict", "SELECT 1")
    survived = 'data-budget="99"' in str((answer.get("output") or [None, ""])[1])
    return {"play_evict_16_calls_s": round(calls_s, 1), "play_honest_episode_survived": survived}


def play_slow(url: str, config: dict, seconds: float, sources: list[str], label: str) -> dict:
    stop = threading.Event()
    sessions = [(source, f"{label}-slow-{i}") for i, source in enumerate(sources)]
    for source, session in sessions:
        new_episode(url, config, session, source)
    new_episode(url, config, f"{label}-honest")

    def hostile(source, session):
        while not stop.is_set():
            answer = step(url, config, session, SLOW_SQL, source)
            if 'id="play-slots"' in str(answer.get("output")):
                stop.wait(1.0)  # refused (two of this client's steps run): pressed again a second later

    threads = [threading.Thread(target=hostile, args=s, daemon=True) for s in sessions]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    latencies = []
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < seconds:
        i += 1
        began = time.monotonic()
        step(url, config, f"{label}-honest", f"SELECT {i}")
        latencies.append(time.monotonic() - began)
        time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(30)
    return {f"play_step_{label}_median_s": round(statistics.median(latencies), 2),
            f"play_step_{label}_max_s": round(max(latencies), 2), f"play_steps_{label}": len(latencies)}


def throttle(url: str, config: dict) -> dict:
    login = dependency(config, "login")
    spellings = {
        "direct": lambda i: {"X-Forwarded-For": "203.0.113.30"},
        "own_line_then_proxy": lambda i: [("X-Forwarded-For", f"6.6.6.{i}"), ("X-Forwarded-For", "203.0.113.31")],
        "ipv6_same_64": lambda i: {"X-Forwarded-For": f"2001:db8:43:9::{i + 1:x}"},
    }
    result = {}
    for name, headers in spellings.items():
        throttled_after = None
        for i in range(8):
            answer = call_event(url, login["id"], ["wrong guess"], queued=login.get("queue", True) is not False,
                                headers=headers(i))
            if "Too many" in str(answer.get("output")):
                throttled_after = i
                break
        result[f"throttled_after_{name}"] = throttled_after
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose app.py runs")
    parser.add_argument("--flood", type=int, default=20_000, help="partial heads the flood opens")
    parser.add_argument("--heads-wait", type=float, default=20.0, help="seconds the 300 partial heads are watched")
    parser.add_argument("--play-s", type=float, default=15.0, help="seconds of honest steps per Play phase")
    parser.add_argument("--app-fds", type=int, default=8192, help="the app's descriptor limit")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's own limit
    result: dict = {"repo": str(args.repo), "app_fds": args.app_fds, "load_before": os.getloadavg()[0]}
    with app(args.repo.resolve(), {}, fds=args.app_fds) as (url, pid):
        config = app_config(url)
        def report(figures: dict) -> None:
            print(" ", figures, flush=True)
            result.update(figures)

        report(heads_300(url, args.heads_wait))
        report(heads_flood(url, pid, args.flood))
        time.sleep(max(args.heads_wait, 12))  # what the flood left behind closes first
        report(play_evict(url, config))
        report(play_slow(url, config, args.play_s, [f"127.0.0.{10 + i}" for i in range(8)], "8_clients"))
        report(play_slow(url, config, args.play_s, ["127.0.0.30"] * 8, "1_client"))
    with app(args.repo.resolve(), {"SQLENV_PROXY_HOPS": "1"}) as (url, pid):
        result.update(throttle(url, app_config(url)))
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
