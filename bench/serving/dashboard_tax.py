"""What the dashboard costs a training run, and how fast a logged metric shows up in its chart.

Trains the same tiny config twice in one invocation: once with the CLI (`python -m training.train`, a plain
subprocess) and once from the dashboard (the app served in this process, training in the runner's training
process, a headless Chromium page open on the Train tab and polling). Both runs log metrics every step;
GRPO steps/s is measured the same way for both, from their metrics.jsonl (step span / time span of the GRPO
log lines, so model building and SFT warm-start are not counted). Prints both rates and the ratio
(target >= 0.9), then the latency from a metrics line being logged (the runner's listener sees the record) to
the page's chart showing that step (target <= 2 s): median and max over the run.

    python bench/serving/dashboard_tax.py [--config configs/tiny_cpu.json] [--steps 20] [--repeats 2] [--set k=v ...]

The last line is one JSON object with the figures. Run it on an otherwise idle machine: the browser and the
training share the cores, and another job (even a `nice`d one in another terminal session: Linux autogroups
share the CPU per session) moves the ratio by tens of percent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

CHROMIUM = os.environ.get("SQLENV_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def grpo_rate(metrics: list[dict]) -> float | None:
    """GRPO optimizer steps per second from metrics lines (each has "step" and "time"): steps after the first
    (warm-up) over the wall time they took, evals and traces included."""
    points = sorted(
        (float(m["step"]), float(m["time"])) for m in metrics
        if isinstance(m.get("step"), (int, float)) and isinstance(m.get("time"), (int, float)) and "reward" in m
    )
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        return None
    return (points[-1][0] - points[0][0]) / (points[-1][1] - points[0][1])


def median_step_rate(metrics: list[dict]) -> float | None:
    """1 / median of the callback's per-step time (`step_time`, evals and traces excluded): robust to the
    bursts of load other processes put on a shared machine."""
    times = [float(m["step_time"]) for m in metrics[1:] if isinstance(m.get("step_time"), (int, float))]
    return 1.0 / statistics.median(times) if times else None


def bench_config(path: Path, steps: int, out: Path, overrides: list[str] = ()) -> Path:
    config = json.loads(path.read_text()) if path.is_file() else {}
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            config[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            config[key.strip()] = value
    # Every step logged (plot_every=1) so both runs are measured on the same points; evals/traces at the same
    # steps in both; no comparison at the end (it runs after GRPO and is not what we time).
    config.update({"max_steps": steps, "plot_every": 1, "comparison_episodes": 0})
    config.pop("run_id", None)
    config.pop("output_dir", None)
    out.write_text(json.dumps(config, indent=2))
    return out


def run_cli(config_path: Path, runs_root: Path) -> tuple[float | None, float | None, float]:
    from training.run.directory import read_jsonl
    from training.run.listing import list_runs

    before = {r["run_id"] for r in list_runs(runs_root)}
    env = dict(os.environ, SQLENV_RUNS_DIR=str(runs_root))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "training.train", "--config", str(config_path)], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"CLI run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    new = [r["run_id"] for r in list_runs(runs_root) if r["run_id"] not in before]
    if not new:
        raise SystemExit("CLI run wrote no run directory")
    metrics = read_jsonl(runs_root / new[0] / "metrics.jsonl")
    return grpo_rate(metrics), median_step_rate(metrics), wall


def run_dashboard(config_path: Path, runs_root: Path, port: int):
    from playwright.sync_api import sync_playwright

    from dashboard.core.context import AppContext
    from dashboard.core.run_data import RunCache
    from dashboard.core.runner import TrainingRunner
    from dashboard.page import build_app
    from dashboard.server import launch
    from training.run.directory import read_jsonl

    runner = TrainingRunner(runs_root)
    ctx = AppContext(runner=runner, runs=RunCache(runs_root), default_config=config_path)
    demo = build_app(ctx)
    launch(demo, "127.0.0.1", port, prevent_thread_lock=True)
    seen: dict[int, float] = {}
    wall = 0.0
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator("#train-start").click()
            page.wait_for_function("() => document.querySelector('#train-form-message')?.dataset.kind === 'ok'",
                                   timeout=60_000)
            t0 = time.time()
            # Note when each plotted step appears with a MutationObserver inside the page (Date.now() is the
            # same clock as time.time() here), so the harness itself does not poll and steal CPU.
            page.evaluate("""() => {
                window.__seen = {};
                const note = () => {
                    const el = document.querySelector('#train-status');
                    const step = el && el.dataset.plottedStep;
                    if (step && !(step in window.__seen)) window.__seen[step] = Date.now() / 1000;
                };
                new MutationObserver(note).observe(document.body, {subtree: true, childList: true, attributes: true});
                note();
            }""")
            while runner.is_running:
                time.sleep(0.5)
            page.wait_for_timeout(2500)  # let the last poll land
            seen = {int(k): float(v) for k, v in page.evaluate("() => window.__seen").items()}
            wall = time.time() - t0
            browser.close()
    finally:
        demo.close()
    run_id = runner.last_run_id
    status = json.loads((runs_root / run_id / "status.json").read_text())
    if status.get("status") != "completed":
        raise SystemExit(f"dashboard run ended {status.get('status')}: {status.get('error')}")
    metrics = read_jsonl(runs_root / run_id / "metrics.jsonl")
    # A step is "shown" when the page first plots it or any later step (polls can cover several steps).
    latencies = []
    for step, logged in runner.metric_times.items():
        shown = min((t for s, t in seen.items() if s >= step), default=None)
        if shown is not None:
            latencies.append(max(0.0, shown - logged))
    return grpo_rate(metrics), median_step_rate(metrics), wall, latencies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "tiny_cpu.json")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps per run (default 20)")
    parser.add_argument("--repeats", type=int, default=2, help="CLI/dashboard pairs, alternated (default 2)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for both runs (JSON value), e.g. --set sft.max_steps=60")
    parser.add_argument("--port", type=int, default=7877)
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"dashboard_tax.py: Chromium not found at {CHROMIUM}", file=sys.stderr)
        raise SystemExit(2)

    with tempfile.TemporaryDirectory(prefix="dashboard-tax-") as tmp:
        tmp = Path(tmp)
        runs_root = tmp / "runs"
        runs_root.mkdir()
        cached = REPO_ROOT / "runs" / "models"
        if cached.is_dir():  # same tiny model for both, built once
            import shutil

            shutil.copytree(cached, runs_root / "models")
        os.environ["SQLENV_RUNS_DIR"] = str(runs_root)
        config_path = bench_config(args.config, args.steps, tmp / "bench_config.json", args.set)
        cli, dash, latencies = [], [], []
        for i in range(args.repeats):  # alternate, so drifting load on a shared machine hits both alike
            rate, median_rate, wall = run_cli(config_path, runs_root)
            print(f"[{i + 1}] CLI:       {rate:.3f} GRPO steps/s over the run, {median_rate:.3f} by median step "
                  f"time (wall {wall:.0f}s)", flush=True)
            cli.append((rate, median_rate))
            rate, median_rate, wall, lat = run_dashboard(config_path, runs_root, args.port + i)
            print(f"[{i + 1}] dashboard: {rate:.3f} GRPO steps/s over the run, {median_rate:.3f} by median step "
                  f"time (wall {wall:.0f}s, page open and polling)", flush=True)
            dash.append((rate, median_rate))
            latencies.extend(lat)
    cli_rate, dash_rate = statistics.median(r for r, _ in cli), statistics.median(r for r, _ in dash)
    cli_med, dash_med = statistics.median(m for _, m in cli), statistics.median(m for _, m in dash)
    ratio, ratio_med = dash_rate / cli_rate, dash_med / cli_med
    latencies.sort()
    lat_median = statistics.median(latencies) if latencies else float("nan")
    lat_p90 = latencies[int(0.9 * (len(latencies) - 1))] if latencies else float("nan")
    lat_max = latencies[-1] if latencies else float("nan")
    print(f"GRPO steps/s over the run:      CLI {cli_rate:.3f}  dashboard {dash_rate:.3f}  ratio {ratio:.3f}"
          "  (target >= 0.9)")
    print(f"GRPO steps/s by median step:    CLI {cli_med:.3f}  dashboard {dash_med:.3f}  ratio {ratio_med:.3f}")
    print(f"metric logged -> shown in chart: median {lat_median:.2f}s  p90 {lat_p90:.2f}s  max {lat_max:.2f}s "
          f"over {len(latencies)} steps  (target <= 2 s)")
    print(json.dumps({
        "cli_steps_per_s": round(cli_rate, 4), "dashboard_steps_per_s": round(dash_rate, 4), "ratio": round(ratio, 4),
        "cli_median_step_rate": round(cli_med, 4), "dashboard_median_step_rate": round(dash_med, 4),
        "ratio_median_step": round(ratio_med, 4), "latency_median_s": round(lat_median, 3),
        "latency_p90_s": round(lat_p90, 3), "latency_max_s": round(lat_max, 3),
        "n_latency_samples": len(latencies), "steps": args.steps, "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
