"""One prepared check for a lent GPU: the real model learning Spider, and what it costs, in <= 8 minutes of compute.

    python3 bench/gpu_carry.py call2 --out $OUT -- [ARGS]        # on the device (docs/TRAINING.md, the two calls)
    python bench/gpu_check.py --model PATH.gguf --out DIR       # the same, by hand (CUDA)
    python bench/gpu_check.py --dry-run --out DIR               # the same script on the CPU in < 1 minute

Items, in this order, each written to `<out>/gpu_check.json` as soon as it ends (so a run cut short still reports
the items before the cut; an item that fails records its error and the next one runs):

1. **imports**: the versions of what the run imports, each import tried, the CUDA device, and whether the installed
   transformers takes the KV cache as `cache=` (the kept-cache decoder's argument; transformers 5.17 does not).
2. **decoder**: the kept-cache decoder (`MultiTurnDecoder`) generating `--decode-tokens` sampled tokens for 16, 64
   and 256 rows at once (real episode prompts), with fp32 weights, bf16 weights, and fp32 weights under bf16
   autocast; generated tokens/s, prefill included. Target: >= 5,000 tokens/s at 64 rows.
3. **grpo_step**: one GRPO step of the recipe (`--config`, its batch shape and lengths) through the project's own
   trainer (`training.grpo.build_trainer`): rollout seconds, loss seconds (the rest of the step), peak GPU memory of
   each; then a memory probe: forward and backward of full-length rows (prompt + `max_completion_length`) per
   micro-batch size, extrapolated to 64 rows (what `per_device_train_batch_size` 64 would hold at once).
4. **logprob_gap**: for every model token that step's rollout sampled, the log-probability the decoder drew it with
   (recorded as it sampled, `SamplingTap`) against the trainer's own forward on the same weights (its model, its
   autocast, TRL's fused LM head, the run's temperature): mean, p99 and max |gap|. Target: mean <= 1e-2.
5. **learning**: the recipe run end to end (`training.train.run_training`: zero-shot eval, warm start, warm-start
   eval, GRPO, comparison on every eval question, spider10's 203), its GRPO steps sized to the seconds left before
   `--deadline-minutes` from the rates items 2-3 measured (`plan_learning`; the plan is in the JSON). Targets: after
   GRPO >= 30% success, and >= warm start + 5 points. The run's config, status, metrics and comparison are copied
   to `<out>` (`run_*`).

`--dry-run` plays the same items on the built-in tiny model, a toy dataset (two databases, ten questions, prepared
on the fly) and the CPU, at sizes that take seconds; `tests/test_gpu_check.py` runs it. The last line printed is
one JSON object: each item's status, the headline figures and the targets met.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

import gpu_learning  # noqa: E402 - after the path
import gpu_measures as measures  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "smollm2_spider10_gpu.json"
ITEMS = ("imports", "decoder", "grpo_step", "logprob_gap", "learning")
#: Seconds kept free before the deadline for the comparison's last episodes and the files.
RESERVE_S = 20.0
TARGETS = {"decoder_tokens_per_s_at_64": 5000.0, "logprob_gap_mean_abs": 1e-2, **gpu_learning.TARGETS}
VERSIONS = ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "gguf", "sqlglot", "sqlparse",
            "tokenizers", "huggingface_hub", "safetensors", "pyarrow", "fsspec", "dill", "multiprocess", "numpy")
IMPORTS = ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "gguf", "sqlglot", "sqlparse", "sqlenv",
           "training.train", "training.grpo", "training.generation.multi_turn")


@dataclasses.dataclass(frozen=True)
class Profile:
    """What one check plays: the sizes of each item, and the config fields it changes in the recipe.

    Args:
        overrides: `TrainConfig` fields set on the recipe for every run of the check (model, data, and in the dry
            run the sizes).
        rows: decoder rows of item 2.
        decode_tokens: tokens each row generates in item 2.
        probe_rows: micro-batch sizes of item 3's memory probe.
        deadline_s: seconds from the start by which item 5 must be done.
    """

    overrides: dict
    rows: tuple[int, ...]
    decode_tokens: int
    probe_rows: tuple[int, ...]
    deadline_s: float


def real_profile(args: argparse.Namespace) -> Profile:
    overrides: dict[str, Any] = {"model": args.model}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    return Profile(overrides, rows=args.rows or (16, 64, 256), decode_tokens=args.decode_tokens,
                   probe_rows=args.probe_rows or (8, 16), deadline_s=args.deadline_minutes * 60)


def dry_profile(args: argparse.Namespace, scratch: Path) -> Profile:
    """The built-in tiny model on a toy dataset (train and eval: the same ten questions), on the CPU, at sizes of
    seconds, in fp32 (the run config refuses bf16 on a CPU)."""
    toy = toy_dataset(scratch / "toy")
    overrides = {"model": "builtin:tiny", "dataset": str(toy), "device": "cpu", "precision": "fp32",
                 "cpu_threads": 1, "num_generations": 2, "per_device_train_batch_size": 2,
                 "gradient_accumulation_steps": 2, "step_budget": 3, "max_turn_tokens": 16,
                 "max_completion_length": 96, "max_steps": 2,
                 "sft": {"enabled": True, "max_steps": 3, "batch_size": 2, "eval_every": 0}}
    return Profile(overrides, rows=args.rows or (2, 4, 8), decode_tokens=4, probe_rows=args.probe_rows or (2, 4),
                   deadline_s=(args.deadline_minutes or 5.0) * 60)


def toy_dataset(folder: Path) -> Path:
    """`sqlenv.checker.build_toy_dataset`'s ten questions, as both the train and the eval split."""
    from sqlenv.checker import build_toy_dataset

    questions, _ = build_toy_dataset(folder)
    items = json.loads(questions.read_text())
    (folder / "questions_eval.json").write_text(json.dumps([{**q, "split": "eval"} for q in items], indent=1))
    (folder / "dataset.json").write_text(json.dumps({"name": "toy", "source": "toy", "splits": ["train", "eval"],
                                                     "counts": {"train": len(items), "eval": len(items)},
                                                     "dropped": 0}, indent=1))
    return folder


# ------------------------------------------------------------------------------------------------ report
class Report:
    """`<out>/gpu_check.json`, rewritten whole after every change; and `<out>/gpu_check.log`, the check's lines."""

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
        self.log(f"item {ITEMS.index(item) + 1}: {item} ...")
        started = time.perf_counter()
        self.update(item, status="running", started_at_s=round(self.elapsed(), 1))
        try:
            figures = fn()
            self.update(item, status="ok", **figures)
        except Exception as exc:  # noqa: BLE001 - one failing item must not hide the next ones
            self.update(item, status="error", error=f"{type(exc).__name__}: {exc}"[:1000],
                        traceback=traceback.format_exc()[-3000:])
        self.update(item, seconds=round(time.perf_counter() - started, 1))
        shown = {k: v for k, v in self.data["items"][item].items() if k != "traceback"}
        self.log(f"item {item}: {json.dumps(shown, default=str)[:1500]}")

    def summary(self) -> dict:
        items = self.data["items"]
        decoder = items.get("decoder", {})
        gap = items.get("logprob_gap", {})
        learning = items.get("learning", {})
        step = items.get("grpo_step", {})
        after, warm = learning.get("after_grpo"), learning.get("warm_start")
        rate = decoder.get("tokens_per_s_at_64")
        checks = {
            "decoder_tokens_per_s_at_64>=5000": None if rate is None else rate >= TARGETS["decoder_tokens_per_s_at_64"],
            "logprob_gap_mean_abs<=1e-2": None if gap.get("mean_abs") is None
            else gap["mean_abs"] <= TARGETS["logprob_gap_mean_abs"],
            "after_grpo>=0.30": None if after is None else after >= TARGETS["after_grpo"],
            "after_grpo>=warm_start+0.05": None if after is None or warm is None
            else after >= warm + TARGETS["gain_over_warm_start"] - 1e-9,
        }
        return {"bench": "gpu_check", "dry_run": self.data.get("dry_run"), "device": self.data.get("device"),
                "elapsed_s": round(self.elapsed(), 1), "status": {k: items.get(k, {}).get("status") for k in ITEMS},
                "decoder_tokens_per_s_at_64": rate, "rollout_s": step.get("rollout_s"), "loss_s": step.get("loss_s"),
                "step_peak_gib": step.get("peak_gib"), "logprob_gap_mean_abs": gap.get("mean_abs"),
                "zero_shot": learning.get("zero_shot"), "warm_start": warm, "after_grpo": after,
                "grpo_steps": learning.get("grpo_steps"), "checks": checks}


# ------------------------------------------------------------------------------------------------- the check
class Check:
    """The items, over one recipe config and what earlier items leave for later ones (the model, the rates)."""

    def __init__(self, config: Any, profile: Profile, report: Report, scratch: Path):
        self.config, self.profile, self.report, self.scratch = config, profile, report, scratch
        self.model = self.tokenizer = self.plan = None
        self.rates: dict[str, Any] = {}

    # -- shared ----------------------------------------------------------------------------------------
    def run_config(self, name: str, **fields: Any):
        """The recipe with the profile's and this run's fields, in its own folder; the check writes no checkpoints
        and plays no periodic evals or traces (each would cost seconds of the minutes it has)."""
        return self.config.with_overrides({"eval_every": 0, "eval_episodes": 0, "trace_every": 0, "save_steps": 0,
                                           "report_to": [], "sft.eval_every": 0, "output_dir": str(self.scratch / name), **fields})

    def load(self) -> None:
        """The model as a run loads it (`training.phases.LoadModel`: fp32 master weights on the run's device)."""
        import torch

        from training.models import load_model_and_tokenizer
        from training.plan import RunPlan

        if self.model is not None:
            return
        self.plan = RunPlan.resolve(self.run_config("plan"))
        started = time.perf_counter()
        self.model, self.tokenizer = load_model_and_tokenizer(self.config.model, seed=self.config.seed,
                                                              dataset=self.plan.dataset, device=self.plan.device,
                                                              dtype=torch.float32)
        self.rates["load_s"] = round(time.perf_counter() - started, 1)
        self.report.log(f"loaded {self.config.model} in {self.rates['load_s']} s "
                        f"({sum(p.numel() for p in self.model.parameters()):,} parameters)")

    def prompts(self, n: int) -> list[list[int]]:
        """`n` episode prompts of the eval split (its questions in turn), rendered as the evals render them."""
        from sqlenv.agent.prompts import initial_messages
        from training.generation.chat import ChatRenderer

        renderer = ChatRenderer(self.tokenizer, chat_template_kwargs={"enable_thinking": self.config.enable_thinking})
        env = self.plan.environment(self.config.eval_split)
        try:
            questions = self.plan.dataset.load(self.config.eval_split)
            distinct = [renderer.prompt_ids(initial_messages(env.reset(question_id=q.question_id)))
                        for q in questions[:n]]
        finally:
            env.close()
        return [distinct[i % len(distinct)] for i in range(n)]

    # -- item 1 ----------------------------------------------------------------------------------------
    def imports(self) -> dict:
        import importlib
        import inspect
        from importlib import metadata

        versions = {}
        for name in VERSIONS:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = None
        failed = {}
        for module in IMPORTS:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - every missing piece is a finding
                failed[module] = f"{type(exc).__name__}: {exc}"[:300]
        import torch

        figures: dict[str, Any] = {"python": sys.version.split()[0], "versions": versions, "import_errors": failed,
                                   "cuda": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            figures.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                           capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported(),
                           multiprocessors=props.multi_processor_count)
        try:
            from transformers.models.llama.modeling_llama import LlamaModel

            figures["transformers_takes_cache_kwarg"] = "cache" in inspect.signature(LlamaModel.forward).parameters
        except Exception as exc:  # noqa: BLE001
            figures["transformers_takes_cache_kwarg"] = f"unknown ({type(exc).__name__})"
        self.report.data["device"] = figures.get("device", "cpu")
        if failed:
            self.report.update("imports", **figures)
            raise RuntimeError(f"imports failed: {', '.join(failed)}")
        return figures

    # -- item 2 ----------------------------------------------------------------------------------------
    def decoder(self) -> dict:
        import torch

        self.load()
        prompts = self.prompts(max(self.profile.rows))
        pad = self.tokenizer.pad_token_id
        results: list[dict] = []
        variants = (("fp32", self.model, False), ("bf16", None, False), ("fp32+bf16 autocast", self.model, True))
        was_training = self.model.training
        self.model.eval()
        for name, model, autocast in variants:
            if model is None:  # a bf16 copy of the clean model (made before any trainer patches its forward)
                model = copy.deepcopy(self.model).to(torch.bfloat16)
            measures.decode_rate(model, prompts[:2], 4, pad, autocast=autocast)  # warm-up: kernels, allocator
            for rows in self.profile.rows:
                try:
                    result = {"variant": name, **measures.decode_rate(
                        model, prompts[:rows], self.profile.decode_tokens, pad, autocast=autocast,
                        temperature=self.config.temperature)}
                except Exception as exc:  # noqa: BLE001 - out of memory at 256 rows, say: the others still count
                    result = {"variant": name, "rows": rows, "error": f"{type(exc).__name__}: {exc}"[:300]}
                    self.release_cache()
                results.append(result)
                self.report.update("decoder", rates=results)
                self.report.log(f"decoder {name}, {rows} rows: {result.get('tokens_per_s', result.get('error'))}")
            if model is not self.model:
                del model
                gc.collect()
        if was_training:
            self.model.train()
        self.rates["decode"] = [r for r in results if r["variant"] == "fp32" and "error" not in r]
        at = {r["variant"]: r["tokens_per_s"] for r in results if r["rows"] == 64 and "error" not in r}
        prompt_tokens = sorted(len(p) for p in prompts)
        self.rates["prompt_tokens"] = prompt_tokens[len(prompt_tokens) // 2]
        return {"rates": results, "tokens_per_row": self.profile.decode_tokens,
                "prompt_tokens_median": self.rates["prompt_tokens"], "tokens_per_s_at_64_by_variant": at,
                # fp32 weights: what the evals decode with (and the rollouts, unless the trainer's autocast wraps them)
                "tokens_per_s_at_64": at.get("fp32"),
                "target_tokens_per_s_at_64": TARGETS["decoder_tokens_per_s_at_64"]}

    # -- items 3 and 4 ---------------------------------------------------------------------------------
    def grpo_step(self) -> dict:
        from training.grpo import build_trainer
        from training.plan import RunPlan

        self.load()
        config = self.run_config("step", max_steps=1, sft=False, compare_base=False, comparison_episodes=0,
                                 plot_every=1)
        plan = RunPlan.resolve(config)
        timer = measures.step_timer()
        trainer = build_trainer(plan, self.model, self.tokenizer, callbacks=[timer])
        rollout = measures.TimedRollout(trainer)
        measures.reset_peak()
        trainer.train()
        if rollout.record is None or not timer.seconds:
            raise RuntimeError("the GRPO step ended without a rollout")
        record = rollout.record
        lengths = [len(c) for c in record["completion_ids"]]
        generated = rollout.tap.generated()
        step_s = timer.seconds[0]
        logged = next((h for h in reversed(trainer.state.log_history) if "reward" in h), {})
        figures = {
            "precision": plan.precision, "episodes": len(lengths), "num_generations": config.num_generations,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "max_completion_length": config.resolved_max_completion_length(),
            "max_turn_tokens": config.max_turn_tokens, "step_budget": config.step_budget,
            "step_s": round(step_s, 2), "rollout_s": round(rollout.seconds, 2),
            "loss_s": round(step_s - rollout.seconds, 2),
            "rollout_generated_tokens": generated,
            "rollout_tokens_per_s": round(generated / max(rollout.seconds, 1e-9), 1),
            "completion_tokens_mean": round(sum(lengths) / len(lengths), 1), "completion_tokens_max": max(lengths),
            "rollout_peak_gib": rollout.peak_gib, "loss_peak_gib": timer.peak_gib,
            "peak_gib": max(filter(None, (rollout.peak_gib, timer.peak_gib)), default=None),
            "reward": logged.get("reward"),
        }
        self.rates["grpo_step_s"] = step_s
        self.report.update("grpo_step", status="ok", **figures)
        self.report.log(f"grpo step: {json.dumps(figures)}")

        # Item 4 on the weights the rollout sampled with (the step has moved them since).
        trainer.accelerator.unwrap_model(trainer.model).load_state_dict(rollout.weights)
        self.report.run("logprob_gap", functools.partial(self.logprob_gap, trainer, rollout, plan))
        rollout.weights = None

        probe = []
        length = max(len(p) for p in record["prompt_ids"]) + config.resolved_max_completion_length()
        for rows in self.profile.probe_rows:
            probe.append(measures.memory_probe(trainer, rows, length, config.resolved_max_completion_length()))
            self.report.update("grpo_step", memory_probe=probe)
        fitted = [p for p in probe if not p["oom"]]
        if len(fitted) >= 2 and fitted[-1]["peak_gib"] is not None:
            (a, b) = fitted[-2], fitted[-1]
            slope = (b["peak_gib"] - a["peak_gib"]) / (b["rows"] - a["rows"])
            figures["memory_probe_gib_per_row"] = round(slope, 3)
            figures["memory_probe_gib_at_64_rows"] = round(b["peak_gib"] + slope * (64 - b["rows"]), 1)
        if fitted:
            best = max(fitted, key=lambda p: p["tokens_per_s"])
            self.rates["train_tokens_per_s"] = best["tokens_per_s"]
            # Every row's loss at full length: what a step of a model whose rows all carry a gradient costs at most
            # (a zero-shot model's rows often carry none, and a loss that skips them is then cheaper than later).
            full = best["seconds"] / best["rows"] * len(lengths)
            figures["loss_s_every_row_full_length"] = round(full, 2)
            self.rates["grpo_step_s"] = rollout.seconds + max(step_s - rollout.seconds, full)
        del trainer, rollout
        self.release()
        return {**figures, "memory_probe": probe, "probe_tokens_per_row": length}

    def logprob_gap(self, trainer: Any, rollout: Any, plan: Any) -> dict:
        positions, decoder = measures.decoder_logprobs(rollout.tap, rollout.record)
        trained = measures.trainer_logprobs(trainer, rollout.record, positions,
                                            plan.config.per_device_train_batch_size)
        gap = measures.logprob_gap(decoder, trained)
        return {"precision": plan.precision, "temperature": plan.config.temperature, **gap,
                "target_mean_abs": TARGETS["logprob_gap_mean_abs"]}

    def release(self) -> None:
        self.model = self.tokenizer = None
        self.release_cache()

    @staticmethod
    def release_cache() -> None:
        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- item 5 ----------------------------------------------------------------------------------------
    def learning(self) -> dict:
        from training.plan import RunPlan

        self.release()
        config = self.run_config("learn", compare_base=True)
        device = RunPlan.resolve(config).device
        budget = self.profile.deadline_s - self.report.elapsed() - (RESERVE_S if device == "cuda" else 0.0)
        return gpu_learning.run_learning(config, budget, self.rates, out=self.report.out,
                                         update=lambda **fields: self.report.update("learning", **fields),
                                         log=self.report.log)


# ------------------------------------------------------------------------------------------------------ CLI
def parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive counts like 16,64,256 (got {text!r})")
    return counts


def parse_items(text: str) -> list[int]:
    try:
        items = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--items takes item numbers 1-5 like 1,2,3 (got {text!r})") from None
    if not items or not all(1 <= i <= len(ITEMS) for i in items):
        raise argparse.ArgumentTypeError(f"--items takes item numbers 1-5 (got {text!r})")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the recipe (default "
                        "configs/smollm2_spider10_gpu.json)")
    parser.add_argument("--model", default="smollm2-135m", help="the model (default smollm2-135m; on the device "
                        "the joined GGUF file's path)")
    parser.add_argument("--data-dir", default=None, help="where the recipe's dataset is prepared (default "
                        "$SQLENV_DATA_DIR, else data/)")
    parser.add_argument("--out", type=Path, default=None, help="where the results go (default $OUT, else "
                        "./gpu_check_out)")
    parser.add_argument("--deadline-minutes", type=float, default=None, help="minutes from the start by which "
                        "item 5 must be done; its GRPO steps are sized to fit (default 8; dry run 5)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens per row in item 2 (default 64)")
    parser.add_argument("--items", type=parse_items, default=list(range(1, len(ITEMS) + 1)),
                        help="which items to run, e.g. 1 or 1,2,3 (default all; 4 runs with 3)")
    parser.add_argument("--rows", type=parse_counts, default=None, help="item 2's decoder rows (default 16,64,256)")
    parser.add_argument("--probe-rows", type=parse_counts, default=None, help="item 3's memory probe micro-batches "
                        "(default 8,16)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of the recipe for every item, e.g. --set per_device_train_batch_size=16")
    parser.add_argument("--dry-run", action="store_true", help="the tiny model, a toy dataset, the CPU, seconds")
    args = parser.parse_args(argv)
    if args.decode_tokens < 1:
        parser.error("--decode-tokens must be at least 1")
    if args.deadline_minutes is not None and not args.deadline_minutes > 0:
        parser.error("--deadline-minutes must be positive")
    if not args.config.is_file():
        parser.error(f"--config {args.config}: no such file")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the device is offline: nothing may wait on the Hub
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = args.out or Path(os.environ.get("OUT") or "gpu_check_out")
    with tempfile.TemporaryDirectory(prefix="sqlenv-gpu-check-") as scratch:
        scratch = Path(scratch)
        os.environ.setdefault("SQLENV_RUNS_DIR", str(scratch / "runs"))  # the tiny model's cache, if built
        if args.dry_run:
            profile = dry_profile(args, scratch)
        else:
            profile = real_profile(argparse.Namespace(**{**vars(args), "deadline_minutes":
                                                         args.deadline_minutes or 8.0}))
        from training.config import ConfigError, TrainConfig

        try:
            config = TrainConfig.from_json(args.config).with_overrides(profile.overrides).with_overrides(args.overrides)
        except (ConfigError, ValueError) as exc:
            print(f"bench/gpu_check.py: error: {exc}", file=sys.stderr)
            return 2
        report = Report(out, {"dry_run": args.dry_run, "config": str(args.config), "model": config.model,
                              "dataset": config.dataset, "deadline_s": profile.deadline_s})
        check = Check(config, profile, report, scratch)
        steps = {1: ("imports", check.imports), 2: ("decoder", check.decoder), 3: ("grpo_step", check.grpo_step),
                 5: ("learning", check.learning)}
        for number in args.items:
            if number in steps:
                report.run(*steps[number])
        if 3 in args.items and "logprob_gap" not in report.data["items"]:
            report.update("logprob_gap", status="not run", error="item 3 ended before its rollout was measured")
        result = report.summary()
        report.data["summary"] = result
        report.write()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
