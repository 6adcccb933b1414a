"""GRPO records for the health tests: synthetic ones as a run writes them (`training.run.recorder.RunRecorder`), a run
that collapses and one that learns, with the health metrics per step and a validation panel every 5 steps (the
figures follow issue 45's measurements: grad norms of 0.02-0.04 a step, sampled entropy near 0.6 nats/token, KL from
the start in hundredths of a nat by step 10, a 40-question validation panel); and the recorded runs under
`tests/fixtures/health/` (`RECORDED`, made by `trim_run`), with `signs_by_step`, what the status bar said at each step.

    python tests/health_records.py /tmp/h50/default tests/fixtures/health/tiny_default   # a run's records, trimmed
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.run.recorder import RunRecorder
from training.run.health import ENTROPY_KEY, KL_KEY, REWARD_KEY, VALIDATION_SPLIT, collapse_signs
from training.run.directory import RunDir

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "health"
#: The recorded runs (tests/fixtures/health/<name>/, its README says how each was made): is each healthy?
RECORDED = {"tiny_default": True, "tiny_default_seed1": True, "tiny_destructive": False, "smollm2_h200_builtin": None,
            "smollm2_cpu_recipe": True, "smollm2_cpu_measured": True, "smollm2_sweep_lr3e-6": True,
            "smollm2_sweep_mu2": None}
#: What health reads of a metrics line and of an evals line.
METRIC_FIELDS = ("phase", "step", ENTROPY_KEY, KL_KEY, "grad_norm", REWARD_KEY)
EVAL_FIELDS = ("phase", "step", "split", "success_rate", "n_episodes", "question_ids", "correct", "error")

PANEL = [f"q{i:03d}" for i in range(40)]
#: The panel's outcomes at step 0: the first 18 questions right.
START = [i < 18 for i in range(40)]
STEPS = 20


def validation_line(step: int, correct: list[bool]) -> dict:
    return {"phase": "grpo", "split": VALIDATION_SPLIT, "step": step, "success_rate": sum(correct) / len(correct),
            "n_episodes": len(correct), "question_ids": list(PANEL), "correct": list(correct), "avg_reward": 0.0,
            "avg_steps": 3.0, "time": 1_700_000_000.0 + step}


def flipped(lost: int, gained: int) -> list[bool]:
    """The start's outcomes with the first `lost` right questions wrong and the first `gained` wrong ones right."""
    correct = list(START)
    for i in range(lost):
        correct[i] = False
    for i in range(gained):
        correct[18 + i] = True
    return correct


def write_grpo_run(run: RunDir, *, collapse: bool) -> None:
    """GRPO's metrics and validation evals of a 20-step run through a real `RunRecorder`: with `collapse`, the
    entropy climbs from 0.6 to 1.5 nats/token, the grad norm spikes at step 16 and validation loses 10 questions
    (gaining 1); without, all stay steady and validation gains 4 questions, losing 1."""
    recorder = RunRecorder(run)
    recorder.append("evals", validation_line(0, START))
    for step in range(1, STEPS + 1):
        grad = 0.02 + 0.01 * (step % 3)
        entropy = 0.6 + (0.05 * step if collapse else 0.01 * (step % 2))
        if collapse and step == 16:
            grad = 0.4
        record = {"phase": "grpo", "step": step, "time": 1_700_000_000.0 + step, "reward": 0.3,
                  "reward_std": 0.4 - (0.015 * step if collapse else 0.0), "grad_norm": grad,
                  "groups_mixed_success_frac": 0.5, ENTROPY_KEY: entropy}
        if step % 5 == 0:
            record[KL_KEY] = (0.006 if collapse else 0.0004) * step
        recorder.append("metrics", record)
        if step % 5 == 0:
            share = step / STEPS
            outcomes = flipped(round(10 * share), round(share)) if collapse else flipped(round(share), round(4 * share))
            recorder.append("evals", validation_line(step, outcomes))


# ------------------------------------------------------------------------------------------- recorded runs
def _short(value):
    return float(f"{value:.4g}") if isinstance(value, float) else value


def trim_run(source: Path, target: Path) -> None:
    """A run's GRPO records, as health reads them, kept small: each metrics line's `METRIC_FIELDS` (floats to 4
    significant digits), the validation lines' `EVAL_FIELDS` with the panel's question ids renamed `v00`, `v01`...
    in the order of its first line (pairing by position or by id reads the same); one compact JSON object a line."""
    run = RunDir(Path(source))
    target.mkdir(parents=True, exist_ok=True)
    metrics = [{k: _short(m[k]) for k in METRIC_FIELDS if k in m} for m in run.read("metrics")
               if m.get("phase") == "grpo"]
    panel = [e for e in run.read("evals") if e.get("phase") == "grpo" and e.get("split") == VALIDATION_SPLIT]
    names: dict = {}
    for qid in (panel[0].get("question_ids") or []) if panel else []:
        names.setdefault(qid, f"v{len(names):02d}")
    evals = []
    for e in panel:
        line = {k: _short(e[k]) for k in EVAL_FIELDS if k in e}
        if "question_ids" in line:
            line["question_ids"] = [names.setdefault(q, f"v{len(names):02d}") for q in line["question_ids"]]
        evals.append(line)
    for kind, lines in (("metrics", metrics), ("evals", evals)):
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        (target / f"{kind}.jsonl").write_text(text, encoding="utf-8")


def recorded(name: str) -> tuple[list[dict], list[dict]]:
    """(metrics, evals) of a recorded run, read as the dashboard reads a run's files."""
    run = RunDir(FIXTURES / name)
    return run.read("metrics"), run.read("evals")


def signs_by_step(metrics: list[dict], evals: list[dict]) -> dict[str, list[int]]:
    """For each rule, the GRPO steps after which the status bar warned of it: the signs read from the records written
    up to and including that step, as a live run's bar reads them."""
    steps = sorted({int(m["step"]) for m in metrics if m.get("phase", "grpo") == "grpo"})
    fired: dict[str, list[int]] = {}
    for step in steps:
        seen = [m for m in metrics if m.get("phase", "grpo") != "grpo" or m["step"] <= step]
        played = [e for e in evals if e.get("phase", "grpo") != "grpo" or e["step"] <= step]
        for sign in collapse_signs(seen, played):
            fired.setdefault(sign.rule, []).append(step)
    return fired


if __name__ == "__main__":
    trim_run(Path(sys.argv[1]), Path(sys.argv[2]))
