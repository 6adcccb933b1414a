"""QUERY steps per second of `SQLEnvironment` vs raw `sqlite3` on the spider10 gold-query mix.

    SQLENV_SPIDER_DIR=../shared/spider python bench/env_throughput.py [--rounds 5] [--profile]

Prepares spider10 into a temp dir (or uses --dataset DIR), then alternates rounds: one raw pass (sqlite3,
one read-only connection per database, `execute(sql).fetchall()`) and one environment pass (for each
question: `reset(question_id=...)` then `step(QUERY gold_sql)`; only the step is timed as a QUERY step,
the reset is timed apart). Alternating in one process keeps the comparison fair on a shared machine.
Prints both rates, their ratio (target >= 0.5) and the mean reset() time. `--profile` adds a cProfile of one
environment pass (top functions by cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlenv.datasets import DatasetInfo, load_questions  # noqa: E402
from sqlenv.environment import SQLEnvironment  # noqa: E402
from sqlenv.types import SQLAction  # noqa: E402


def _prepare(args: argparse.Namespace, tmp: Path) -> DatasetInfo:
    if args.dataset:
        return DatasetInfo.from_dir(args.dataset)
    from sqlenv.spider import prepare_spider

    source = Path(os.environ.get("SQLENV_SPIDER_DIR", REPO.parent / "shared" / "spider"))
    if not (source / "tables.json").exists():
        sys.exit(f"Spider not found at {source}: set SQLENV_SPIDER_DIR")
    t0 = time.perf_counter()
    info = prepare_spider(source, tmp / "spider10", preset="spider10")
    print(f"prepared spider10 in {time.perf_counter() - t0:.1f} s")
    return info


def _raw_pass(connections: dict, mix: list) -> float:
    t0 = time.perf_counter()
    for q in mix:
        connections[q.database_name].execute(q.gold_sql).fetchall()
    return time.perf_counter() - t0


def _env_pass(envs: dict, mix: list) -> tuple[float, float]:
    step_time = reset_time = 0.0
    for q in mix:
        e = envs[q.split]
        t0 = time.perf_counter()
        e.reset(question_id=q.question_id)
        t1 = time.perf_counter()
        obs = e.step(SQLAction("QUERY", q.gold_sql))
        t2 = time.perf_counter()
        if obs.error:
            raise RuntimeError(f"{q.question_id}: gold SQL failed in the environment: {obs.error}")
        reset_time += t1 - t0
        step_time += t2 - t1
    return step_time, reset_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating raw/env rounds (default 5)")
    parser.add_argument("--dataset", default=None, help="an already prepared spider10 dir (default: prepare one)")
    parser.add_argument("--profile", action="store_true", help="cProfile one environment pass")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        info = _prepare(args, Path(tmp))
        mix, envs = [], {}
        for split in info.splits:
            questions = load_questions(info.questions_path(split))
            mix += questions
            envs[split] = SQLEnvironment(info.questions_path(split), info.db_dir, step_budget=15)
        dbs = sorted({q.database_name for q in mix})
        connections = {
            db: sqlite3.connect(f"file:{info.db_dir / db / (db + '.sqlite')}?mode=ro", uri=True, check_same_thread=False)
            for db in dbs
        }
        print(f"mix: {len(mix)} gold queries over {len(dbs)} databases; {args.rounds} alternating rounds")

        # Warm-up: page caches, sqlglot, the environment's own caches.
        _raw_pass(connections, mix)
        _env_pass(envs, mix)

        raw_rates, env_rates, reset_ms = [], [], []
        for r in range(args.rounds):
            raw_t = _raw_pass(connections, mix)
            step_t, reset_t = _env_pass(envs, mix)
            raw_rates.append(len(mix) / raw_t)
            env_rates.append(len(mix) / step_t)
            reset_ms.append(1000 * reset_t / len(mix))
            print(f"  round {r + 1}: raw {raw_rates[-1]:8.0f} q/s   env {env_rates[-1]:8.0f} steps/s   "
                  f"ratio {env_rates[-1] / raw_rates[-1]:.2f}   reset {reset_ms[-1]:.3f} ms")

        raw, env_rate, reset = statistics.median(raw_rates), statistics.median(env_rates), statistics.median(reset_ms)
        ratio = env_rate / raw
        print(f"raw sqlite3:            {raw:8.0f} queries/s (median of {args.rounds})")
        print(f"SQLEnvironment QUERY:   {env_rate:8.0f} steps/s")
        print(f"ratio env/raw:          {ratio:8.2f}   (target >= 0.5: {'OK' if ratio >= 0.5 else 'BELOW'})")
        print(f"reset():                {reset:8.3f} ms")

        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            _env_pass(envs, mix)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
            print(buf.getvalue())
        for conn in connections.values():
            conn.close()
        print(json.dumps({"raw_qps": round(raw), "env_steps_per_s": round(env_rate), "ratio": round(ratio, 3),
                          "reset_ms": round(reset, 3), "n_queries": len(mix)}))


if __name__ == "__main__":
    main()
