"""QUERY steps per second of `SQLEnvironment` vs raw `sqlite3` on the spider10 gold-query mix.

    SQLENV_SPIDER_DIR=../shared/spider python bench/env_throughput.py [--rounds 5] [--profile]

Prepares spider10 into a temp dir (or uses --dataset DIR), then alternates rounds: one raw pass (sqlite3,
one read-only connection per database, `execute(sql).fetchall()`) and one environment pass (for each
question: `reset(question_id=...)` then `step(QUERY gold_sql)`; only the step is timed as a QUERY step,
the reset is timed apart). Alternating in one process keeps the comparison fair on a shared machine.
Prints both rates, their ratio (target >= 0.5) and the mean reset() time. Rates are the median and the best
of the rounds (the best is the least disturbed by other processes on a shared machine).

"warm" env passes reuse the sandbox's per-string SQL check cache (sqlglot parse), as repeated queries do
in training; one "cold" pass per round clears that cache first, i.e. every query is new SQL text.
`--profile` adds a cProfile of one environment pass (top functions by cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
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
from sqlenv.sandbox import SandboxSettings  # noqa: E402
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


def _clear_sql_cache() -> bool:
    from sqlenv import sandbox

    clear = getattr(getattr(sandbox, "check_sql", None), "cache_clear", None)
    if clear is not None:
        clear()
    return clear is not None


def _env_pass(envs: dict, mix: list, cold: bool = False) -> tuple[float, float]:
    if cold:
        _clear_sql_cache()
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
    parser.add_argument("--rounds", type=int, default=7, help="alternating raw/env rounds (default 7)")
    parser.add_argument("--dataset", default=None, help="an already prepared spider10 dir (default: prepare one)")
    parser.add_argument("--profile", action="store_true", help="cProfile one environment pass")
    parser.add_argument("--max-open-databases", type=int, default=None,
                        help="SandboxSettings.max_open_databases for the environments (default: its default)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        info = _prepare(args, Path(tmp))
        mix, envs = [], {}
        for split in info.splits:
            questions = load_questions(info.questions_path(split))
            mix += questions
            settings = SandboxSettings()
            if args.max_open_databases:
                settings.max_open_databases = args.max_open_databases
            envs[split] = SQLEnvironment(info.questions_path(split), info.db_dir, step_budget=15, sandbox=settings)
        random.Random(0).shuffle(mix)  # training draws questions at random, not grouped by database
        dbs = sorted({q.database_name for q in mix})
        connections = {
            db: sqlite3.connect(f"file:{info.db_dir / db / (db + '.sqlite')}?mode=ro", uri=True, check_same_thread=False)
            for db in dbs
        }
        print(f"mix: {len(mix)} gold queries over {len(dbs)} databases; {args.rounds} alternating rounds; "
              f"max_open_databases={settings.max_open_databases}")

        # Warm-up: page caches, sqlglot, the environment's own caches.
        _raw_pass(connections, mix)
        _env_pass(envs, mix)

        raw_rates, env_rates, cold_rates, reset_ms = [], [], [], []
        for r in range(args.rounds):
            raw_t = _raw_pass(connections, mix)
            step_t, reset_t = _env_pass(envs, mix)
            cold_t, _ = _env_pass(envs, mix, cold=True)
            raw_rates.append(len(mix) / raw_t)
            env_rates.append(len(mix) / step_t)
            cold_rates.append(len(mix) / cold_t)
            reset_ms.append(1000 * reset_t / len(mix))
            print(f"  round {r + 1}: raw {raw_rates[-1]:7.0f} q/s   env warm {env_rates[-1]:7.0f} steps/s "
                  f"(ratio {env_rates[-1] / raw_rates[-1]:.2f})   env cold {cold_rates[-1]:7.0f} steps/s "
                  f"(ratio {cold_rates[-1] / raw_rates[-1]:.2f})   reset {reset_ms[-1]:.3f} ms")

        med = statistics.median
        raw, env_rate, cold, reset = med(raw_rates), med(env_rates), med(cold_rates), med(reset_ms)
        ratio, best_ratio = env_rate / raw, max(env_rates) / max(raw_rates)
        cold_ratio = cold / raw
        print(f"raw sqlite3:              {raw:8.0f} queries/s  (median of {args.rounds}; best {max(raw_rates):.0f})")
        print(f"SQLEnvironment QUERY:     {env_rate:8.0f} steps/s    (warm SQL-check cache; best {max(env_rates):.0f})")
        print(f"ratio env/raw:            {ratio:8.2f}   best/best {best_ratio:.2f}   "
              f"(target >= 0.5: {'OK' if ratio >= 0.5 else 'BELOW'})")
        print(f"SQLEnvironment QUERY cold:{cold:8.0f} steps/s    (every SQL new: sqlglot parse; ratio {cold_ratio:.2f})")
        print(f"reset():                  {reset:8.3f} ms       (median per call)")

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
                          "best_ratio": round(best_ratio, 3), "env_cold_steps_per_s": round(cold),
                          "cold_ratio": round(cold_ratio, 3), "reset_ms": round(reset, 3), "n_queries": len(mix)}))


if __name__ == "__main__":
    main()
