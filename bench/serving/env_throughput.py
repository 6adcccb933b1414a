"""QUERY steps per second of `SQLEnvironment` vs raw `sqlite3` on the spider10 gold-query mix.

    SQLENV_SPIDER_DIR=../shared/spider python bench/serving/env_throughput.py [--rounds 7] [--profile [cold]]

Prepares spider10 into a temp dir (or uses --dataset DIR), then alternates rounds in one process:

- raw: `sqlite3`, one read-only connection per database, `execute(gold_sql).fetchall()`;
- env warm: for each question `reset(question_id=...)`, then `step(QUERY gold_sql)`; only the step counts as a
  QUERY step (the reset is timed apart). The sandbox's per-text caches (normal form, full check) are warm, as for the
  repeated queries of GRPO groups;
- env cold: the same after clearing those caches, i.e. every SQL text is new to the sandbox (its price of
  preparing is computed again, and its normal form when one is needed; the text check on the hot path is a prefix
  scan, SQLite enforces the rest). The target is cold >= 0.6 of raw.

The mix is shuffled (training draws questions at random, not grouped by database). Every pass is timed on
two clocks: wall time, and the process's CPU time (`time.process_time`), which ignores the time the process
spends waiting for a core — on a shared, loaded machine the CPU-time ratio is the stable figure. A step is timed
alone (its reset apart), so what reading the clocks costs (measured, ~1 us of CPU) is subtracted from each.
Prints the rates, their ratios (targets: warm >= 0.5, cold >= 0.6), the reset() time, and as the last line one JSON object.
`--profile [warm|cold]` adds a cProfile of one environment pass (cold: every SQL text new to the sandbox).
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sqlenv.data.datasets import DatasetInfo, load_questions  # noqa: E402
from sqlenv.environment import SQLEnvironment  # noqa: E402
from sqlenv.sandbox.sandbox import SandboxSettings  # noqa: E402
from sqlenv.types import SQLAction  # noqa: E402

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _prepare(args: argparse.Namespace, tmp: Path) -> DatasetInfo:
    if args.dataset:
        return DatasetInfo.from_dir(args.dataset)
    from sqlenv.data.spider import prepare_spider

    from sqlenv.data.spider import default_spider_dir

    source = default_spider_dir()
    if not (source / "tables.json").exists():
        sys.exit(f"Spider not found at {source}: set SQLENV_SPIDER_DIR")
    t0 = time.perf_counter()
    info = prepare_spider(source, tmp / "spider10", preset="spider10")
    print(f"prepared spider10 in {time.perf_counter() - t0:.1f} s")
    return info


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    w, c = _now()
    return w - t0[0], c - t0[1]


def _raw_pass(connections: dict, mix: list) -> dict[str, float]:
    t0 = _now()
    for q in mix:
        connections[q.database_name].execute(q.gold_sql).fetchall()
    wall, cpu = _since(t0)
    return {"wall": wall, "cpu": cpu}


def _clear_sql_cache() -> None:
    """Forget every SQL text the sandbox has seen: its per-text caches (the full check, the normal form, the price
    of preparing)."""
    from sqlenv.sandbox import prepare_cost, sandbox

    for owner, name in ((sandbox, "check_sql"), (sandbox, "normalize_sql"), (prepare_cost, "cached_expansion")):
        clear = getattr(getattr(owner, name, None), "cache_clear", None)
        if clear is not None:
            clear()


def _bracket_cost(samples: int = 20_000) -> dict[str, float]:
    """What timing one step costs the step's own figure, per clock: the reads of the two clocks between the step's
    two readings (the process's CPU time is a system call, ~1 us on a loaded machine). The raw pass reads the
    clocks once for all its queries; each environment step's time has this subtracted."""
    costs = {"wall": [], "cpu": []}
    for _ in range(5):
        total_wall = total_cpu = 0.0
        for _ in range(samples // 5):
            t1 = _now()
            t2 = _now()
            total_wall += t2[0] - t1[0]
            total_cpu += t2[1] - t1[1]
        costs["wall"].append(total_wall / (samples // 5))
        costs["cpu"].append(total_cpu / (samples // 5))
    return {clock: statistics.median(values) for clock, values in costs.items()}


def _env_pass(envs: dict, mix: list, cold: bool = False, bracket: dict | None = None) -> dict[str, float]:
    """Each step's time (its reset timed apart), less the timing's own cost (`bracket`, `_bracket_cost`)."""
    if cold:
        _clear_sql_cache()
    bracket = bracket or {"wall": 0.0, "cpu": 0.0}
    out = {"wall": 0.0, "cpu": 0.0, "reset_wall": 0.0, "reset_cpu": 0.0}
    for q in mix:
        e = envs[q.split]
        t0 = _now()
        e.reset(question_id=q.question_id)
        t1 = _now()
        obs = e.step(SQLAction("QUERY", q.gold_sql))
        t2 = _now()
        if obs.error:
            raise RuntimeError(f"{q.question_id}: gold SQL failed in the environment: {obs.error}")
        out["reset_wall"] += t1[0] - t0[0]
        out["reset_cpu"] += t1[1] - t0[1]
        out["wall"] += t2[0] - t1[0] - bracket["wall"]
        out["cpu"] += t2[1] - t1[1] - bracket["cpu"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating raw/env rounds (default 7)")
    parser.add_argument("--dataset", default=None, help="an already prepared spider10 dir (default: prepare one)")
    parser.add_argument("--profile", nargs="?", const="warm", choices=("warm", "cold"), default=None,
                        help="cProfile one environment pass, warm (default) or cold (every SQL text new)")
    parser.add_argument("--max-open-databases", type=int, default=None,
                        help="SandboxSettings.max_open_databases for the environments (default: its default)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        info = _prepare(args, Path(tmp))
        settings = SandboxSettings()
        if args.max_open_databases:
            settings.max_open_databases = args.max_open_databases
        mix, envs = [], {}
        for split in info.splits:
            mix += load_questions(info.questions_path(split))
            envs[split] = SQLEnvironment(info.questions_path(split), info.db_dir, step_budget=15, sandbox=settings)
        random.Random(0).shuffle(mix)
        dbs = sorted({q.database_name for q in mix})
        connections = {
            db: sqlite3.connect(f"file:{info.db_dir / db / (db + '.sqlite')}?mode=ro", uri=True, check_same_thread=False)
            for db in dbs
        }
        n = len(mix)
        print(f"mix: {n} gold queries over {len(dbs)} databases; {args.rounds} alternating rounds; "
              f"max_open_databases={settings.max_open_databases}; load average {os.getloadavg()[0]:.1f}")

        _raw_pass(connections, mix)  # warm-up: page caches, sqlglot, the environment's own caches
        _env_pass(envs, mix)
        bracket = _bracket_cost()
        print(f"timing a step costs {bracket['wall'] * 1e6:.2f} us wall, {bracket['cpu'] * 1e6:.2f} us CPU "
              "(subtracted from each step)")

        rows: list[dict] = []
        for r in range(args.rounds):
            raw, warm = _raw_pass(connections, mix), _env_pass(envs, mix, bracket=bracket)
            cold = _env_pass(envs, mix, cold=True, bracket=bracket)
            row = {}
            for clock in CLOCKS:
                row[f"raw_{clock}"] = n / raw[clock]
                row[f"warm_{clock}"] = n / warm[clock]
                row[f"cold_{clock}"] = n / cold[clock]
                row[f"reset_ms_{clock}"] = 1000 * warm[f"reset_{clock}"] / n
            rows.append(row)
            print(f"  round {r + 1}: " + "   ".join(
                f"[{clock}] raw {row[f'raw_{clock}']:6.0f} q/s, env {row[f'warm_{clock}']:6.0f} steps/s "
                f"(ratio {row[f'warm_{clock}'] / row[f'raw_{clock}']:.2f}), cold {row[f'cold_{clock}']:5.0f}"
                for clock in CLOCKS))

        summary: dict[str, float] = {"n_queries": n, "rounds": args.rounds,
                                     "step_timing_us_wall": round(bracket["wall"] * 1e6, 2),
                                     "step_timing_us_cpu": round(bracket["cpu"] * 1e6, 2)}
        for clock in CLOCKS:
            med = {k: statistics.median(row[f"{k}_{clock}"] for row in rows) for k in ("raw", "warm", "cold", "reset_ms")}
            ratio = statistics.median(row[f"warm_{clock}"] / row[f"raw_{clock}"] for row in rows)
            cold_ratio = statistics.median(row[f"cold_{clock}"] / row[f"raw_{clock}"] for row in rows)
            print(f"{clock} clock (median of {args.rounds} rounds):")
            print(f"  raw sqlite3              {med['raw']:8.0f} queries/s")
            print(f"  SQLEnvironment QUERY     {med['warm']:8.0f} steps/s   ratio {ratio:.2f}  "
                  f"(target >= 0.5: {'OK' if ratio >= 0.5 else 'BELOW'})")
            print(f"  ... every SQL text new   {med['cold']:8.0f} steps/s   ratio {cold_ratio:.2f}  (per-text caches cleared; "
                  f"target >= 0.6: {'OK' if cold_ratio >= 0.6 else 'BELOW'})")
            print(f"  reset()                  {med['reset_ms']:8.3f} ms")
            summary.update({f"raw_qps_{clock}": round(med["raw"]), f"env_steps_per_s_{clock}": round(med["warm"]),
                            f"ratio_{clock}": round(ratio, 3), f"env_cold_steps_per_s_{clock}": round(med["cold"]),
                            f"cold_ratio_{clock}": round(cold_ratio, 3), f"reset_ms_{clock}": round(med["reset_ms"], 4)})

        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            _env_pass(envs, mix, cold=args.profile == "cold")
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
            print(buf.getvalue())
        for conn in connections.values():
            conn.close()
        for env in envs.values():
            close = getattr(env, "close", None)
            if close:
                close()
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
