"""Load on the OpenEnv server: many concurrent sessions playing oracle and random episodes, against in-process.

    SQLENV_SPIDER_DIR=../shared/spider python bench/serving/server_load.py [--sessions 64] [--episodes 16] \\
        [--dataset DIR]

Starts `python -m sqlenv serve` on 127.0.0.1 (a free port; stopped at the end), then in one asyncio loop opens
`--sessions` WebSocket sessions with `SQLEnvClient` and warms each up (one oracle episode per database, not
timed: a long-lived trainer session pays that once). Each session then plays `--episodes` episodes per phase,
one step at a time (closed loop, as a trainer's environments do):

- oracle: DESCRIBE the tables involved, QUERY the gold SQL, ANSWER the gold answer (the gold-query mix;
  every episode must end correct);
- random: `RandomPolicy` (errors, repeats, answers at random).

Then the same episodes are played in-process by one `SQLEnvironment`, one after another. Reports steps/s,
p50/p99 step latency (client-measured, send to reply), errors (exceptions and error frames; error
observations of the random agent are normal play), oracle episodes not correct, the server's CPU seconds,
the bench client's own CPU seconds (it shares the machine), and the sessions open before and after (a leak
shows there). Bounded: `--time-limit` seconds per phase stop
new episodes. The default dataset is spider10, prepared from `$SQLENV_SPIDER_DIR` into a temp dir (or
`--dataset builtin`). Other jobs on the machine skew every figure: note the load average printed first.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from serverproc import ServerProcess  # noqa: E402

from sqlenv.data.datasets import DatasetInfo, load_questions, resolve_dataset  # noqa: E402
from sqlenv.environment import SQLEnvironment  # noqa: E402
from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy  # noqa: E402
from sqlenv.server.client import SQLEnvClient  # noqa: E402
from sqlenv.server.models import SQLAction as WireAction  # noqa: E402


class _Seat:
    """What a policy may read besides the observation: the question (the oracle reads its gold fields)."""

    def __init__(self, question=None):
        self.question = question


def _policy(kind: str, seed: int):
    return OraclePolicy() if kind == "oracle" else RandomPolicy(seed=seed)


def _plan(questions: list, sessions: int, episodes: int, seed: int) -> list[list]:
    """The questions each session plays, drawn once so the in-process phase plays the very same ones."""
    rng = random.Random(seed)
    return [[rng.choice(questions) for _ in range(episodes)] for _ in range(sessions)]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _session(client, kind: str, plan: list, index: int, deadline: float, out: dict) -> None:
    try:
        for episode, question in enumerate(plan):
            if time.monotonic() > deadline:
                break
            policy, seat = _policy(kind, seed=index * 10_000 + episode), _Seat(question)
            result = await client.reset(question_id=question.question_id)
            observation = result.observation.to_core()
            policy.reset(seat, observation)
            while not observation.done:
                action = policy.act(seat, observation)
                started = time.perf_counter()
                result = await client.step(WireAction.from_core(action))
                out["latency"].append(time.perf_counter() - started)
                out["kinds"].append(action.action_type)
                observation = result.observation.to_core()
            out["episodes"] += 1
            if kind == "oracle" and result.observation.metadata.get("outcome") != "correct":
                out["not_correct"] += 1
    except Exception as exc:  # noqa: BLE001 - counted and shown: the figure is "0 errors"
        out["errors"].append(f"session {index}: {type(exc).__name__}: {exc}")


async def _over_the_wire(url: str, plans: list, warmup: list, time_limit: float, server_pid: int) -> dict:
    """Connect every session, warm each up (one oracle episode per database: its connections open, its gold
    results are summarised), then time the oracle phase and the random phase on the same sessions. Each
    phase's clock runs from its first reset to its last reply."""
    runs = {}
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(SQLEnvClient(base_url=url, message_timeout_s=60.0))
                   for _ in plans]
        phases = [("warm-up", "oracle", [warmup] * len(plans)), ("oracle", "oracle", plans),
                  ("random", "random", plans)]
        for name, kind, phase_plans in phases:
            out = {"latency": [], "kinds": [], "episodes": 0, "not_correct": 0, "errors": []}
            cpu0, client0 = _cpu_seconds(server_pid), time.process_time()
            deadline = time.monotonic() + time_limit
            started = time.perf_counter()
            await asyncio.gather(*(_session(c, kind, plan, i, deadline, out)
                                   for i, (c, plan) in enumerate(zip(clients, phase_plans))))
            out["wall"] = time.perf_counter() - started
            out["server_cpu_s"] = _cpu_seconds(server_pid) - cpu0
            out["client_cpu_s"] = time.process_time() - client0
            runs[name] = out
    return runs


def _in_process(info: DatasetInfo, split: str, kind: str, plans: list, time_limit: float, warmup: list) -> dict:
    """The same episodes, one after another, on one `SQLEnvironment` (warmed up like each session)."""
    out = {"latency": [], "kinds": [], "episodes": 0, "not_correct": 0, "errors": []}
    with SQLEnvironment(info.questions_path(split), info.db_dir) as env:
        for question in warmup:
            policy, observation = OraclePolicy(), env.reset(question_id=question.question_id)
            policy.reset(env, observation)
            while not observation.done:
                observation = env.step(policy.act(env, observation))
        deadline = time.monotonic() + time_limit
        started = time.perf_counter()
        for index, plan in enumerate(plans):
            for episode, question in enumerate(plan):
                if time.monotonic() > deadline:
                    break
                policy = _policy(kind, seed=index * 10_000 + episode)
                observation = env.reset(question_id=question.question_id)
                policy.reset(env, observation)
                while not observation.done:
                    action = policy.act(env, observation)
                    t0 = time.perf_counter()
                    observation = env.step(action)
                    out["latency"].append(time.perf_counter() - t0)
                    out["kinds"].append(action.action_type)
                out["episodes"] += 1
                if kind == "oracle" and env.outcome != "correct":
                    out["not_correct"] += 1
        out["wall"] = time.perf_counter() - started
    return out


def _summary(run: dict) -> dict:
    steps = len(run["latency"])
    query = [t for t, k in zip(run["latency"], run["kinds"]) if k.upper() == "QUERY"]
    return {
        "steps": steps, "episodes": run["episodes"], "steps_per_s": round(steps / run["wall"], 1) if run["wall"] else 0,
        "p50_ms": round(1000 * _percentile(run["latency"], 0.50), 2),
        "p99_ms": round(1000 * _percentile(run["latency"], 0.99), 2),
        "query_p99_ms": round(1000 * _percentile(query, 0.99), 2),
        "max_ms": round(1000 * max(run["latency"], default=float("nan")), 2),
        "errors": len(run["errors"]), "not_correct": run["not_correct"], "wall_s": round(run["wall"], 2),
    }


def _prepare(args: argparse.Namespace, tmp: Path) -> DatasetInfo:
    if args.dataset:
        return resolve_dataset(args.dataset)
    from sqlenv.data.spider import default_spider_dir, prepare_spider

    source = default_spider_dir()
    if not (source / "tables.json").exists():
        sys.exit(f"Spider not found at {source}: set SQLENV_SPIDER_DIR, or pass --dataset builtin")
    return prepare_spider(source, tmp / "spider10", preset="spider10")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions (default 64)")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per session and phase (default 16)")
    parser.add_argument("--dataset", default=None, help="a prepared dataset (default: spider10 from Spider)")
    parser.add_argument("--split", default="train", help="split served (default train)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per phase (default 120)")
    parser.add_argument("--seed", type=int, default=0, help="draws the questions (default 0)")
    args = parser.parse_args()
    if not 1 <= args.sessions <= 256 or not 1 <= args.episodes <= 100:
        sys.exit("--sessions must be 1..256 and --episodes 1..100")

    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        info = _prepare(args, Path(tmp))
        questions = load_questions(info.questions_path(args.split))
        plans = _plan(questions, args.sessions, args.episodes, args.seed)
        warmup = list({q.database_name: q for q in questions}.values())  # one question per database
        server = ServerProcess(["--dataset", str(info.root), "--split", args.split,
                                "--max-sessions", str(args.sessions),
                                "--max-sessions-per-client", str(args.sessions)]).start()  # all from 127.0.0.1
        report: dict = {"dataset": info.name, "sessions": args.sessions, "episodes_per_session": args.episodes}
        try:
            report["sessions_open_before"] = server.sessions()["open"]
            runs = asyncio.run(_over_the_wire(server.url, plans, warmup, args.time_limit, server.proc.pid))
            report["sessions_open_after"] = server.wait_sessions(0)
        finally:
            server.stop()
        print(f"warm-up: {args.sessions} sessions x {len(warmup)} oracle episodes (one per database) in "
              f"{runs['warm-up']['wall']:.1f} s, errors {len(runs['warm-up']['errors'])} (not timed below)")
        for kind in ("oracle", "random"):
            run = runs[kind]
            wire = _summary(run)
            wire["server_cpu_s"] = round(run["server_cpu_s"], 2)
            wire["client_cpu_s"] = round(run["client_cpu_s"], 2)
            local = _summary(_in_process(info, args.split, kind, plans, args.time_limit, warmup))
            for line in run["errors"][:3]:
                print("  error:", line)
            report[kind] = {"wire": wire, "in_process": local,
                            "wire_vs_in_process": round(wire["steps_per_s"] / local["steps_per_s"], 3)}
            print(f"{kind:6s} over the wire: {wire['steps_per_s']:7.1f} steps/s  p50 {wire['p50_ms']:6.2f} ms  "
                  f"p99 {wire['p99_ms']:6.2f} ms (QUERY p99 {wire['query_p99_ms']:.2f})  errors {wire['errors']}  "
                  f"not correct {wire['not_correct']}  ({wire['steps']} steps; CPU s: server {wire['server_cpu_s']}, "
                  f"bench client {wire['client_cpu_s']})")
            print(f"{kind:6s} in-process:    {local['steps_per_s']:7.1f} steps/s  p50 {local['p50_ms']:6.2f} ms  "
                  f"p99 {local['p99_ms']:6.2f} ms  ({local['steps']} steps)  -> wire/in-process "
                  f"{report[kind]['wire_vs_in_process']:.3f}")
        print(f"sessions open before {report['sessions_open_before']}, after {report['sessions_open_after']}; "
              f"load average {os.getloadavg()[0]:.2f}")
        report["load_average_1m_end"] = round(os.getloadavg()[0], 2)
        print(json.dumps(report))


if __name__ == "__main__":
    main()
