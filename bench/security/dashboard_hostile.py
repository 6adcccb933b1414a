"""Hostile visitors against the public dashboard: half-sent request heads, login-throttle spellings, Play, and a long
run's detail.

The figures of issue 43's findings 6, 8 and 10 and issue 49's findings 5 and 6, measured on `python app.py` (of `--repo`, default this checkout,
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
  - `play_full` (issue 49): an honest visitor opens an episode, 15 other addresses one each (every place taken),
    then a 17th address calls New episode: is it told Play is full, and does the honest visitor (the least
    recently played) still find its episode;
  - `run_detail` (issue 49): a run whose metrics.jsonl has `--metrics-lines` (400,000) lines of ~145 bytes (58 MB,
    as an honest long run that logs every step writes), opened on the Runs tab: the first and a second Run detail
    view (seconds, reply bytes), then six anonymous views at once from six addresses (each one's seconds) while an
    honest visitor plays a step, and the app's RSS before and after;
- one trusted proxy (`SQLENV_PROXY_HOPS=1`): wrong passwords until the throttle refuses, for a direct client (the
  control), a client that sends an X-Forwarded-For line of its own before the proxy's, and a client that takes a
  new IPv6 address of one /64 each try (`throttled_after`: tries answered "wrong password" before the refusal;
  null: not refused in 8).

    python bench/security/dashboard_hostile.py [--repo PATH] [--flood 20000] [--heads-wait 20] [--play-s 15]
        [--metrics-lines 400000] [--phases heads,flood,play,play_full,run_detail,throttle]

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
    """`python app.py` of `repo` on a free port with a password and fresh runs/ and data/; yields (url, pid, root)."""
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
            yield f"http://127.0.0.1:{port}/", proc.pid, root
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
    honest = "127.0.0.40" if label == "8_clients" else "127.0.0.41"  # an address of its own: Play keeps one
    new_episode(url, config, f"{label}-honest", honest)              # episode per address past half full

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
        step(url, config, f"{label}-honest", f"SELECT {i}", honest)
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


def play_full(url: str, config: dict) -> dict:
    """Every place taken by one visitor each (the honest one first: the least recently played), then one more."""
    new_episode(url, config, "honest-full", "127.0.2.1")
    for i in range(15):
        new_episode(url, config, f"full-{i}", f"127.0.2.{2 + i}")
    answer = new_episode(url, config, "newcomer", "127.0.2.99")
    refused = 'id="play-full"' in str((answer.get("output") or [None, ""])[1])
    survived = 'data-budget="99"' in str((step(url, config, "honest-full", "SELECT 1", "127.0.2.1").get("output")
                                          or [None, ""])[1])
    return {"play_full_newcomer_refused": refused, "play_full_honest_episode_survived": survived}


def writing(config: dict, api_prefix: str, elem_id: str) -> dict:
    """The event named `api_prefix` (or `api_prefix_N`) that writes to the component `elem_id`."""
    ids = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}
    return next(d for d in config["dependencies"] if d.get("backend_fn")
                and ((d.get("api_name") or "") == api_prefix or (d.get("api_name") or "").startswith(api_prefix + "_"))
                and elem_id in [ids.get(i) for i in d["outputs"]])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def write_long_run(runs: Path, lines: int) -> int:
    """A completed run whose metrics.jsonl has `lines` GRPO steps of ~145 bytes (TRL's keys a step logs at least);
    returns its size in bytes."""
    import random

    run = runs / "long-run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": "builtin:tiny", "dataset": "builtin"}))
    (run / "status.json").write_text(json.dumps({"status": "completed", "step": lines, "total_steps": lines,
                                                 "started_at": "2025-01-01T00:00:00"}))
    rng = random.Random(0)
    with open(run / "metrics.jsonl", "w") as f:
        for start in range(1, lines + 1, 10_000):
            f.writelines(f'{{"grad_norm": {rng.random() * 3:.4f}, "kl": {rng.random() / 100:.4f}, "loss": '
                         f'{rng.random() / 10:.4f}, "reward": {rng.random():.4f}, "reward_std": {rng.random() / 4:.4f}, '
                         f'"phase": "grpo", "step": {i}, "time": {1_735_689_600 + i}}}\n'
                         for i in range(start, min(start + 10_000, lines + 1)))
    return (run / "metrics.jsonl").stat().st_size


def timed_event(url: str, dep: dict, data: list, session: str, source: str) -> tuple[float, int, bool]:
    """(seconds, bytes of the event stream, success) of one queued event, as the page sends it."""
    import httpx

    base = url.rstrip("/") + "/gradio_api"
    body = {"data": data, "fn_index": dep["id"], "session_hash": session, "event_data": None, "trigger_id": None}
    started = time.monotonic()
    received, ok = 0, False
    with httpx.Client(timeout=300, transport=httpx.HTTPTransport(local_address=source)) as http:
        event_id = http.post(f"{base}/queue/join", json=body).json()["event_id"]
        with http.stream("GET", f"{base}/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                received += len(line) + 1
                if line.startswith("data:") and '"process_completed"' in line:
                    msg = json.loads(line[5:])
                    if msg.get("event_id") in (None, event_id):
                        ok = bool(msg.get("success"))
                        break
    return time.monotonic() - started, received, ok


def run_detail(url: str, config: dict, pid: int, root: Path, lines: int) -> dict:
    size = write_long_run(root / "runs", lines)
    refresh, show = writing(config, "refresh", "runs-table"), writing(config, "show", "runs-detail")

    def listed(session: str, source: str) -> None:  # the page's load: the run picker lists the run
        call_event(url, refresh["id"], [None, []], session_hash=session, source=source, timeout=120)

    listed("detail-visitor", "127.0.3.1")
    rss_before = rss_mb(pid)
    first = timed_event(url, show, ["long-run"], "detail-visitor", "127.0.3.1")
    second = timed_event(url, show, ["long-run"], "detail-visitor", "127.0.3.1")
    new_episode(url, config, "detail-honest", "127.0.3.50")
    results: dict[int, tuple] = {}

    def view(i: int) -> None:
        source = f"127.0.3.{10 + i}"
        listed(f"detail-anon-{i}", source)
        results[i] = timed_event(url, show, ["long-run"], f"detail-anon-{i}", source)

    threads = [threading.Thread(target=view, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    began = time.monotonic()
    step(url, config, "detail-honest", "SELECT 1", "127.0.3.50")
    honest_step = time.monotonic() - began
    for thread in threads:
        thread.join(600)
    six = [results[i][0] for i in sorted(results)]
    return {"detail_metrics_mb": round(size / 1e6, 1), "detail_metrics_lines": lines,
            "detail_first_view_s": round(first[0], 2), "detail_first_view_mb": round(first[1] / 1e6, 2),
            "detail_second_view_s": round(second[0], 2), "detail_second_view_mb": round(second[1] / 1e6, 2),
            "detail_six_views_s": [round(t, 2) for t in six], "detail_six_views_ok": sum(r[2] for r in results.values()),
            "detail_honest_play_step_s": round(honest_step, 2),
            "detail_rss_before_mb": round(rss_before), "detail_rss_after_mb": round(rss_mb(pid))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose app.py runs")
    parser.add_argument("--flood", type=int, default=20_000, help="partial heads the flood opens")
    parser.add_argument("--heads-wait", type=float, default=20.0, help="seconds the 300 partial heads are watched")
    parser.add_argument("--play-s", type=float, default=15.0, help="seconds of honest steps per Play phase")
    parser.add_argument("--app-fds", type=int, default=8192, help="the app's descriptor limit")
    parser.add_argument("--metrics-lines", type=int, default=400_000, help="lines of the long run's metrics.jsonl")
    parser.add_argument("--phases", default="heads,flood,play,play_full,run_detail,throttle",
                        help="the shapes to run, comma-separated (default: all)")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's own limit
    result: dict = {"repo": str(args.repo), "app_fds": args.app_fds, "load_before": os.getloadavg()[0]}

    def report(figures: dict) -> None:
        print(" ", figures, flush=True)
        result.update(figures)

    with app(args.repo.resolve(), {}, fds=args.app_fds) as (url, pid, root):
        config = app_config(url)
        if "heads" in phases:
            report(heads_300(url, args.heads_wait))
        if "flood" in phases:
            report(heads_flood(url, pid, args.flood))
            time.sleep(max(args.heads_wait, 12))  # what the flood left behind closes first
        if "play" in phases:
            report(play_evict(url, config))
            report(play_slow(url, config, args.play_s, [f"127.0.0.{10 + i}" for i in range(8)], "8_clients"))
            report(play_slow(url, config, args.play_s, ["127.0.0.30"] * 8, "1_client"))
        if "run_detail" in phases:
            report(run_detail(url, config, pid, root, args.metrics_lines))
    if "play_full" in phases:  # on an app of its own: every place free at the start
        with app(args.repo.resolve(), {}, fds=args.app_fds) as (url, pid, root):
            report(play_full(url, app_config(url)))
    if "throttle" in phases:
        with app(args.repo.resolve(), {"SQLENV_PROXY_HOPS": "1"}) as (url, pid, root):
            report(throttle(url, app_config(url)))
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
