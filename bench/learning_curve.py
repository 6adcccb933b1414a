"""Learning curve of the built-in tiny model on SQLEnv: random baseline, SFT warm-start, then GRPO.

    nice python bench/learning_curve.py                       # built-in dataset, targets below
    nice python bench/learning_curve.py --dataset spider10    # honest train/eval figures, no target
    nice python bench/learning_curve.py --save-sft DIR        # also keep the SFT model (and its figures) in DIR
    nice python bench/learning_curve.py --from-sft DIR --set grpo_steps=40   # GRPO experiments in minutes

Everything runs offline on CPU: build the tokenizer and the tiny Qwen3 model, evaluate the random policy, SFT on
oracle episodes, evaluate, GRPO with TRL's `GRPOTrainer` (on the batched `rollout_func` path by default;
`--set rollout=environment` for the `environment_factory` path over SQLEnvTRL), evaluating every few steps.
Evaluations are greedy episodes on the eval split (held-out question instances), the same questions for every
point of the curve. Targets on the built-in dataset (2 CPU cores, <= 15 minutes in all): eval success >= 60%,
GRPO >= SFT-only + 5 points, random ~0%. The last line printed is one JSON object with the figures (with
`--from-sft`, the build, random baseline and SFT figures are the saved ones, `minutes` leaves them out, and no
targets are judged). Beside the greedy figures it prints the sampled ones (`eval_samples` passes at the GRPO
temperature) and how many of the SFT model's greedy eval failures any sample solves: GRPO can only reinforce what
sampling finds, so that count bounds what it can turn into greedy wins without learning something new.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# OpenMP's default busy-waiting collapses on a shared, oversubscribed CPU (measured here: 25x slower training
# steps with 2 threads while other jobs run); passive waiting costs little when the machine is idle. It must be
# set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


DEFAULTS = {
    # SFT warm-start on oracle episodes (query, then answer: short episodes learn fastest). Eval success still
    # rises with steps at 4000-5000 (the tiny model learns to copy values late); 5000 is what fits 15 minutes.
    "sft_steps": 5000, "sft_learning_rate": 3e-3, "sft_batch_size": 4, "sft_describe": False,
    "sft_weight_decay": 0.0,
    # GRPO with the three reward functions, on the batched rollout path (`rollout_func`: ~4x the steps per
    # minute of TRL's environment_factory loop here, same rewards) with a KL anchor to the SFT model: without
    # one (beta 0) every learning rate tried drifted eval success down by 1.5-14 points within 20-40 steps.
    # GRPO does not beat SFT-only here yet. From one saved SFT model (400 eval episodes, SFT-only 71.5%), GRPO
    # minus SFT in points: these defaults -2.5; 4x reuse of each batch (num_iterations 4) -1.7; 16-completion
    # minibatches x 2 passes (8 updates per batch, 160 steps) -1.0, with top_entropy_quantile 0.2 -1.2, with
    # temperature 0.7 -1.0, with lr 1e-3 -11.0, with SGD -2.5, with beta 0.5 -0.2; curriculum on the train
    # questions SFT failed -2.2; fresh questions (grpo_data_seed 1) -1.7 / -0.5; 16 generations per prompt -2.0.
    # None is kept, as none is better; the small losses look systematic rather than noise (the full run with these
    # defaults fixed 1 of the 400 eval episodes and broke 11). Later, all from the same SFT model unless said:
    # lr 1e-4 / 5e-5 with the minibatches, 320 steps, -0.7 / -1.2; lr 1e-4, 80 steps: fresh questions -0.2,
    # temperature 0.5 -0.5; partial credit for list/table answers (item F1 as a 4th reward) -1.7; from a shorter
    # SFT (3500 steps, 62.5%), 320 minibatch steps: -1.7 (beta 0.1), -5.5 (beta 0.5). Why so little: GRPO can only
    # reinforce what sampling finds, and 89 of this SFT model's 114 greedy eval failures are solved by none of 8
    # samples (see eval_samples below); sampled success does not rise either (54.2% -> 50.2% at lr 1e-4).
    "grpo_steps": 20, "grpo_learning_rate": 3e-4, "num_generations": 8, "batch_size": 64, "temperature": 1.0,
    "beta": 0.1, "rollout": "rollout_func",
    # PPO-style reuse: optimizer passes over each generation batch (TRL's num_iterations, clipped by epsilon) and
    # minibatches it is split into (steps_per_generation); grpo_steps counts optimizer steps, as TRL's max_steps.
    "num_iterations": 1, "steps_per_generation": 1, "reward_weights": [1.0, 0.15, 1.0],
    # Curriculum (off at 0): play this many greedy train episodes with the SFT model first and run GRPO only on
    # the train questions it failed there (a small-scale form of DAPO's dynamic sampling).
    "screen_episodes": 0,
    # GRPO's questions: the built-in dataset generated with this seed (0: the SFT data itself; another seed: fresh
    # database rows and questions from the same schemas and templates, which the SFT model cannot have memorized).
    "grpo_data_seed": 0,
    "grpo_args": {},  # any other GRPOConfig field, e.g. {"loss_type": "dr_grpo", "scale_rewards": "none"}
    "max_turn_tokens": 64, "max_completion_length": 256, "step_budget": 10,
    # Evaluation: greedy episodes on the eval split, the same seeds at every point (400: ~2 points of standard
    # error on a rate, ~1.5 on the paired GRPO-minus-SFT difference; 15 s per 200 episodes).
    "eval_episodes": 400, "curve_every": 10, "curve_episodes": 64, "train_episodes": 64, "seed": 0,
    # Sampled success (0: off): the eval episodes also played `eval_samples` times at the GRPO temperature, the
    # policy GRPO optimizes (greedy decoding is a different one: it can stay put while the sampled one improves),
    # and how many of the SFT model's greedy failures some sample solves (what GRPO has to work with).
    "eval_samples": 4,
}


def log(message: str) -> None:
    print(message, flush=True)


def evaluate_split(model, tokenizer, dataset: str, split: str, n: int, seed: int, step_budget: int,
                   max_turn_tokens: int, subset: int | None = None):
    """Greedy success rate on `n` episodes (episode i = reset(seed=seed + i)); with `subset`, also the rate on the
    first `subset` of them (the episodes the cheaper curve points replay)."""
    from training.policy import evaluate_model

    result = evaluate_model(model, tokenizer, dataset=dataset, split=split, n_episodes=n, seed=seed,
                            step_budget=step_budget, max_turn_tokens=max_turn_tokens, batch_size=64)
    if subset is None:
        return result.success_rate
    outcomes = [bool(e.get("correct")) for e in result.episodes]
    first = outcomes[:subset]
    return result.success_rate, sum(first) / max(1, len(first)), outcomes


def sampled_success(model, tokenizer, dataset: str, split: str, n: int, seed: int, step_budget: int,
                    max_turn_tokens: int, samples: int, temperature: float) -> tuple[float, list[int]]:
    """The sampling policy on the same `n` episodes, `samples` passes (seeded, so two models draw with the same
    generator states): its success rate over all passes, and per episode how many passes succeeded."""
    import torch

    from training.policy import evaluate_model

    wins = [0] * n
    for k in range(samples):
        torch.manual_seed(10_000 + k)
        result = evaluate_model(model, tokenizer, dataset=dataset, split=split, n_episodes=n, seed=seed,
                                step_budget=step_budget, max_turn_tokens=max_turn_tokens, batch_size=64,
                                temperature=temperature)
        wins = [w + bool(e.get("correct")) for w, e in zip(wins, result.episodes)]
    return sum(wins) / (n * samples), wins


def random_success(dataset: str, split: str, n: int, seed: int, step_budget: int) -> float:
    from sqlenv.environment import SQLEnvironment
    from sqlenv.evaluation import evaluate
    from sqlenv.policies import RandomPolicy

    env = SQLEnvironment.from_dataset(dataset, split=split, step_budget=step_budget)
    try:
        return evaluate(env, RandomPolicy(seed=seed), n_episodes=n, seed=seed).success_rate
    finally:
        env.close()


def run(dataset: str, p: dict, *, threads: int | None, save_sft: Path | None = None,
        from_sft: Path | None = None) -> dict:
    import tempfile

    import torch
    from transformers import TrainerCallback

    from training.config import TrainConfig
    from training.models import load_model_and_tokenizer
    from training.rollout import build_trainer
    from training.sft import SFTSettings, run_sft

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(p["seed"])
    start = time.perf_counter()
    minutes = lambda: (time.perf_counter() - start) / 60  # noqa: E731
    eval_split = "eval"
    ev = dict(dataset=dataset, step_budget=p["step_budget"], max_turn_tokens=p["max_turn_tokens"])
    scratch = Path(tempfile.mkdtemp(prefix="sqlenv-curve-"))
    out: dict = {"dataset": dataset, "model": "builtin:tiny"}

    if from_sft is not None:
        # Start from a model saved by --save-sft (same recipe): skips the build, random baseline and SFT, which
        # are taken from its record; the SFT-only eval below is measured again on this run's episodes.
        model, tokenizer = load_model_and_tokenizer(str(from_sft), device="cpu")
        saved = json.loads((from_sft / "learning_curve_sft.json").read_text())
        out.update({k: saved[k] for k in ("parameters", "random_eval_success", "sft")})
        out["from_sft"] = str(from_sft)
        log(f"[{minutes():5.2f} min] loaded the SFT model from {from_sft} (saved figures: random "
            f"{out['random_eval_success']:.3f}, SFT {out['sft']['steps']} steps, {out['sft']['seconds']} s)")
    else:
        # 1. Tokenizer + tiny model, built from scratch (a fresh cache dir: the build counts in the time).
        model, tokenizer = load_model_and_tokenizer("builtin:tiny", seed=p["seed"], dataset=dataset,
                                                    cache_dir=scratch / "models", device="cpu")
        out["parameters"] = sum(t.numel() for t in model.parameters())
        log(f"[{minutes():5.2f} min] built builtin:tiny: {out['parameters']:,} parameters, vocab {len(tokenizer)}")

        # 2. Random baseline on the same eval questions (episode i = reset(seed=seed + i)).
        out["random_eval_success"] = random_success(dataset, eval_split, p["eval_episodes"], p["seed"],
                                                    p["step_budget"])
        log(f"[{minutes():5.2f} min] random policy: eval success {out['random_eval_success']:.3f}")

        # 3. SFT warm-start on oracle episodes of the train split.
        sft = run_sft(model, tokenizer, SFTSettings(
            dataset=dataset, step_budget=p["step_budget"], max_steps=p["sft_steps"],
            learning_rate=p["sft_learning_rate"], batch_size=p["sft_batch_size"], describe=p["sft_describe"],
            weight_decay=p["sft_weight_decay"], seed=p["seed"], logging_steps=500))
        out["sft"] = {"episodes": sft.n_examples, "steps": sft.steps, "first_loss": sft.first_loss,
                      "final_loss": sft.final_loss, "seconds": round(sft.seconds, 1)}
        log(f"[{minutes():5.2f} min] SFT: {sft.steps} steps on {sft.n_examples} oracle episodes, "
            f"loss {sft.first_loss:.3f} -> {sft.final_loss:.3f}")
        if save_sft is not None:
            save_sft.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(save_sft)
            tokenizer.save_pretrained(save_sft)
            record = {k: out[k] for k in ("parameters", "random_eval_success", "sft")}
            (save_sft / "learning_curve_sft.json").write_text(json.dumps({**record, "params": p}, indent=1))
            log(f"[{minutes():5.2f} min] saved the SFT model to {save_sft}")
    out["sft_eval_success"], sft_subset, sft_outcomes = evaluate_split(
        model, tokenizer, split=eval_split, n=p["eval_episodes"], seed=p["seed"], subset=p["curve_episodes"], **ev)
    out["sft_train_success"] = evaluate_split(model, tokenizer, split="train", n=p["train_episodes"],
                                              seed=p["seed"], **ev)
    if p["eval_samples"] > 0:
        out["sft_eval_sampled_success"], wins = sampled_success(
            model, tokenizer, split=eval_split, n=p["eval_episodes"], seed=p["seed"], samples=p["eval_samples"],
            temperature=p["temperature"], **ev)
        # GRPO reinforces what sampling finds: a greedy failure that no sample ever solves gives it nothing to
        # sharpen, so this count bounds what it can turn into greedy wins without learning something new.
        failed = [w for w, ok in zip(wins, sft_outcomes) if not ok]
        out["sft_greedy_failures"] = len(failed)
        out["sft_greedy_failures_solved_by_sampling"] = sum(1 for w in failed if w > 0)
        log(f"[{minutes():5.2f} min] SFT only: sampled eval success {out['sft_eval_sampled_success']:.3f} "
            f"({p['eval_samples']} passes at temperature {p['temperature']}); of its {len(failed)} greedy "
            f"failures, {out['sft_greedy_failures_solved_by_sampling']} solved by at least one sample")
    curve = [{"phase": "sft", "step": 0, "minutes": round(minutes(), 2), "eval_success": out["sft_eval_success"],
              "eval_success_subset": sft_subset, "train_success": out["sft_train_success"]}]
    log(f"[{minutes():5.2f} min] curve step 0 (SFT only): eval success {out['sft_eval_success']:.3f} "
        f"(first {p['curve_episodes']}: {sft_subset:.3f}), train success {out['sft_train_success']:.3f}")

    # 4. GRPO (rollout path per `rollout`), evaluating every `curve_every` steps.
    if p["grpo_steps"] > 0:
        grpo_dataset = dataset
        if p["grpo_data_seed"] != 0:
            from sqlenv.builtin import build_builtin

            data_seed = p["grpo_data_seed"]
            grpo_dataset = str(build_builtin(scratch / f"builtin-seed{data_seed}", seed=data_seed).root)
            log(f"[{minutes():5.2f} min] GRPO questions: the built-in dataset generated with seed {data_seed}")
        config = TrainConfig(
            model="builtin:tiny", dataset=grpo_dataset, step_budget=p["step_budget"],
            num_generations=p["num_generations"],
            per_device_train_batch_size=p["batch_size"], learning_rate=p["grpo_learning_rate"],
            max_steps=p["grpo_steps"], max_completion_length=p["max_completion_length"],
            max_turn_tokens=p["max_turn_tokens"], temperature=p["temperature"], seed=p["seed"],
            beta=p["beta"], rollout=p["rollout"], reward_weights=list(p["reward_weights"]),
            plot_every=1, device="cpu", precision="fp32", sft=False, output_dir=str(scratch / "grpo"))

        class Curve(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "reward" in logs:
                    rewards = {k.split("/")[1]: round(v, 3) for k, v in logs.items()
                               if k.startswith("rewards/") and k.endswith("/mean")}
                    health = " ".join(f"{k} {logs[k]:.3g}" for k in ("grad_norm", "kl", "entropy")
                                      if isinstance(logs.get(k), (int, float)))
                    log(f"[{minutes():5.2f} min]   grpo step {state.global_step}: reward {logs['reward']:.3f} "
                        f"{rewards} {health}")

            def on_step_end(self, args, state, control, model=None, **kwargs):
                step = state.global_step
                if p["curve_every"] and step % p["curve_every"] == 0 and step < p["grpo_steps"]:
                    rate = evaluate_split(model, tokenizer, split=eval_split, n=p["curve_episodes"],
                                          seed=p["seed"], **ev)
                    curve.append({"phase": "grpo", "step": step, "minutes": round(minutes(), 2),
                                  "eval_success_subset": rate})
                    log(f"[{minutes():5.2f} min] curve step {step}: eval success on the first "
                        f"{p['curve_episodes']} episodes {rate:.3f}")

        trainer = build_trainer(config, model, tokenizer, output_dir=str(scratch / "grpo"), callbacks=[Curve()],
                                num_iterations=p["num_iterations"], steps_per_generation=p["steps_per_generation"],
                                **p["grpo_args"])
        if p["screen_episodes"] > 0:
            from training.policy import evaluate_model

            screen = evaluate_model(model, tokenizer, dataset=grpo_dataset, split="train",
                                    n_episodes=p["screen_episodes"], seed=p["seed"] + 1_000_000,
                                    step_budget=p["step_budget"], max_turn_tokens=p["max_turn_tokens"], batch_size=64)
            failed = {e["question_id"] for e in screen.episodes if not e.get("correct")}
            trainer.train_dataset = trainer.train_dataset.filter(lambda row: row["question_id"] in failed)
            out["grpo_questions"] = len(failed)
            log(f"[{minutes():5.2f} min] curriculum: GRPO on the {len(failed)} train questions the SFT model failed "
                f"in {p['screen_episodes']} greedy episodes (screened success {screen.success_rate:.3f})")
        trainer.train()
        model = trainer.model
    out["grpo_eval_success"], grpo_subset, grpo_outcomes = evaluate_split(
        model, tokenizer, split=eval_split, n=p["eval_episodes"], seed=p["seed"], subset=p["curve_episodes"], **ev)
    out["grpo_train_success"] = evaluate_split(model, tokenizer, split="train", n=p["train_episodes"],
                                               seed=p["seed"], **ev)
    curve.append({"phase": "grpo", "step": p["grpo_steps"], "minutes": round(minutes(), 2),
                  "eval_success": out["grpo_eval_success"], "eval_success_subset": grpo_subset,
                  "train_success": out["grpo_train_success"]})
    log(f"[{minutes():5.2f} min] curve step {p['grpo_steps']} (SFT + GRPO): eval success "
        f"{out['grpo_eval_success']:.3f} (first {p['curve_episodes']}: {grpo_subset:.3f}), "
        f"train success {out['grpo_train_success']:.3f}")
    if p["eval_samples"] > 0:
        out["grpo_eval_sampled_success"], _ = sampled_success(
            model, tokenizer, split=eval_split, n=p["eval_episodes"], seed=p["seed"], samples=p["eval_samples"],
            temperature=p["temperature"], **ev)
        log(f"[{minutes():5.2f} min] SFT + GRPO: sampled eval success {out['grpo_eval_sampled_success']:.3f} "
            f"(SFT only {out['sft_eval_sampled_success']:.3f})")
    out["grpo_minus_sft_points"] = round(100 * (out["grpo_eval_success"] - out["sft_eval_success"]), 1)
    # The same episodes before and after GRPO: how many it fixed and how many it broke (a paired view of the
    # difference above; a handful each way is noise).
    out["eval_episodes_fixed"] = sum(g and not s for s, g in zip(sft_outcomes, grpo_outcomes))
    out["eval_episodes_broken"] = sum(s and not g for s, g in zip(sft_outcomes, grpo_outcomes))
    log(f"GRPO vs SFT-only on the same {p['eval_episodes']} eval episodes: {out['grpo_minus_sft_points']:+.1f} points "
        f"({out['eval_episodes_fixed']} fixed, {out['eval_episodes_broken']} broken)")
    out["curve"] = curve
    out["params"] = p
    out["minutes"] = round(minutes(), 2)
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="builtin", help="builtin (default, with targets) or spider10 (no target)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--save-sft", type=Path, metavar="DIR",
                        help="also save the SFT model (and its figures) to DIR, for --from-sft")
    parser.add_argument("--from-sft", type=Path, metavar="DIR",
                        help="start from a model saved by --save-sft: skip the build, random baseline and SFT "
                             "(GRPO experiments in minutes; 'minutes' then excludes them)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a setting; defaults: {json.dumps(DEFAULTS)}")
    args = parser.parse_args(argv)
    p = dict(DEFAULTS)
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in p or not _:
            parser.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(p)}")
        p[key] = type(p[key])(json.loads(value)) if not isinstance(p[key], str) else value
    if p["grpo_data_seed"] != 0 and args.dataset != "builtin":
        parser.error("--set grpo_data_seed applies to the built-in dataset only")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.dataset != "builtin":
        from sqlenv.datasets import DatasetNotFoundError, data_root, resolve_dataset

        try:
            resolve_dataset(args.dataset)
        except DatasetNotFoundError as exc:
            if args.dataset != "spider10":
                print(f"learning_curve: {exc}", file=sys.stderr)
                return 2
            # Prepare spider10 from the local Spider copy ($SQLENV_SPIDER_DIR, default ../shared/spider).
            from sqlenv.spider import default_spider_dir, prepare_spider

            source = default_spider_dir()
            if not (source / "tables.json").exists():
                print(f"learning_curve: {exc}; no Spider copy at {source} to prepare it from "
                      "(set SQLENV_SPIDER_DIR)", file=sys.stderr)
                return 2
            prepare_spider(source, data_root() / "spider10", preset="spider10")
    if args.from_sft is not None and not (args.from_sft / "learning_curve_sft.json").is_file():
        print(f"learning_curve: --from-sft {args.from_sft}: no learning_curve_sft.json there "
              "(write one with --save-sft)", file=sys.stderr)
        return 2
    out = run(args.dataset, p, threads=args.threads, save_sft=args.save_sft, from_sft=args.from_sft)
    if args.dataset == "builtin" and args.from_sft is None:
        out["targets"] = {"eval_success>=0.60": out["grpo_eval_success"] >= 0.60,
                          "grpo_minus_sft>=5_points": out["grpo_minus_sft_points"] >= 5.0,
                          "random~0": out["random_eval_success"] <= 0.02, "minutes<=15": out["minutes"] <= 15}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
