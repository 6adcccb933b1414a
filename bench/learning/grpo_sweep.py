"""The GRPO recipe chosen by a recorded sweep: short GRPO tries from ONE saved warm start, judged on a fixed panel.

    python bench/learning/grpo_sweep.py --out runs/sweep                       # every try of TRIES, in order
    python bench/learning/grpo_sweep.py --out runs/sweep --tries lr3e-6,neg0.3  # some of them (the warm start reused)
    python bench/learning/grpo_sweep.py --out runs/sweep --try "mine:learning_rate=2e-6,negative_advantage_weight=0.5"
    python bench/learning/grpo_sweep.py --config configs/tiny_cpu.json --out /tmp/s --steps 2 --validation 16 \\
        --tries lr3e-6

1. **The warm start**, once: the config's SFT (`sft` section), with the validation panel held out of the teacher's
   episodes, saved to `<out>/warm_start/`. Every try starts from it, so the tries differ only in what they set.
2. **Each try** is a real run (`training.train.run_training`: the dashboard's and the CLI's path) of `--steps` GRPO
   steps of the config with the try's settings (`TrainConfig` fields, `grpo.*` pass-through), from the warm start,
   no comparison: its run directory is `<out>/tries/<name>/`. Its validation panel (`validation_questions` =
   `--validation`, the same questions in every try: the panel is drawn from the seed) is played greedily at step 0
   and at the end (and every `--eval-every` steps), with `keep_best` off: the try reports where GRPO took the model.
   A try whose batch is larger plays fewer steps, so tries of 16, 32 and 64 episodes a step take about equal time
   (`steps x episodes` is kept at `--steps x` the config's episodes a step); a try that reuses each batch for
   `num_iterations` optimizer steps plays that many times the steps, on the same episodes.
3. **The verdict** of a try is the paired count on the panel, start vs end: questions gained, lost and the net. Sampled
   success over 16 episodes has a standard deviation of ~0.12 a step and says little; greedy play of the same questions
   before and after says which questions moved. With it: the policy's drift (`health/kl_start` at the end), the
   sampled entropy's first and last step, the grad norm (median, max), the share of mixed groups, the step time, and
   the try's wall and CPU minutes (the process's CPU time barely moves when other work shares the cores).

Each try's record is appended to `<out>/sweep.jsonl` as it ends (a sweep cut short keeps the tries before the cut; a
try already there is not run again unless `--again`). The table is printed at the end, and the last line is one JSON
object: the tries, each with its settings and figures, and the best by net gain. Tries run one at a time: on a 2-core
machine two heavy jobs slow each other ~3x.

**A sweep survives a restart**: run the same command again. A finished try (in `sweep.jsonl`) is skipped; a try whose
run directory was cut short (the process killed, the machine restarted, a stop) resumes from its last checkpoint
(`training.train.resume_training`: weights, optimizer, scheduler, RNG, and its records cut back to that step), or
from its start when it saved none; a try that ended but whose record was never written is read back, not run again.
A try resumes only when its run directory holds the same config as the command asks (else it starts over, and says
why). Tries save checkpoints as any run does (`save_steps` auto: every tenth of the try for the tiny model, one just
past half-way for a pretrained model, ~1.6 GB for SmolLM2-135M, removed when the try completes). The warm start is
not resumable: one cut short is played again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
DEFAULT_CONFIG = REPO / "configs" / "smollm2_cpu.json"

#: The tries, by name: the settings each changes from the config (after `BASE_TRY`). The base recipe is 16 episodes a
#: step (4 questions x 4 generations). "LoRA without regret": rank-1 LoRA matches full fine-tuning at about 10x the rate.
TRIES: dict[str, dict[str, Any]] = {
    "lr1e-6": {"learning_rate": 1e-6},
    "lr3e-6": {"learning_rate": 3e-6},
    "lr1e-5": {"learning_rate": 1e-5},
    "lora-r1": {"learning_rate": 3e-5, "lora": {"r": 1, "alpha": 2, "dropout": 0.0, "target_modules": "all-linear"}},
    "lora-r8": {"learning_rate": 3e-5, "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}},
    "ep32": {"learning_rate": 3e-6, "gradient_accumulation_steps": 32},
    "ep64": {"learning_rate": 3e-6, "gradient_accumulation_steps": 64},
    "beta0.02": {"learning_rate": 3e-6, "beta": 0.02},
    "neg0.3": {"learning_rate": 3e-6, "negative_advantage_weight": 0.3},
    "neg0": {"learning_rate": 3e-6, "negative_advantage_weight": 0.0},
    "adam-eps1e-6": {"learning_rate": 1e-5, "grpo": {"adam_epsilon": 1e-6}},
    "sgd": {"learning_rate": 0.3, "grpo": {"optim": "sgd", "optim_args": "momentum=0.9"}},
    "T1.0": {"learning_rate": 3e-6, "temperature": 1.0},
    # mu = 2: each generation batch feeds two optimizer steps (TRL's `num_iterations`, its clipped ratio against the
    # log-probs of the policy that sampled it); the try plays as many episodes as the others, in twice the steps.
    "mu2": {"learning_rate": 3e-6, "grpo": {"num_iterations": 2}},
}

#: What every try sets, whatever the config: GRPO only, from the saved warm start, no comparison. Checkpoints as the
#: config says (auto: see the module docstring): what a try cut short resumes from.
BASE_TRY = {"sft": False, "compare_base": False, "comparison_episodes": 0, "zero_shot_episodes": 0,
            "keep_best": False, "trace_every": 0, "eval_episodes": 0, "plot_every": 1}


def log(message: str) -> None:
    print(message, flush=True)


# ------------------------------------------------------------------------------------------------ the warm start
def warm_start(config: Any, folder: Path) -> Path:
    """The config's warm start with the validation panel held out, saved to `folder` (reused when it is there)."""
    if (folder / "config.json").is_file():
        log(f"warm start: reusing {folder}")
        return folder
    from training.models import load_model_and_tokenizer
    from training.phases import sft_settings
    from training.plan import RunPlan
    from training.warm_start import run_sft

    plan = RunPlan.resolve(dataclasses.replace(config, output_dir=str(folder.parent / "warm_start_run"),
                                               run_id="warm_start_run"))
    if plan.cpu_threads:
        import torch

        torch.set_num_threads(plan.cpu_threads)
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(config.model, seed=config.seed, dataset=plan.dataset,
                                                device=plan.device)
    result = run_sft(model, tokenizer, sft_settings(plan))
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    os.replace(tmp, folder)
    log(f"warm start: {result.steps} steps, loss {result.first_loss:.3f} -> {result.final_loss:.3f}, "
        f"{time.perf_counter() - start:.0f} s, panel of {len(plan.validation_ids)} held out -> {folder}")
    return folder


# ------------------------------------------------------------------------------------------------------ a try
def try_config(base: Any, settings: dict[str, Any], *, warm: Path, steps: int, validation: int, eval_every: int,
               out: Path, name: str) -> Any:
    """The run config of one try: the base config, `BASE_TRY`, the try's settings, and its steps (fewer for a larger
    batch, more for a batch reused `num_iterations` times: equal episodes in all)."""
    values = {**BASE_TRY, "model": str(warm), "validation_questions": validation, "eval_every": eval_every,
              "output_dir": str(out / "tries" / name), "run_id": f"sweep-{name}"}
    grpo = {**(base.grpo or {}), **settings.get("grpo", {})}
    values.update({k: v for k, v in settings.items() if k != "grpo"}, grpo=grpo)
    episodes = base.generation_batch_size
    tried = values.get("per_device_train_batch_size", base.per_device_train_batch_size) * values.get(
        "gradient_accumulation_steps", base.gradient_accumulation_steps)
    values["max_steps"] = max(1, round(steps * episodes / tried)) * int(grpo.get("num_iterations", 1))
    if values.get("eval_every", 0) >= values["max_steps"]:
        values["eval_every"] = 0  # only start and end
    return base.with_overrides(values)


def paired(start: list[bool], end: list[bool]) -> dict[str, int]:
    """Questions the end got right that the start got wrong (gained), the reverse (lost), and the net."""
    gained = sum(1 for a, b in zip(start, end) if b and not a)
    lost = sum(1 for a, b in zip(start, end) if a and not b)
    return {"gained": gained, "lost": lost, "net": gained - lost}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def config_differs(saved: dict[str, Any], config: Any) -> list[str]:
    """The fields `config` sets (not left to auto; `sft.*` and `grpo.*` field by field) that a run directory's saved
    config holds otherwise (where the run lives aside: a relative `--out` is saved resolved)."""

    def differs(want: Any, have: Any, name: str) -> list[str]:
        if isinstance(want, dict) and isinstance(have, dict):
            return [f for key, value in want.items() for f in differs(value, have.get(key), f"{name}.{key}")]
        return [] if want is None or want == have else [name]

    want = _jsonable(config.to_dict())
    return sorted(f for key, value in want.items() if key not in ("output_dir", "run_id")
                  for f in differs(value, saved.get(key), key))


def try_state(config: Any, *, again: bool = False) -> tuple[str, str]:
    """What to do with a try's run directory: ("start", why), ("resume", why) or ("read", why): start it afresh (no
    run there, `again`, another config, or nothing resumable), resume it (cut short: killed, stopped or failed), or
    read back a try that completed. Raises RuntimeError while another process still runs it."""
    from training.run.directory import RESUMABLE_STATUSES, RunDir

    run = RunDir(Path(config.output_dir))
    if again or not run.file("status.json").is_file() or not run.file("config.json").is_file():
        return "start", "run again" if again and run.path.exists() else "new"
    state = run.read_live_status().get("status")
    if state in ("queued", "running"):
        raise RuntimeError(f"{run.path} is {state} in another process (pid {run.read_status().get('pid')})")
    differs = config_differs(run.read_config(), config)
    if differs:
        return "start", f"its run directory holds another config ({', '.join(differs)})"
    if state == "completed":
        return "read", "completed before its record was written"
    if state in RESUMABLE_STATUSES:
        return "resume", f"{state} at step {run.read_status().get('step')}"
    return "start", f"its run directory reads {state!r}"


def run_try(name: str, config: Any, *, again: bool = False, stop_event: Any = None,
            listener: Any = None) -> dict[str, Any]:
    """Run one try (or resume it, or read it back: `try_state`) and read its figures back from its run directory.
    `stop_event` and `listener` are `run_training`'s (a stopped try resumes on the next call)."""
    import shutil

    from training.run.directory import RunDir
    from training.train import resume_training, run_training

    run_path = Path(config.output_dir)
    action, why = try_state(config, again=again)
    log(f"try {name}: {dict(start='starting', resume='resuming', read='reading')[action]} ({why})")
    if action == "start":
        shutil.rmtree(run_path, ignore_errors=True)
    load_before = os.getloadavg()[0]
    start, cpu_start = time.perf_counter(), time.process_time()
    error = None
    try:
        if action == "start":
            run_training(config, stop_event, listener)
        elif action == "resume":
            resume_training(run_path, stop_event, listener)
    except Exception as exc:  # noqa: BLE001 - a failed try is a row of the table, the sweep goes on
        error = f"{type(exc).__name__}: {exc}"
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    run = RunDir(run_path)
    panel = [e for e in run.read("evals") if e.get("split") == "validation"]
    metrics = [m for m in run.read("metrics") if m.get("phase", "grpo") == "grpo" and "loss" in m]
    status = run.read_status()
    record: dict[str, Any] = {"name": name, "error": error or status.get("error"), "status": status.get("status"),
                              # CPU seconds barely move when other work shares the cores; wall seconds do
                              "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_1min_before": round(load_before, 2),
                              "load_1min_after": round(os.getloadavg()[0], 2), "steps": config.max_steps,
                              "episodes_per_step": config.generation_batch_size,
                              # wall_s is this process's part of the try only when it resumed
                              "resumes": int(status.get("resumes") or 0)}
    if panel:
        first, last = panel[0], panel[-1]
        record.update(validation_start=first["success_rate"], validation_end=last["success_rate"],
                      validation_n=first["n_episodes"],
                      validation_by_step={str(e["step"]): e["success_rate"] for e in panel},
                      **paired(first["correct"], last["correct"]))

    def series(key: str) -> list[float]:
        return [m[key] for m in metrics if isinstance(m.get(key), (int, float))]

    kl, entropy, grad = series("health/kl_start"), series("health/sampled_entropy"), series("grad_norm")
    step_times = series("step_time")
    record.update(
        kl_start_end=kl[-1] if kl else None, kl_start_max=max(kl) if kl else None,
        entropy_first=entropy[0] if entropy else None, entropy_last=entropy[-1] if entropy else None,
        grad_norm_median=statistics.median(grad) if grad else None, grad_norm_max=max(grad) if grad else None,
        mixed_groups_mean=statistics.fmean(series("groups_mixed_success_frac")) if series(
            "groups_mixed_success_frac") else None,
        sampled_success=[round(v, 3) for v in series("rewards/reward_correctness/mean")],
        step_s_median=statistics.median(step_times) if step_times else None,
    )
    return record


# ------------------------------------------------------------------------------------------------------ table
def table(records: list[dict[str, Any]]) -> str:
    def fmt(value: Any, spec: str = ".3f") -> str:
        return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)

    def shape(r: dict[str, Any]) -> str:  # "20 x 16 (each batch twice)" for a try that reuses its batches
        reuse = ((r.get("settings") or {}).get("grpo") or {}).get("num_iterations", 1)
        return f"{r['steps']} x {r['episodes_per_step']}" + (f" (each batch {reuse}x)" if reuse > 1 else "")

    rows = ["| try | steps x episodes | validation start -> end | gained / lost / net | KL end | entropy first -> "
            "last | grad norm median (max) | mixed groups | step s | min (CPU min) |", "|" + "---|" * 10]
    for r in records:
        if r.get("validation_start") is None:
            rows.append(f"| {r['name']} | {shape(r)} | failed: {r.get('error')} |" + " |" * 7)
            continue
        rows.append(
            f"| {r['name']} | {shape(r)} | {r['validation_start']:.1%} -> "
            f"{r['validation_end']:.1%} | {r['gained']} / {r['lost']} / {r['net']:+d} | {fmt(r['kl_start_end'], '.4f')} | "
            f"{fmt(r['entropy_first'])} -> {fmt(r['entropy_last'])} | {fmt(r['grad_norm_median'])} "
            f"({fmt(r['grad_norm_max'])}) | {fmt(r['mixed_groups_mean'], '.2f')} | {fmt(r['step_s_median'], '.0f')} | "
            f"{fmt(r.get('wall_s', 0.0) / 60, '.0f')} ({fmt(r['cpu_s'] / 60 if r.get('cpu_s') else None, '.0f')}) |")
    return "\n".join(rows)


def parse_try(text: str) -> tuple[str, dict[str, Any]]:
    """`name:key=value,key=value` (values as `--set` parses them) -> (name, settings)."""
    from training.config import TrainConfig
    from training.config.overrides import apply_overrides

    name, _, body = text.partition(":")
    if not name or not body:
        raise ValueError(f"--try {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
    pairs = [p.strip() for p in body.split(",") if p.strip()]
    default = TrainConfig()
    changed = apply_overrides(default, pairs)
    base = default.to_dict()
    settings = {k: v for k, v in changed.items() if k != "grpo" and v != base.get(k)}
    if changed.get("grpo"):
        settings["grpo"] = changed["grpo"]
    return name.strip(), settings


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, Any, list[tuple[str, dict[str, Any]]]]:
    """The command line as (args, the swept config, the tries as (name, settings)), every try's config checked.
    Raises ConfigError or ValueError on a bad one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the recipe swept (default %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="the sweep's folder (warm start, tries, sweep.jsonl)")
    parser.add_argument("--tries", default=",".join(TRIES), help="comma-separated names of TRIES (default: all)")
    parser.add_argument("--try", dest="extra", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="a try of your own (repeatable), run after --tries")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps of a try at the config's batch "
                        "(default %(default)s; a larger batch plays fewer)")
    parser.add_argument("--validation", type=int, default=100, help="validation panel size (default %(default)s)")
    parser.add_argument("--eval-every", type=int, default=0, help="also validate every N steps (default: only at "
                        "the start and the end)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change the swept config for every try and the warm start (e.g. cpu_threads=1)")
    parser.add_argument("--again", action="store_true", help="run tries already in sweep.jsonl again")
    args = parser.parse_args(argv)

    from training.config import ConfigError, TrainConfig

    unknown = [n for n in args.tries.split(",") if n and n not in TRIES]
    if unknown:
        raise ConfigError(f"--tries: unknown {unknown}; known: {', '.join(TRIES)}")
    chosen = [(n, TRIES[n]) for n in args.tries.split(",") if n] + [parse_try(t) for t in args.extra]
    base = TrainConfig.from_json(args.config).with_overrides(args.overrides)
    base = base.with_overrides({"validation_questions": args.validation})
    for name, settings in chosen:  # every try's config is checked before the first one runs
        try_config(base, settings, warm=args.out / "warm_start", steps=args.steps, validation=args.validation,
                   eval_every=args.eval_every, out=args.out, name=name)
    return args, base, chosen


def main(argv: list[str] | None = None) -> int:
    from training.config import ConfigError
    from training.run.directory import read_jsonl

    try:
        args, base, chosen = parse(argv)
    except (ConfigError, ValueError) as exc:
        print(f"grpo_sweep: {exc}", file=sys.stderr)
        return 2

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args.out.mkdir(parents=True, exist_ok=True)
    warm = warm_start(base, args.out / "warm_start")
    ledger = args.out / "sweep.jsonl"
    done = {record["name"]: record for record in read_jsonl(ledger) if "name" in record}  # a torn line skipped
    records = []
    for name, settings in chosen:
        if name in done and not args.again:
            log(f"try {name}: already in {ledger}")
            records.append(done[name])
            continue
        config = try_config(base, settings, warm=warm, steps=args.steps, validation=args.validation,
                            eval_every=args.eval_every, out=args.out, name=name)
        log(f"try {name}: {settings} ({config.max_steps} steps of {config.generation_batch_size} episodes)")
        try:
            record = {**run_try(name, config, again=args.again), "settings": settings}
        except RuntimeError as exc:  # another process runs it: neither touched nor recorded
            log(f"try {name}: skipped: {exc}")
            continue
        with ledger.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        log(f"try {name}: validation {record.get('validation_start')} -> {record.get('validation_end')}, "
            f"gained {record.get('gained')} lost {record.get('lost')}, {record['wall_s']:.0f} s")
        records.append(record)
    print(table(records))
    ok = [r for r in records if r.get("net") is not None]
    best = max(ok, key=lambda r: (r["net"], -r["lost"]), default=None)
    print(json.dumps({"config": str(args.config), "steps": args.steps, "validation": args.validation,
                      "warm_start": str(warm), "tries": records, "best": best["name"] if best else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
