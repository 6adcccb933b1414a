"""What `bench/gpu/gpu_check.py` writes: `<out>/gpu_check.json` (rewritten whole after every change, so a run cut short
still holds every item before the cut), `<out>/gpu_check.log`, and the summary that ends the run (its last line).

The targets (issue 44) the summary checks: generated tokens/s of the fastest exact decoder at 64 and 256 rows
(SmolLM2-135M's shape), bf16 at least as fast as fp32, the sampler's log-probs within the trainer's (mean |gap|), the
rollout's share of a GRPO step, each learning run's targets (`gpu_learning.TARGETS`) and the first run's planned
seconds (at least `gpu_learning.FIRST_RUN_FLOOR_S`), and no CUDA-graph capture failed (on a CUDA device). It counts,
per item and in all, the captures that failed (their steps then ran eagerly), each recorded with its graph's batch,
window and sampling, and lists the items after which the device had to be repaired (`gpu_measures.settle_device`).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import gpu_measures as measures

__all__ = ["ITEMS", "TARGETS", "Report"]

ITEMS = ("imports", "decoders", "exactness", "grpo_step", "logprob_gap", "bf16_step", "learning")
TARGETS = {"tokens_per_s_at_64": 10_000.0, "tokens_per_s_at_256": 25_000.0, "logprob_gap_mean_abs": 1e-2,
           "rollout_share_of_step": 0.60}


class Report:
    """`<out>/gpu_check.json` and `<out>/gpu_check.log` (see the module docstring)."""

    def __init__(self, out: Path, meta: dict):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "gpu_check.json"
        self.started = time.perf_counter()
        self.data: dict[str, Any] = {"bench": "gpu_check", **meta, "items": {}}
        self._log = open(out / "gpu_check.log", "a", encoding="utf-8")
        self.write()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def log(self, message: str) -> None:
        line = f"[{self.elapsed():6.1f}s] {message}"
        print(line, flush=True)
        self._log.write(line + "\n")
        self._log.flush()

    def write(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def update(self, item: str, **fields: Any) -> None:
        self.data["items"].setdefault(item, {}).update(fields)
        self.write()

    def run(self, item: str, fn: Callable[[], dict]) -> None:
        """Run one item and record it: its figures or its error, its seconds, the CUDA-graph captures that failed in
        it (`capture_failures`: how many; `graph_errors`: each with its graph's batch, window and sampling), and what
        it left broken on the device and was repaired before the next item (`device_repaired`,
        `measures.settle_device`)."""
        self.log(f"item {ITEMS.index(item) + 1}: {item} ...")
        started = time.perf_counter()
        self.update(item, status="running", started_at_s=round(self.elapsed(), 1))
        with measures.CaptureFailures() as failures:
            try:
                figures = fn()
                self.update(item, status="ok", **figures)
            except Exception as exc:  # noqa: BLE001 - one failing item must not hide the next ones
                self.update(item, status="error", error=f"{type(exc).__name__}: {exc}"[:1000],
                            traceback=traceback.format_exc()[-3000:])
        aftermath = {"capture_failures": failures.count, "graph_errors": failures.errors,
                     "device_repaired": measures.settle_device()}
        self.update(item, seconds=round(time.perf_counter() - started, 1),
                    **{key: value for key, value in aftermath.items() if value})
        shown = {k: v for k, v in self.data["items"][item].items() if k not in ("traceback", "rates")}
        self.log(f"item {item}: {json.dumps(shown, default=str)[:1500]}")

    def skip(self, item: str, why: str) -> None:
        """Record an item not run, and why."""
        self.update(item, status="skipped", skipped=why)
        self.log(f"item {ITEMS.index(item) + 1}: {item} skipped: {why}")

    def capture_failures(self) -> dict[str, int]:
        """Per item that had any: the CUDA-graph captures that failed in it."""
        return {k: v["capture_failures"] for k, v in self.data["items"].items() if v.get("capture_failures")}

    def summary(self) -> dict:
        """The headline figures and the targets met (None where the item did not run)."""
        items = self.data["items"]
        decoders = items.get("decoders", {})
        best = decoders.get("best", {})
        gap = items.get("logprob_gap", {})
        step = items.get("grpo_step", {})
        bf16 = items.get("bf16_step", {})

        def at_least(value: Any, target: float) -> bool | None:
            return None if value is None else value >= target

        def fastest(key: str) -> float | None:
            return (best.get(key) or {}).get("tokens_per_s")

        runs = items.get("learning", {}).get("runs") or {}
        # The rollout's share as the model learns (the first learning run's GRPO phase), else item 4's step.
        share = next((r["rollout_share"] for r in runs.values() if r.get("rollout_share") is not None),
                     step.get("rollout_share"))
        checks = {
            "tokens_per_s_at_64>=10000": at_least(fastest("fp32@64"), TARGETS["tokens_per_s_at_64"]),
            "tokens_per_s_at_256>=25000": at_least(fastest("fp32@256"), TARGETS["tokens_per_s_at_256"]),
            "bf16>=fp32_at_64": None if fastest("bf16@64") is None or fastest("fp32@64") is None
            else fastest("bf16@64") >= fastest("fp32@64"),
            "logprob_gap_mean_abs<=1e-2": None if gap.get("mean_abs") is None
            else gap["mean_abs"] <= TARGETS["logprob_gap_mean_abs"],
            "bf16_logprob_gap_mean_abs<=1e-2": None if bf16.get("logprob_gap", {}).get("mean_abs") is None
            else bf16["logprob_gap"]["mean_abs"] <= TARGETS["logprob_gap_mean_abs"],
            "rollout_share<=0.60": None if share is None else share <= TARGETS["rollout_share_of_step"],
        }
        failures = self.capture_failures()
        checks["capture_failures==0"] = None if self.data.get("device", "cpu") == "cpu" else not failures
        learning = {}
        for name, run in runs.items():
            after, warm, targets = run.get("after_grpo"), run.get("warm_start"), run.get("targets") or {}
            learning[name] = {k: run.get(k) for k in ("warm_start", "after_grpo", "paired", "grpo_steps",
                                                      "eval_questions", "budget_s", "rollout_share", "skipped",
                                                      "error")}
            if run.get("floor_s") is not None:
                checks[f"{name}: budget_s>={run['floor_s']:.0f}"] = run["budget_s"] >= run["floor_s"]
            if "warm_start" in targets:
                checks[f"{name}: warm_start>={targets['warm_start']}"] = at_least(warm, targets["warm_start"])
            if "after_grpo" in targets:
                checks[f"{name}: after_grpo>={targets['after_grpo']}"] = at_least(after, targets["after_grpo"])
            if "gain_over_warm_start" in targets:
                checks[f"{name}: after_grpo>=warm_start+{targets['gain_over_warm_start']}"] = (
                    None if after is None or warm is None else after >= warm + targets["gain_over_warm_start"] - 1e-9)
        return {"bench": "gpu_check", "dry_run": self.data.get("dry_run"), "device": self.data.get("device"),
                "elapsed_s": round(self.elapsed(), 1), "status": {k: items.get(k, {}).get("status") for k in ITEMS},
                "fastest_exact": best, "rollout_s": step.get("rollout_s"), "step_s": step.get("step_s"),
                "rollout_share": share, "step_rollout_share": step.get("rollout_share"),
                "logprob_gap_mean_abs": gap.get("mean_abs"),
                "bf16_logprob_gap_mean_abs": bf16.get("logprob_gap", {}).get("mean_abs"),
                "bf16_step_s": bf16.get("step_s"), "learning": learning,
                "capture_failures": sum(failures.values()), "capture_failures_by_item": failures,
                "device_repaired": [k for k, v in items.items() if v.get("device_repaired")], "checks": checks}
