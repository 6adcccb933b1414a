"""Which warm start teaches a model the SQL, not only the protocol: SFT tries judged on one fixed panel.

    python bench/learning/warm_start_sweep.py --out runs/ws_sweep                     # every try of TRIES, in order
    python bench/learning/warm_start_sweep.py --out runs/ws_sweep --tries lr1e-4,lr3e-4 --set cpu_threads=1
    python bench/learning/warm_start_sweep.py --out runs/ws_sweep --try "mine:sft.learning_rate=2e-4,sft.epochs=2"
    python bench/learning/warm_start_sweep.py --out runs/ws_sweep --tries lr3e-4 --eval 203   # + the eval split
    python bench/learning/warm_start_sweep.py --config configs/tiny_cpu.json --out /tmp/w --validation 8 \\
        --try "smoke:sft.max_steps=2"                                                     # CI's smallest form

Each try is the config's warm start (its `sft` section, with the try's settings applied as `--set` keys are) from the
config's model, with the run's validation panel (`--validation` train questions, drawn from the seed: the same in
every try) held out of the teacher's episodes. The warm-started model then plays the panel greedily, as GRPO's
validation does, and the try's record says what it scored there: success and EX, which questions it got right (so
two tries compare question by question: gained, lost), the SFT loss, the minutes of each part, the device and threads.
With `--eval N` the try's model also plays the first N questions of the eval split (the comparison's base column).

Each record is appended to `<out>/sweep.jsonl` when its try ends, and each try's model is kept in
`<out>/tries/<name>/warm_start/` (a model directory: `--eval` it later, or start GRPO from it with `model=<it>`): a
try already in the ledger is skipped (unless `--again`), a try whose warm start was saved before a restart is
judged without training again, and a try cut short during its SFT goes on from its newest checkpoint (every
`save_steps` steps: `--set save_steps=10` for a try that needs more hours than one sitting). With `--spider-dev N`
the model also plays N questions of Spider's dev set drawn with the seed: Spider's own protocol, on databases that no
training question touches (success, official EX, per hardness). Each judged split's transcripts are kept beside the
model (`eval_episodes.jsonl`, `spider_dev_episodes.jsonl`). The table is
printed at the end; the last line is one JSON object with every try and the best by panel success. Tries run one
at a time: on a 2-core machine two heavy jobs slow each other ~3x (run two sweeps with `--set cpu_threads=1` and
different `--out`s to use both cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
DEFAULT_CONFIG = REPO / "configs" / "smollm2_spider10_cpu.json"

#: The tries, by name: `--set` keys each changes from the config. docs/EXPERIMENTS.md (section 17) has their figures.
TRIES: dict[str, list[str]] = {
    "lr1e-4": ["sft.learning_rate=1e-4", "sft.tidy_sql=false"],
    "lr3e-4": ["sft.learning_rate=3e-4", "sft.tidy_sql=false"],
    "tidy": ["sft.learning_rate=3e-4", "sft.tidy_sql=true"],
    "tidy-fix": ["sft.learning_rate=3e-4", "sft.tidy_sql=true", "sft.teacher_error_rate=0.25",
                 "sft.teacher_mistakes=[\"query_fix\"]"],
    "tidy-sample": ["sft.learning_rate=3e-4", "sft.tidy_sql=true", "sft.sample_values=true"],
    "tidy-extra": ["sft.learning_rate=3e-4", "sft.tidy_sql=true", "sft.extra_dataset=spider_dev",
                   "sft.extra_episodes=800"],
    "tidy-5ep": ["sft.learning_rate=3e-4", "sft.tidy_sql=true", "sft.epochs=5"],
    "full-prompt": ["sft.learning_rate=3e-4", "prompt=full"],
    # Against the config as it is (lr 3e-4, tidy_sql, 2 epochs): the reference the issue-57 tries pair with.
    "chosen": [],
    "tidy-3ep": ["sft.epochs=3"],
    # Spider's own protocol: a warm start on train_spider.json questions only (414 of them, the config's count),
    # judged with --spider-dev on dev databases it never saw.
    "spider-dev": ["dataset=spider_dev", "sft.episodes=414"],
}


def log(message: str) -> None:
    print(message, flush=True)


def try_config(base: Any, pairs: list[str], *, out: Path, name: str) -> Any:
    """The config of one try: the base config with the try's `--set` pairs, its own run folder, no GRPO phases."""
    return base.with_overrides(list(pairs) + [f"output_dir={out / 'tries' / name}", f"run_id=ws-{name}"])


def train(config: Any, folder: Path) -> dict[str, Any]:
    """The try's warm start, saved to `folder`; its SFT figures."""
    from training.models import load_model_and_tokenizer
    from training.phases import sft_settings
    from training.plan import RunPlan
    from training.warm_start import run_sft

    plan = RunPlan.resolve(config)
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(config.model, seed=config.seed, dataset=plan.dataset,
                                                device=plan.device)
    settings = sft_settings(plan)
    from transformers import TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint

    # A try cut short (a session's end, a restart) goes on from its newest checkpoint (`save_steps`, under the try's
    # checkpoints/sft/): a try that needs more hours than one sitting still ends.
    checkpoint = get_last_checkpoint(settings.output_dir) if Path(settings.output_dir).is_dir() else None
    if checkpoint:
        log(f"  resuming the warm start from {checkpoint}")

    class Progress(TrainerCallback):  # the SFT loss as it goes: a try runs for an hour or more
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                log(f"  sft step {state.global_step}/{state.max_steps}: loss {logs['loss']:.3f}, "
                    f"{time.perf_counter() - start:.0f} s")

    result = run_sft(model, tokenizer, settings, callbacks=[Progress()], resume_from_checkpoint=checkpoint)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    os.replace(tmp, folder)
    figures = {"sft_steps": result.steps, "sft_episodes": result.n_examples, "sft_loss_first": result.first_loss,
               "sft_loss_last": result.final_loss, "sft_s": round(time.perf_counter() - start, 1),
               "sft_precision": settings.precision,
               "sft_resumed_at": int(Path(checkpoint).name.split("-")[-1]) if checkpoint else None}
    (folder / "sft.json").write_text(json.dumps(figures) + "\n", encoding="utf-8")
    return figures


def spider_dev_sample(n: int, seed: int) -> list[str]:
    """`n` question ids of Spider's dev set (`spider_dev`'s eval split: databases no train question touches), drawn
    without replacement with `seed`: every try, and every reader who reruns it, plays the same questions."""
    import random

    from sqlenv.data.datasets import resolve_dataset

    ids = [q.question_id for q in resolve_dataset("spider_dev").load("eval")]
    if n > len(ids):
        raise ValueError(f"--spider-dev {n}: spider_dev's eval split has {len(ids)} questions")
    return random.Random(seed).sample(ids, n)


def spider_dev_overlap(plan: Any) -> list[str]:
    """The dev databases whose questions the try's teacher saw (its dataset's train split, and its extra dataset's):
    a figure on them is not Spider's protocol. spider10 pools train and dev questions of its 10 databases, 9 of them
    dev's, so its warm starts overlap; one made on `spider_dev`'s train split (train_spider.json) does not."""
    from sqlenv.data.datasets import resolve_dataset

    dev = {q.database_name for q in resolve_dataset("spider_dev").load("eval")}
    seen = {q.database_name for q in plan.dataset.load(plan.config.train_split)}
    if plan.config.sft.extra_dataset:
        seen |= {q.database_name for q in resolve_dataset(plan.config.sft.extra_dataset).load("train")}
    return sorted(dev & seen)


def write_episodes(path: Path, result: Any) -> None:
    """A judged split's transcripts, one JSON line each: what the figures were made of (EX above success is read
    here: the right query, then a wrong or missing ANSWER)."""
    path.write_text("".join(json.dumps(e, default=str) + "\n" for e in result.episodes), encoding="utf-8")


def hardness(result: Any) -> dict[str, Any]:
    """Success and EX per Spider hardness, with counts: `{hardness: {n, success_rate, execution_accuracy}}`."""
    cells = result.breakdown()["hardness"]
    return {h: {k: c.get(k) for k in ("n", "success_rate", "execution_accuracy")} for h, c in cells.items()}


def judge(config: Any, folder: Path, eval_n: int, spider_dev_n: int = 0) -> dict[str, Any]:
    """The saved warm start played greedily on the panel (and on `eval_n` eval questions, and on a seeded sample of
    `spider_dev_n` questions of Spider's dev set); the transcripts are kept beside the model."""
    from training.generation.model_policy import evaluate_model
    from training.evals import eval_batch_size
    from training.models import load_model_and_tokenizer
    from training.plan import RunPlan

    plan = RunPlan.resolve(config)
    model, tokenizer = load_model_and_tokenizer(str(folder), device=plan.device)
    model.eval()
    common = dict(step_budget=config.step_budget, max_turn_tokens=config.max_turn_tokens, seed=config.seed,
                  enable_thinking=config.enable_thinking, prompt=config.prompt,
                  batch_size=eval_batch_size(config, model))
    figures: dict[str, Any] = {}
    start = time.perf_counter()
    panel = evaluate_model(model, tokenizer, dataset=plan.dataset, split=config.train_split,
                           question_ids=list(plan.validation_ids), **common)
    figures.update(panel_n=panel.n_episodes, panel_success=panel.success_rate,
                   panel_ex=panel.execution_accuracy, panel_steps=panel.avg_steps,
                   panel_correct=[bool(e.get("correct")) for e in panel.episodes],
                   panel_ids=list(plan.validation_ids), panel_s=round(time.perf_counter() - start, 1))
    if eval_n:
        start = time.perf_counter()
        result = evaluate_model(model, tokenizer, dataset=plan.dataset, split=config.eval_split,
                                n_episodes=eval_n, **common)
        figures.update(eval_n=result.n_episodes, eval_success=result.success_rate,
                       eval_ex=result.execution_accuracy, eval_hardness=hardness(result),
                       eval_s=round(time.perf_counter() - start, 1))
        write_episodes(folder.parent / "eval_episodes.jsonl", result)
    if spider_dev_n:
        start = time.perf_counter()
        result = evaluate_model(model, tokenizer, dataset="spider_dev", split="eval",
                                question_ids=spider_dev_sample(spider_dev_n, config.seed), **common)
        figures.update(spider_dev_n=result.n_episodes, spider_dev_success=result.success_rate,
                       spider_dev_ex=result.execution_accuracy, spider_dev_hardness=hardness(result),
                       spider_dev_overlap=spider_dev_overlap(plan), spider_dev_s=round(time.perf_counter() - start, 1))
        write_episodes(folder.parent / "spider_dev_episodes.jsonl", result)
    return figures


def run_try(name: str, config: Any, *, out: Path, eval_n: int, spider_dev_n: int = 0) -> dict[str, Any]:
    from training.plan import RunPlan

    plan = RunPlan.resolve(config)
    if plan.cpu_threads:
        import torch

        torch.set_num_threads(plan.cpu_threads)
    folder = out / "tries" / name / "warm_start"
    folder.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"name": name, "device": plan.device, "cpu_threads": plan.cpu_threads,
                              "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
                              "load_1min_before": round(os.getloadavg()[0], 2)}
    try:
        if (folder / "sft.json").is_file():
            log(f"try {name}: its warm start was saved before: judging it")
            record.update(json.loads((folder / "sft.json").read_text(encoding="utf-8")), sft_reused=True)
        else:
            record.update(train(config, folder))
        record.update(judge(config, folder, eval_n, spider_dev_n))
    except Exception as exc:  # noqa: BLE001 - a failed try is a row of the table, the sweep goes on
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["load_1min_after"] = round(os.getloadavg()[0], 2)
    return record


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, int] | None:
    """Panel questions `b` got right that `a` got wrong (gained), the reverse (lost); None if panels differ."""
    if a.get("panel_ids") != b.get("panel_ids") or not a.get("panel_correct"):
        return None
    gained = sum(1 for x, y in zip(a["panel_correct"], b["panel_correct"]) if y and not x)
    lost = sum(1 for x, y in zip(a["panel_correct"], b["panel_correct"]) if x and not y)
    return {"gained": gained, "lost": lost}


def table(records: list[dict[str, Any]]) -> str:
    rows = ["| try | settings | SFT steps (episodes) | loss first -> last | panel success (EX) | vs first try "
            "(gained / lost) | eval success (EX) | spider_dev success (EX) | SFT min | panel min | device, threads |",
            "|" + "---|" * 11]
    first = next((r for r in records if r.get("panel_correct")), None)
    for r in records:
        settings = " ".join(r.get("settings", []))
        if r.get("panel_success") is None:
            rows.append(f"| {r['name']} | {settings} | failed: {r.get('error')} |" + " |" * 8)
            continue
        vs = paired(first, r) if first is not None and first is not r else None
        versus = "-" if vs is None else f"{vs['gained']} / {vs['lost']}"
        loss = (f"{r['sft_loss_first']:.3f} -> {r['sft_loss_last']:.3f}"
                if r.get("sft_loss_last") is not None else "-")
        ev = (f"{r['eval_success']:.1%} ({r['eval_ex']:.1%}) of {r['eval_n']}" if r.get("eval_n") else "-")
        dev = (f"{r['spider_dev_success']:.1%} ({r['spider_dev_ex']:.1%}) of {r['spider_dev_n']}"
               if r.get("spider_dev_n") else "-")
        if r.get("spider_dev_overlap"):
            dev += f" (not Spider's protocol: trained on {len(r['spider_dev_overlap'])} dev databases)"
        rows.append(
            f"| {r['name']} | {settings} | {r.get('sft_steps')} ({r.get('sft_episodes')}) | {loss} | "
            f"{r['panel_success']:.1%} ({r['panel_ex']:.1%}) of {r['panel_n']} | "
            f"{versus} | {ev} | {dev} | {r.get('sft_s', 0) / 60:.1f} | "
            f"{r['panel_s'] / 60:.1f} | {r['device']}, {r['cpu_threads']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the recipe (default %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="the sweep's folder (tries, sweep.jsonl)")
    parser.add_argument("--tries", default=None, help=f"comma-separated names of TRIES ({', '.join(TRIES)}); "
                        "default: all of them, or none when --try is given")
    parser.add_argument("--try", dest="extra", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="a try of your own (repeatable): `--set` keys, after --tries")
    parser.add_argument("--validation", type=int, default=None,
                        help="the panel's size (default: the config's validation_questions, else the auto panel)")
    parser.add_argument("--eval", type=int, default=0, help="also play N eval questions (default 0)")
    parser.add_argument("--spider-dev", type=int, default=0, metavar="N",
                        help="also play a seeded sample of N questions of Spider's dev set, Spider's own protocol "
                             "(needs `python -m sqlenv data prepare spider --preset spider_dev`; default 0)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change the config for every try (e.g. cpu_threads=1)")
    parser.add_argument("--again", action="store_true", help="run tries already in sweep.jsonl again")
    args = parser.parse_args(argv)

    from training.config import ConfigError, TrainConfig
    from training.run.directory import read_jsonl

    try:
        names = args.tries.split(",") if args.tries else ([] if args.extra else list(TRIES))
        unknown = [n for n in names if n and n not in TRIES]
        if unknown:
            raise ConfigError(f"--tries: unknown {unknown}; known: {', '.join(TRIES)}")
        chosen = [(n, TRIES[n]) for n in names if n]
        for text in args.extra:
            name, _, body = text.partition(":")
            if not name.strip() or not body.strip():
                raise ConfigError(f"--try {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
            chosen.append((name.strip(), [p.strip() for p in body.split(",") if p.strip()]))
        base = TrainConfig.from_json(args.config).with_overrides(args.overrides)
        if args.validation is not None:
            base = base.with_overrides({"validation_questions": args.validation})
        configs = {name: try_config(base, pairs, out=args.out, name=name) for name, pairs in chosen}
        from training.plan import check_config

        for config in configs.values():  # every try is checked before the first one runs
            check_config(config)
        if args.spider_dev:  # prepared, and big enough, before hours of SFT, not after
            spider_dev_sample(args.spider_dev, base.seed)
    except (ConfigError, ValueError) as exc:
        print(f"warm_start_sweep: {exc}", file=sys.stderr)
        return 2

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args.out.mkdir(parents=True, exist_ok=True)
    ledger = args.out / "sweep.jsonl"
    done = {record["name"]: record for record in read_jsonl(ledger) if "name" in record}  # a torn line skipped
    records = []
    for name, pairs in chosen:
        if name in done and not args.again:
            log(f"try {name}: already in {ledger}")
            records.append(done[name])
            continue
        log(f"try {name}: {' '.join(pairs)}")
        start = time.perf_counter()
        record = {**run_try(name, configs[name], out=args.out, eval_n=args.eval, spider_dev_n=args.spider_dev),
                  "settings": pairs,
                  "wall_s": 0.0}
        record["wall_s"] = round(time.perf_counter() - start, 1)
        with ledger.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        log(f"try {name}: panel {record.get('panel_success')} (EX {record.get('panel_ex')}), "
            f"{record['wall_s']:.0f} s{', ' + record['error'] if record.get('error') else ''}")
        records.append(record)
    print(table(records))
    ok = [r for r in records if r.get("panel_success") is not None]
    best = max(ok, key=lambda r: (r["panel_success"], r["panel_ex"]), default=None)
    print(json.dumps({"config": str(args.config), "tries": [{k: v for k, v in r.items() if k != "panel_ids"}
                                                            for r in records],
                      "best": best["name"] if best else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
