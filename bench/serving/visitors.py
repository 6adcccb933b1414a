"""Many visitors at once on a dashboard that is training: does it keep up, keep them apart, and keep training?

One invocation: the app (`dashboard.server`, as `python app.py` builds it) is served on 127.0.0.1 by a child
process, whose runner trains a tiny GRPO run (builtin:tiny, SFT off, a metrics line per step) in its own
training process. Once GRPO steps are logged, the bench alternates quiet and visitor phases (quiet, visitors,
quiet, ..., quiet: `--rounds` visitor phases of `--phase-s` each), so both kinds see the same drift of a shared
machine. In a visitor phase 20 visitors start at once and stop at its end, each with its own session, all
speaking Gradio's HTTP API as a page does (queue join + event stream, or one POST) from its own loopback address,
from coroutines of one event loop in this process, so that the client takes little of the cores it shares with
the server:

- 10 pollers do what a browser on the Train tab does: the timer's long poll, then the refresh chained to it
  (status bar, charts, trace), every `POLL_TICK_S`;
- 10 players play Play-tab episodes: New episode, then QUERY steps (`--think-s` apart) whose SQL carries a
  marker naming the player, the episode and the step, then ANSWER; again. After every step a player checks its
  own page: the question is the one it was dealt, the budget is its own, and the episode so far holds exactly
  its own markers. Anything else counts as cross-talk.

Figures: Play-step latency (p50/p99 of the Step call as the player sees it), errors, cross-talk, the training
slow-down (mean GRPO `step_time` of the metrics lines logged in visitor phases against quiet phases, each
phase's first `SETTLE_S` left out), and the cores used by the app, the training process and the client. The
client runs on the same cores as the server here (real visitors bring their own machines), so the slow-down is
an upper bound. Loops are bounded (phase time, and `MAX_CALLS` per visitor); only 127.0.0.1 is contacted.

    python bench/serving/visitors.py [--pollers 10] [--players 10] [--phase-s 20] [--rounds 3] [--think-s 1.0]

The last line is one JSON object. Run it on an otherwise idle machine and say what `uptime` showed: on 2
shared cores another job moves the step time by tens of percent (the load before and after is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))  # serverproc: the free-port helper the tests and benches share

from serverproc import free_port  # noqa: E402

# The tiny run: a GRPO step every second or so on 2 cores, a metrics line per step, no evals or traces (they
# would add steps of another length to the phases being compared).
TRAIN_CONFIG = {"model": "builtin:tiny", "dataset": "builtin", "step_budget": 2, "num_generations": 2,
                "per_device_train_batch_size": 2, "max_steps": 5000, "max_completion_length": 48,
                "max_turn_tokens": 16, "plot_every": 1, "trace_every": 0, "eval_every": 0, "eval_episodes": 0,
                "comparison_episodes": 2, "compare_base": False, "sft": False}
POLL_TICK_S = 0.5  # the Train tab's gr.Timer (dashboard.core.context.POLL_SECONDS)
SETTLE_S = 3.0  # left out at the start of each phase (visitors connecting, or leaving)
MAX_CALLS = 5000  # per visitor per phase: a bound on the loops whatever the timing
WARMUP_STEPS = 5
MARKER = re.compile(r"p(\d+)-e(\d+)-s(\d+)")


# ------------------------------------------------------------------------------------------- the server
def serve(port: int, root: Path) -> None:
    """Child process: the dashboard on 127.0.0.1:port, training TRAIN_CONFIG until stdin closes."""
    from dashboard.access.owner import AccessPolicy
    from dashboard.core.context import AppContext
    from dashboard.core.runner import build_config
    from dashboard.page import build_app
    from dashboard.server import launch

    ctx = AppContext.create(runs_root=root / "runs", data_root=root / "data",
                            access=AccessPolicy.from_env("127.0.0.1", env={}))
    launch(build_app(ctx), "127.0.0.1", port, prevent_thread_lock=True)
    run_id = ctx.runner.start(build_config(dict(TRAIN_CONFIG)))
    print(f"RUN {run_id}", flush=True)
    sys.stdin.read()  # the bench closes our stdin when it is done
    ctx.runner.stop()
    ctx.runner.join(120)


# ------------------------------------------------------------------------------------------ the visitors
class Tally:
    def __init__(self):
        self.step_latencies: list[float] = []
        self.episode_latencies: list[float] = []
        self.poll_latencies: list[float] = []
        self.errors: list[str] = []
        self.cross_talk: list[str] = []


class GradioSession:
    """One visitor's page session, speaking Gradio's HTTP API as the page does: queued events join the queue
    and read the session's event stream, the others are one POST. Each session has its own session hash, so
    the server keeps its own gr.State for it."""

    def __init__(self, http, url: str, dependencies: dict[int, dict]):
        import secrets

        self.http, self.base, self.deps = http, url.rstrip("/") + "/gradio_api", dependencies
        self.session_hash = secrets.token_hex(8)

    async def call(self, fn_index: int, *data):
        body = {"data": list(data), "fn_index": fn_index, "session_hash": self.session_hash, "event_data": None,
                "trigger_id": None}
        if self.deps[fn_index].get("queue") is False:
            r = await self.http.post(f"{self.base}/run/predict", json=body)
            r.raise_for_status()
            return r.json()["data"]
        r = await self.http.post(f"{self.base}/queue/join", json=body)
        r.raise_for_status()
        event_id = r.json()["event_id"]
        async with self.http.stream("GET", f"{self.base}/queue/data",
                                    params={"session_hash": self.session_hash}) as stream:
            async for line in stream.aiter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed" and msg.get("event_id") == event_id:
                    output = msg.get("output") or {}
                    if not msg.get("success"):
                        raise RuntimeError(output.get("error") or "event failed")
                    return output.get("data")
        raise RuntimeError("the event stream ended without a result")


def endpoints(config: dict) -> dict[str, int]:
    """fn_index of the events the visitors use, found by name and by the component each one writes to."""
    elem = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}

    def find(api_prefix: str, output_elem_id: str | None) -> int:
        for d in config["dependencies"]:
            name = d.get("api_name") or ""
            if name == api_prefix or name.startswith(api_prefix + "_"):
                if output_elem_id is None or output_elem_id in [elem.get(o) for o in d["outputs"]]:
                    return d["id"]
        raise LookupError(f"no public event {api_prefix} -> #{output_elem_id}")

    # The long poll has no outputs (it only waits for news); the refresh chained to it sends the update.
    return {"poll": find("poll", None), "refresh": find("refresh", "train-status-box"),
            "new_episode": find("new_episode", "play-header"), "do_step": find("do_step", "play-obs")}


async def poller(session: GradioSession, ids: dict, stop: asyncio.Event, tally: Tally) -> None:
    """What a browser on the Train tab does: the timer's long poll, then the refresh, every POLL_TICK_S."""
    for _ in range(MAX_CALLS):
        if stop.is_set():
            return
        try:
            t0 = time.perf_counter()
            await session.call(ids["poll"], None)
            await session.call(ids["refresh"], None)
            tally.poll_latencies.append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - counted, the visitor goes on
            tally.errors.append(f"poller: {type(exc).__name__}: {exc}"[:300])
        await pause(stop, POLL_TICK_S)


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` or until `stop`; True when stopped."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
        return True
    except asyncio.TimeoutError:
        return stop.is_set()


async def player(session: GradioSession, ids: dict, index: int, stop: asyncio.Event, tally: Tally,
                 think_s: float) -> None:
    """Plays episodes (QUERY steps carrying a marker, then ANSWER); after each step checks that its page shows
    only its own episode: its question, its budget, exactly its own markers."""
    calls, episode = 0, 0
    while not stop.is_set() and calls < MAX_CALLS:
        episode += 1
        calls += 1
        try:
            t0 = time.perf_counter()
            _, header, _, _ = await session.call(ids["new_episode"], "builtin", "eval", "random", 15, None)
            tally.episode_latencies.append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001
            tally.errors.append(f"player {index} new episode: {type(exc).__name__}: {exc}"[:300])
            await pause(stop, think_s)
            continue
        question = re.search(r"question ([\w.-]+)</div>", header)
        question = question.group(1) if question else None
        for k in range(1, 15):  # 14 queries, then the answer ends the episode with one step left
            if await pause(stop, think_s) or calls >= MAX_CALLS:
                return
            calls += 1
            marker = f"p{index}-e{episode}-s{k}"
            try:
                t0 = time.perf_counter()
                _, header, obs, history = await session.call(ids["do_step"], "QUERY",
                                                             f"SELECT '{marker}' AS marker", None)
                tally.step_latencies.append(time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001
                tally.errors.append(f"player {index} step: {type(exc).__name__}: {exc}"[:300])
                break
            seen = {m.group(0) for m in MARKER.finditer(history)}
            mine = {f"p{index}-e{episode}-s{j}" for j in range(1, k + 1)}
            problems = []
            if seen != mine:
                problems.append(f"history holds {sorted(seen ^ mine)[:4]}")
            if marker not in obs:
                problems.append("observation is not this step's")
            if f'data-budget="{15 - k}"' not in header:
                problems.append("budget is not this episode's")
            if question and f"question {question}</div>" not in header:
                problems.append("question changed")
            if problems:
                tally.cross_talk.append(f"player {index} episode {episode} step {k}: {'; '.join(problems)}")
        try:
            await session.call(ids["do_step"], "ANSWER", "0", None)
        except Exception as exc:  # noqa: BLE001
            tally.errors.append(f"player {index} answer: {type(exc).__name__}: {exc}"[:300])


async def visit(url: str, pollers: int, players: int, seconds: float, think_s: float, tally: Tally) -> None:
    """All visitors at once for `seconds`, as coroutines of one event loop (a light client: the server is
    what is measured); they stop by themselves. Each visitor speaks from its own loopback address (pollers
    127.0.2.x, players 127.0.1.x), as visitors come from their own machines: the app bounds what one client
    (address) holds, Play episodes included, so ten players from one address would be one household."""
    import contextlib

    import httpx

    async with contextlib.AsyncExitStack() as stack:
        def client(address: str) -> httpx.AsyncClient:
            transport = httpx.AsyncHTTPTransport(local_address=address, limits=httpx.Limits(max_connections=8))
            return httpx.AsyncClient(timeout=120, transport=transport)

        reader = await stack.enter_async_context(client("127.0.0.1"))
        config = (await reader.get(url.rstrip("/") + "/config")).json()
        deps = {d["id"]: d for d in config["dependencies"]}
        ids = endpoints(config)
        stop = asyncio.Event()
        tasks = []
        for i in range(pollers):
            http = await stack.enter_async_context(client(f"127.0.2.{i + 1}"))
            tasks.append(asyncio.create_task(poller(GradioSession(http, url, deps), ids, stop, tally)))
        for i in range(players):
            http = await stack.enter_async_context(client(f"127.0.1.{i + 1}"))
            tasks.append(asyncio.create_task(player(GradioSession(http, url, deps), ids, i, stop, tally, think_s)))
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.wait(tasks, timeout=120)


# ------------------------------------------------------------------------------------------------ main
def read_metrics(path: Path) -> list[dict]:
    from training.run.directory import read_jsonl

    return [m for m in read_jsonl(path) if isinstance(m.get("step_time"), (int, float))
            and isinstance(m.get("time"), (int, float))]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds a process has used (Linux /proc), 0 where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def child_pids(pid: int) -> list[int]:
    """The live child processes of `pid` (the training process the runner spawns)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pollers", type=int, default=10)
    parser.add_argument("--players", type=int, default=10)
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3, help="visitor phases (each between two quiet ones)")
    parser.add_argument("--think-s", type=float, default=1.0, help="a player's pause between two steps")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(int(args.serve[0]), Path(args.serve[1]))
        return 0
    if args.phase_s < 2 * SETTLE_S or args.rounds < 1 or min(args.pollers, args.players, args.think_s) < 0:
        print(f"visitors.py: need --phase-s >= {2 * SETTLE_S:.0f}, --rounds >= 1 and non-negative counts",
              file=sys.stderr)
        return 2

    load_before = load_average()
    print(f"load average before: {load_before}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="sqlenv-visitors-"))
    (root / "runs").mkdir()
    cached = REPO_ROOT / "runs" / "models"
    if cached.is_dir():  # the built tiny model (deterministic): reuse it instead of building it again
        import shutil

        shutil.copytree(cached, root / "runs" / "models", dirs_exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    # One data folder for the run and the players (the built-in dataset is built once, before GRPO starts).
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1",
               SQLENV_DATA_DIR=str(root / "data"), SQLENV_RUNS_DIR=str(root / "runs"))
    for name in ("SQLENV_ADMIN_PASSWORD", "SPACE_ID"):
        env.pop(name, None)
    log = open(root / "server.log", "w")
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(root)], cwd=REPO_ROOT, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    phases: list[tuple[str, float, float]] = []
    # CPU seconds of the app's process, the training process, this process (the visitors), and wall seconds.
    cpu: dict[str, list[float]] = {"quiet": [0.0] * 4, "visitors": [0.0] * 4}
    tally = Tally()
    try:
        line = ""
        while not line.startswith("RUN "):  # Gradio prints its own lines first
            line = server.stdout.readline()
            if not line:
                raise RuntimeError(f"the server did not start a run (see {root / 'server.log'})")
        metrics_path = root / "runs" / line.split()[1] / "metrics.jsonl"
        deadline = time.time() + 600
        while len(read_metrics(metrics_path)) < WARMUP_STEPS:
            if time.time() > deadline or server.poll() is not None:
                raise RuntimeError(f"no GRPO steps logged (see {root / 'server.log'})")
            time.sleep(1.0)
        print(f"training: {len(read_metrics(metrics_path))} steps logged; phases of {args.phase_s:.0f} s", flush=True)
        for kind in ["quiet", "visitors"] * args.rounds + ["quiet"]:
            start = time.time()
            trainer = max(child_pids(server.pid), default=None, key=cpu_seconds)  # the busiest child: training
            cpu_start = (cpu_seconds(server.pid), cpu_seconds(trainer) if trainer else 0.0, cpu_seconds())
            if kind == "visitors":
                asyncio.run(visit(url, args.pollers, args.players, args.phase_s, args.think_s, tally))
            else:
                time.sleep(args.phase_s)
            phases.append((kind, start, time.time()))
            for i, used in enumerate((cpu_seconds(server.pid) - cpu_start[0],
                                      (cpu_seconds(trainer) - cpu_start[1]) if trainer else 0.0,
                                      cpu_seconds() - cpu_start[2], time.time() - start)):
                cpu[kind][i] += used
            print(f"  {kind:8s} phase done ({len(tally.step_latencies)} play steps so far)", flush=True)
        metrics = read_metrics(metrics_path)
    finally:
        try:
            server.stdin.close()
            server.wait(timeout=120)
        except Exception:
            server.kill()
            server.wait()
        log.close()

    def step_times(kind: str) -> list[float]:
        return [float(m["step_time"]) for m in metrics for k, t0, t1 in phases
                if k == kind and t0 + SETTLE_S <= m["time"] < t1]

    quiet, busy = step_times("quiet"), step_times("visitors")
    quiet_mean = statistics.mean(quiet) if quiet else None
    busy_mean = statistics.mean(busy) if busy else None
    slowdown = 100.0 * (busy_mean / quiet_mean - 1.0) if quiet_mean and busy_mean else None
    ms = lambda v: round(1000.0 * v, 1) if v is not None else None  # noqa: E731
    result = {
        "pollers": args.pollers, "players": args.players, "phase_s": args.phase_s, "rounds": args.rounds,
        "think_s": args.think_s,
        "play_steps": len(tally.step_latencies),
        "play_step_p50_ms": ms(percentile(tally.step_latencies, 50)),
        "play_step_p99_ms": ms(percentile(tally.step_latencies, 99)),
        # A player's first New episode arrives with the 19 other visitors at once (the slowest ones).
        "new_episode_p50_ms": ms(percentile(tally.episode_latencies, 50)),
        "new_episode_max_ms": ms(max(tally.episode_latencies, default=None)),
        "train_tab_updates": len(tally.poll_latencies),
        "errors": len(tally.errors), "cross_talk": len(tally.cross_talk),
        "grpo_steps_quiet": len(quiet), "grpo_steps_visitors": len(busy),
        "step_s_quiet_mean": round(quiet_mean, 3) if quiet_mean else None,
        "step_s_visitors_mean": round(busy_mean, 3) if busy_mean else None,
        "step_s_quiet_median": round(statistics.median(quiet), 3) if quiet else None,
        "step_s_visitors_median": round(statistics.median(busy), 3) if busy else None,
        "training_slowdown_pct": round(slowdown, 1) if slowdown is not None else None,
        # Cores busy on average (CPU seconds per wall second) in each kind of phase: the app's process, the
        # training process, and this process (the visitors' client).
        "app_cores_quiet": round(cpu["quiet"][0] / cpu["quiet"][3], 2),
        "app_cores_visitors": round(cpu["visitors"][0] / cpu["visitors"][3], 2),
        "training_cores_quiet": round(cpu["quiet"][1] / cpu["quiet"][3], 2),
        "training_cores_visitors": round(cpu["visitors"][1] / cpu["visitors"][3], 2),
        "client_cores_visitors": round(cpu["visitors"][2] / cpu["visitors"][3], 2),
        "load_before": load_before, "load_after": load_average(), "cpus": os.cpu_count(),
    }
    for message in (tally.errors + tally.cross_talk)[:10]:
        print("  !", message)
    print(f"Play step: p50 {result['play_step_p50_ms']} ms, p99 {result['play_step_p99_ms']} ms over "
          f"{result['play_steps']} steps; errors {result['errors']}; cross-talk {result['cross_talk']}")
    print(f"GRPO step: {result['step_s_quiet_mean']} s quiet vs {result['step_s_visitors_mean']} s with visitors "
          f"(mean of {len(quiet)} and {len(busy)} steps): slow-down {result['training_slowdown_pct']}% (target <= 10%)")
    print(json.dumps(result))
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
