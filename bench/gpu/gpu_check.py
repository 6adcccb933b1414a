"""One prepared check for a lent GPU, in two calls: the decoders side by side, then a real model learning.

    python3 bench/gpu/gpu_carry.py call1 --out $OUT            # device, call 1: items 1, 2 (docs/TRAINING.md)
    python3 bench/gpu/gpu_carry.py call2 --out $OUT -- [ARGS]  # device, call 2: items 1, 7, 3, 4, 5, 6
    python bench/gpu/gpu_check.py --out DIR                    # every item by hand (CUDA, the packaged SmolLM2)
    python bench/gpu/gpu_check.py --dry-run --out DIR          # the same script on the CPU in ~30 s

Items, played in the order `--items` names them (default 1-7 in turn; call 2 plays the learning runs first, then
items 3-6 if time is left), each written to `<out>/gpu_check.json` as soon as it ends (an item that fails records
its error and the next one runs, on a device repaired of what the item left broken, each item on decoders of its
own; every item records the CUDA-graph captures that failed in it, each with its graph's batch size, and how many;
items 3, 4 and 6 start only with the seconds they need left before `--deadline-minutes`, else they are skipped;
`gpu_report` holds the file, the summary and the targets):

1. **imports**: the versions of what the run imports, each import tried, the CUDA device.
2. **decoders**: today's kept-cache decoder, the graph decoder and transformers' continuous batching side by side
   (`gpu_decoders`): two turns of `--decode-tokens` greedy tokens a row at `--rows` rows (16, 64, 256; continuous
   batching at `--cb-rows` only, 64), fp32 and bf16 weights (and the graph decoder under the trainer's bf16
   autocast); tokens/s and whether each matches today's decoder token for token. On `--shape FILE` (call 1:
   SmolLM2-135M's config and real prompt ids, random weights: the first call carries no weights) or else the loaded
   model.
3. **exactness**: `--exact-episodes` greedy eval episodes of the recipe (tool calls, tool results, turn caps) played
   by today's decoder and by the graph decoder on the real weights: identical episodes, seconds of each.
4. **grpo_step**: one GRPO step of the recipe (`--config`, its batch shape and lengths, its precision) through the
   project's own trainer: rollout and loss seconds, the rollout's share of the step, peak GPU memory; then a memory
   probe (forward and backward of full-length rows per micro-batch size, extrapolated to 64 rows).
5. **logprob_gap**: for every model token that step's rollout sampled, the log-probability the decoder drew it with
   (the decoder records it) against the trainer's own forward on the same weights: mean, p99 and max |gap|.
6. **bf16_step**: the same step and gap under bf16 (the trainer's autocast, TRL's fp32 LM head; the graph decoder
   decodes as that autocast computes).
7. **learning**: each `--learn` recipe end to end (`run_training`: warm start, its eval, GRPO, the comparison on
   `comparison_episodes` eval questions) in turn, spider10's first (planned on every second left before
   `--deadline-minutes`: at least `FIRST_RUN_FLOOR_S`, 4 minutes, by call 2's deadline; its GRPO steps fitted to
   them), then the built-in recipe's only if `MIN_LEARNING_S` remain (`gpu_learning`); each named after its
   recipe's dataset, each measuring its rollouts' share of its GRPO phase (the warm-started model's steps: the share
   the target is about).

Rates an item measures for a later one (the decoding rate, a step's seconds) are kept in `--state FILE` too, so the
second call plans with what the first measured. `--dry-run` plays the same items on the built-in tiny model, a toy
dataset (ten questions, prepared on the fly) and the CPU at sizes of seconds (item 6 is skipped: bf16 needs CUDA);
`tests/test_gpu_check.py` runs it as the two calls play it (`gpu_carry.CALL1_ITEMS`, `CALL2_ITEMS`). The last line
printed is one JSON object (each item's status, the headline figures, the captures that failed, the targets met).
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GPU = Path(__file__).resolve().parent  # bench/gpu/: the check's pieces, imported by their module names
REPO = GPU.parents[1]
sys.path[:0] = [str(REPO), str(GPU)]

import gpu_decoders  # noqa: E402 - after the path
import gpu_learning  # noqa: E402
import gpu_measures as measures  # noqa: E402
from gpu_profile import Profile, dry_profile, real_profile  # noqa: E402
from gpu_report import ITEMS, TARGETS, Report  # noqa: E402

CONFIGS = REPO / "configs"
DEFAULT_CONFIG = CONFIGS / "smollm2_builtin_gpu.json"
#: Item 7's recipes, in the order it plays them: spider10's first (issue 48), the built-in one if time is left.
DEFAULT_LEARN = (CONFIGS / "smollm2_spider10_gpu.json", CONFIGS / "smollm2_builtin_gpu.json")
#: Seconds kept free before the deadline for the comparison's last episodes and the files.
RESERVE_S = 20.0
VERSIONS = ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "gguf", "sqlglot", "sqlparse",
            "tokenizers", "huggingface_hub", "safetensors", "pyarrow", "fsspec", "dill", "multiprocess", "numpy")
IMPORTS = ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "gguf", "sqlglot", "sqlparse", "sqlenv",
           "training.train", "training.grpo", "training.generation.graph_decoder")


def graph_figures(decoder: Any) -> dict:
    """The graph decoder's graphs captured and capture error (None for another decoder)."""
    graphs = getattr(decoder, "graphs", None)
    return {"graphs_captured": getattr(graphs, "captured", None), "graph_error": getattr(graphs, "error", None)}


# ------------------------------------------------------------------------------------------------- the check
class Check:
    """The items, over the recipes and what earlier items leave for later ones (the model, the rates)."""

    def __init__(self, config: Any, learn: list[tuple[str, Any]], profile: Profile, report: Report, scratch: Path, *,
                 shape: Path | None = None, state: Path | None = None):
        self.config, self.learn_configs, self.profile, self.report = config, learn, profile, report
        self.scratch, self.shape, self.state = scratch, shape, state
        self.model = self.tokenizer = self.plan = self.pristine = None
        self.rates: dict[str, Any] = {}
        if state is not None and state.is_file():
            self.rates.update(json.loads(state.read_text()))

    # -- shared ----------------------------------------------------------------------------------------
    def keep(self, **rates: Any) -> None:
        """Remember rates for later items (and, with `--state`, for the next call)."""
        self.rates.update(rates)
        if self.state is not None:
            self.state.parent.mkdir(parents=True, exist_ok=True)
            self.state.write_text(json.dumps(self.rates, indent=1))

    def run_config(self, name: str, config: Any = None, **fields: Any):
        """A recipe (default the step items') with this run's fields, in its own folder; no checkpoints, periodic
        evals or traces (each would cost seconds of the minutes the check has)."""
        return (config or self.config).with_overrides(
            {"eval_every": 0, "eval_episodes": 0, "trace_every": 0, "save_steps": 0, "report_to": [],
             "sft.eval_every": 0, "output_dir": str(self.scratch / name), **fields})

    def load(self) -> None:
        """The model as a run loads it (`training.phases.LoadModel`: fp32 master weights on the run's device), and a
        copy no trainer has touched (item 6 trains its own)."""
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
        self.pristine = copy.deepcopy(self.model)
        self.keep(load_s=round(time.perf_counter() - started, 1))
        self.report.log(f"loaded {self.config.model} in {self.rates['load_s']} s "
                        f"({sum(p.numel() for p in self.model.parameters()):,} parameters)")

    def pad_id(self) -> int:
        tokenizer = self.tokenizer
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def prompts(self, n: int) -> list[list[int]]:
        """`n` episode prompts of the eval split (its questions in turn), rendered as the evals render them."""
        from sqlenv.agent.prompts import initial_messages
        from training.generation.chat import ChatRenderer

        renderer = ChatRenderer(self.tokenizer, chat_template_kwargs={"enable_thinking": self.config.enable_thinking},
                                prompt=self.config.prompt)
        env = self.plan.environment(self.config.eval_split)
        try:
            questions = self.plan.dataset.load(self.config.eval_split)
            distinct = [renderer.prompt_ids(initial_messages(env.reset(question_id=q.question_id),
                                                             self.config.prompt)) for q in questions[:n]]
        finally:
            env.close()
        return [distinct[i % len(distinct)] for i in range(n)]

    # -- item 1 ----------------------------------------------------------------------------------------
    def imports(self) -> dict:
        import importlib
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
        self.report.data["device"] = figures.get("device", "cpu")
        if failed:
            self.report.update("imports", **figures)
            raise RuntimeError(f"imports failed: {', '.join(failed)}")
        return figures

    # -- item 2 ----------------------------------------------------------------------------------------
    def decoders(self) -> dict:
        rows = self.profile.rows
        if self.shape is not None:
            import torch

            shape = json.loads(self.shape.read_text())
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = gpu_decoders.shape_model(shape["config"], device)
            distinct, pad = shape["prompts"], shape["pad_id"]
            prompts = [distinct[i % len(distinct)] for i in range(max(rows))]
            source = f"{shape.get('name', self.shape.name)}: its shape, random weights"
        else:
            self.load()
            model, prompts, pad = self.model, self.prompts(max(rows)), self.pad_id()
            source = f"{self.config.model}: its weights"
        was_training = model.training
        model.eval()
        result = gpu_decoders.compare(model, prompts, rows, self.profile.decode_tokens,
                                      budget_s=self.profile.decoder_budget_s, pad_id=pad, cb_rows=self.profile.cb_rows,
                                      update=lambda **f: self.report.update("decoders", **f), log=self.report.log)
        if was_training:
            model.train()
        lengths = sorted(len(p) for p in prompts)
        # The evals decode greedily with the graph decoder on a GPU (fp32 weights): what item 7 plans with.
        decode = [r for r in result["rates"] if (r["decoder"], r["precision"]) == ("graph", "fp32")
                  and "seconds_per_step" in r]
        self.keep(decode=decode, prompt_tokens=lengths[len(lengths) // 2])
        at = {f"{d}/{p}": gpu_decoders.rate(result["rates"], d, p, 64) for d in gpu_decoders.DECODERS
              for p in ("fp32", "bf16")}
        return {**result, "model": source, "prompt_tokens_median": lengths[len(lengths) // 2],
                "tokens_per_s_at_64": at, "targets": {k: TARGETS[k] for k in TARGETS if k.startswith("tokens")}}

    # -- item 3 ----------------------------------------------------------------------------------------
    def exactness(self) -> dict:
        from training.generation.chat import ChatRenderer
        from training.generation.decoders import kept_cache_decoder
        from training.generation.model_policy import play_model_episodes

        self.load()
        config, n = self.config, self.profile.exact_episodes
        renderer = ChatRenderer(self.tokenizer, chat_template_kwargs={"enable_thinking": config.enable_thinking},
                                prompt=config.prompt)
        played, seconds, kinds = {}, {}, {}
        for kind in ("kept", "graph"):
            envs = [self.plan.environment(config.eval_split) for _ in range(n)]
            try:
                observations = [env.reset(seed=config.seed + i) for i, env in enumerate(envs)]
                decoder = kept_cache_decoder(self.model, self.pad_id(), set(renderer.eos_token_ids), kind=kind)
                kinds[kind] = type(decoder).__name__
                measures.sync()
                started = time.perf_counter()
                played[kind] = play_model_episodes(self.model, self.tokenizer, envs, observations,
                                                   max_turn_tokens=config.max_turn_tokens, renderer=renderer,
                                                   decoder=decoder)
                measures.sync()
                seconds[kind] = round(time.perf_counter() - started, 2)
            finally:
                for env in envs:
                    env.close()
        same = sum(a.completion_ids == b.completion_ids for a, b in zip(played["kept"], played["graph"]))
        # the graph decoder (the last played) after its episodes: the graphs it captured, or why it gave up
        return {"episodes": n, "identical_episodes": same, "identical": same == n, "decoders": kinds,
                **graph_figures(decoder), "decoder_seconds": seconds,
                "generated": {k: sum(sum(e.env_mask) for e in v) for k, v in played.items()},
                "turns": sum(e.turns for e in played["graph"])}

    # -- items 4-6 -------------------------------------------------------------------------------------
    def step(self, name: str, model: Any, probe: bool, **fields: Any) -> dict:
        """One GRPO step of the recipe with `fields` on `model`, then its log-prob gap (an item of its own for the
        recipe's step, a field of item 6's) and, with `probe`, the memory probe."""
        from training.grpo import build_trainer
        from training.plan import RunPlan

        config = self.run_config(name, max_steps=1, sft=False, compare_base=False, comparison_episodes=0,
                                 plot_every=1, **fields)
        plan = RunPlan.resolve(config)
        timer = measures.step_timer()
        trainer = build_trainer(plan, model, self.tokenizer, callbacks=[timer])
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
        decoder = rollout.tap.decoders[0] if rollout.tap.decoders else None  # the one the rollout played with
        figures = {
            "precision": plan.precision, "episodes": len(lengths), "num_generations": config.num_generations,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "max_completion_length": config.resolved_max_completion_length(),
            "max_turn_tokens": config.max_turn_tokens, "step_budget": config.step_budget,
            "decoder": type(decoder).__name__, **graph_figures(decoder),
            "step_s": round(step_s, 2), "rollout_s": round(rollout.seconds, 2),
            "loss_s": round(step_s - rollout.seconds, 2), "rollout_share": round(rollout.seconds / step_s, 3),
            "rollout_generated_tokens": generated,
            "rollout_tokens_per_s": round(generated / max(rollout.seconds, 1e-9), 1),
            "completion_tokens_mean": round(sum(lengths) / len(lengths), 1), "completion_tokens_max": max(lengths),
            "rollout_peak_gib": rollout.peak_gib, "loss_peak_gib": timer.peak_gib,
            "peak_gib": max(filter(None, (rollout.peak_gib, timer.peak_gib)), default=None),
            "reward": logged.get("reward"),
        }
        # The log-prob gap on the weights the rollout sampled with (the step has moved them since).
        trainer.accelerator.unwrap_model(trainer.model).load_state_dict(rollout.weights)
        rollout.weights = None
        gap = functools.partial(self.logprob_gap, trainer, rollout, plan)
        if probe:
            self.keep(grpo_step_s=step_s)
            self.report.update(name, status="ok", **figures)
            self.report.log(f"{name}: {json.dumps(figures)}")
            self.report.run("logprob_gap", gap)
            figures.update(self.memory_probe(trainer, record, config, step_s, rollout.seconds, len(lengths)))
        else:
            try:
                figures["logprob_gap"] = gap()
            except Exception as exc:  # noqa: BLE001 - the step's figures still count
                figures["logprob_gap"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        del trainer, rollout
        self.release_cache()
        return figures

    def grpo_step(self) -> dict:
        self.load()
        return self.step("grpo_step", self.model, probe=True)

    def bf16_step(self) -> dict:
        """The recipe's step under bf16 autocast with TRL's fp32 LM head, on an untouched copy of the model."""
        import torch

        if not torch.cuda.is_available():
            return {"skipped": "bf16 autocast needs a CUDA device"}
        self.load()
        model = copy.deepcopy(self.pristine)
        try:
            return self.step("bf16_step", model, probe=False, precision="bf16",
                             **{"grpo.cast_lm_head_to_fp32": True})
        finally:
            del model
            self.release_cache()

    def logprob_gap(self, trainer: Any, rollout: Any, plan: Any) -> dict:
        positions, decoder = measures.decoder_logprobs(rollout.tap, rollout.record)
        trained = measures.trainer_logprobs(trainer, rollout.record, positions,
                                            plan.config.per_device_train_batch_size)
        gap = measures.logprob_gap(decoder, trained)
        return {"precision": plan.precision, "temperature": plan.config.temperature, **gap,
                "target_mean_abs": TARGETS["logprob_gap_mean_abs"]}

    def memory_probe(self, trainer: Any, record: dict, config: Any, step_s: float, rollout_s: float,
                     episodes: int) -> dict:
        """Forward and backward of full-length rows per micro-batch (`probe_rows`), extrapolated to 64 rows; the
        fastest sets the training rate item 7 plans with."""
        probe = []
        completion = config.resolved_max_completion_length()
        length = max(len(p) for p in record["prompt_ids"]) + completion
        for rows in self.profile.probe_rows:
            probe.append(measures.memory_probe(trainer, rows, length, completion))
            self.report.update("grpo_step", memory_probe=probe)
        figures: dict[str, Any] = {"memory_probe": probe, "probe_tokens_per_row": length}
        fitted = [p for p in probe if not p["oom"]]
        if len(fitted) >= 2 and fitted[-1]["peak_gib"] is not None:
            (a, b) = fitted[-2], fitted[-1]
            slope = (b["peak_gib"] - a["peak_gib"]) / (b["rows"] - a["rows"])
            figures["memory_probe_gib_per_row"] = round(slope, 3)
            figures["memory_probe_gib_at_64_rows"] = round(b["peak_gib"] + slope * (64 - b["rows"]), 1)
        if fitted:
            best = max(fitted, key=lambda p: p["tokens_per_s"])
            # Every row's loss at full length: what a step whose rows all carry a gradient costs at most.
            full = best["seconds"] / best["rows"] * episodes
            figures["loss_s_every_row_full_length"] = round(full, 2)
            self.keep(train_tokens_per_s=best["tokens_per_s"],
                      grpo_step_s=rollout_s + max(step_s - rollout_s, full))
        return figures

    def release(self) -> None:
        self.model = self.tokenizer = self.pristine = None
        self.release_cache()

    @staticmethod
    def release_cache() -> None:
        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- item 7 ----------------------------------------------------------------------------------------
    def learning(self) -> dict:
        from training.plan import RunPlan

        self.release()
        runs: dict[str, Any] = {}
        figures: dict[str, Any] = {"runs": runs, "order": [name for name, _ in self.learn_configs]}
        for i, (name, recipe) in enumerate(self.learn_configs):
            config = self.run_config(f"learn_{name}", recipe, compare_base=True)
            device = RunPlan.resolve(config).device
            left = self.profile.deadline_s - self.report.elapsed() - (RESERVE_S if device == "cuda" else 0.0)
            budget, skipped = gpu_learning.run_budget(i, left)
            if skipped:
                runs[name] = {"skipped": skipped}
                self.report.update("learning", **figures)
                continue
            runs[name] = {"started_at_s": round(self.report.elapsed(), 1), "budget_s": round(budget, 1),
                          **({"floor_s": gpu_learning.FIRST_RUN_FLOOR_S} if i == 0 else {})}
            if i == 0 and budget < gpu_learning.FIRST_RUN_FLOOR_S:
                self.report.log(f"learning: {name} has {budget:.0f} s, under its floor of "
                                f"{gpu_learning.FIRST_RUN_FLOOR_S:.0f} s: raise --deadline-minutes")

            def update(run: str = name, **fields: Any) -> None:
                runs.setdefault(run, {}).update(fields)
                self.report.update("learning", **figures)

            try:
                runs[name].update(gpu_learning.run_learning(
                    config, budget, self.rates, out=self.report.out, update=update, log=self.report.log,
                    prefix=f"{name}_", name=name))
            except Exception as exc:  # noqa: BLE001 - the next recipe still runs
                runs[name]["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            runs[name]["ended_at_s"] = round(self.report.elapsed(), 1)
            self.report.update("learning", **figures)
            self.release_cache()
        return figures


def too_late(number: int, profile: Profile, elapsed_s: float) -> str | None:
    """Why item `number` does not start `elapsed_s` seconds into the check (None: it starts): it needs
    `profile.item_min_s[number]` seconds left before the deadline."""
    need = profile.item_min_s.get(number)
    left = profile.deadline_s - elapsed_s
    if need is None or left >= need:
        return None
    return f"{max(left, 0):.0f} s left before the deadline, under the {need:.0f} s it needs"


def run_names(paths: list[Path]) -> list[str]:
    """The learning runs' names: each recipe's own dataset (before the dry run's toy data replaces it), made unique."""
    from training.config import TrainConfig

    names: list[str] = []
    for path in paths:
        name = Path(str(TrainConfig.from_json(path).dataset)).name
        names.append(name if name not in names else f"{name}_{len(names) + 1}")
    return names


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
    """Item numbers in the order given (each once)."""
    try:
        items = list(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--items takes item numbers 1-{len(ITEMS)} like 1,2 (got {text!r})") from None
    if not items or not all(1 <= i <= len(ITEMS) for i in items):
        raise argparse.ArgumentTypeError(f"--items takes item numbers 1-{len(ITEMS)} (got {text!r})")
    return items


def parse_paths(text: str) -> list[Path]:
    paths = [Path(p.strip()) for p in text.split(",") if p.strip()]
    if not paths:
        raise argparse.ArgumentTypeError(f"expected one or more config paths (got {text!r})")
    return paths


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench/gpu/gpu_check.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the recipe of items 2-6 (default "
                        "configs/smollm2_builtin_gpu.json)")
    parser.add_argument("--learn", type=parse_paths, default=None, help="the recipes item 7 runs, in turn, "
                        "comma-separated (default the spider10 GPU recipe, then the built-in one)")
    parser.add_argument("--model", default="smollm2-135m", help="the model (default smollm2-135m; on the device "
                        "the joined GGUF file's path)")
    parser.add_argument("--shape", type=Path, default=None, help="item 2 on a model of this shape with random "
                        "weights: a JSON file with 'config' and 'prompts' (gpu_carry.py writes it)")
    parser.add_argument("--state", type=Path, default=None, help="a JSON file of the rates items measure, read "
                        "first and written after each (the second call plans with the first's)")
    parser.add_argument("--data-dir", default=None, help="where the recipes' datasets are prepared (default "
                        "$SQLENV_DATA_DIR, else data/)")
    parser.add_argument("--out", type=Path, default=None, help="where the results go (default $OUT, else "
                        "./gpu_check_out)")
    parser.add_argument("--deadline-minutes", type=float, default=None, help="minutes from the start by which "
                        "item 7 must be done; its GRPO steps are sized to fit (default 8; dry run 5)")
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens per turn in item 2 (default 32)")
    parser.add_argument("--decoder-seconds", type=float, default=120.0, help="seconds item 2 may start "
                        "measurements in (default 120; the one under way then ends)")
    parser.add_argument("--exact-episodes", type=int, default=8, help="episodes of item 3 (default 8)")
    parser.add_argument("--items", type=parse_items, default=list(range(1, len(ITEMS) + 1)),
                        help=f"which items to run, in this order, e.g. 1,7,3 (default all 1-{len(ITEMS)} in turn; 5 "
                        "runs with 4)")
    parser.add_argument("--rows", type=parse_counts, default=None, help="item 2's decoder rows (default 16,64,256)")
    parser.add_argument("--cb-rows", type=parse_counts, default=None, help="the rows of item 2 at which "
                        "transformers' continuous batching is measured too (default 64; dry run: the fewest rows)")
    parser.add_argument("--probe-rows", type=parse_counts, default=None, help="item 4's memory probe micro-batches "
                        "(default 8,16)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of every recipe, e.g. --set learning_rate=1e-5")
    parser.add_argument("--dry-run", action="store_true", help="the tiny model, a toy dataset, the CPU, seconds")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.decode_tokens < 1 or args.exact_episodes < 1:
        parser.error("--decode-tokens and --exact-episodes must be at least 1")
    if args.deadline_minutes is not None and not args.deadline_minutes > 0:
        parser.error("--deadline-minutes must be positive")
    learn = args.learn or list(DEFAULT_LEARN)
    for path in [args.config, *learn]:
        if not path.is_file():
            parser.error(f"{path}: no such config file")
    if args.shape is not None and not args.shape.is_file():
        parser.error(f"--shape {args.shape}: no such file")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the device is offline: nothing may wait on the Hub
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = args.out or Path(os.environ.get("OUT") or "gpu_check_out")
    with tempfile.TemporaryDirectory(prefix="sqlenv-gpu-check-") as scratch:
        scratch = Path(scratch)
        os.environ.setdefault("SQLENV_RUNS_DIR", str(scratch / "runs"))  # the tiny model's cache, if built
        profile = dry_profile(args, scratch) if args.dry_run else real_profile(args)
        from training.config import ConfigError, TrainConfig

        try:
            def recipe(path: Path):
                return TrainConfig.from_json(path).with_overrides(profile.overrides).with_overrides(args.overrides)

            config, recipes = recipe(args.config), list(zip(run_names(learn), map(recipe, learn)))
        except (ConfigError, ValueError) as exc:
            print(f"bench/gpu/gpu_check.py: error: {exc}", file=sys.stderr)
            return 2
        report = Report(out, {"dry_run": args.dry_run, "config": str(args.config), "model": config.model,
                              "learn": [str(p) for p in learn], "deadline_s": profile.deadline_s,
                              "items_asked": args.items, "cb_rows": list(profile.cb_rows)})
        check = Check(config, recipes, profile, report, scratch, shape=args.shape, state=args.state)
        steps = {1: check.imports, 2: check.decoders, 3: check.exactness, 4: check.grpo_step, 6: check.bf16_step,
                 7: check.learning}
        for number in args.items:
            if number not in steps:
                continue
            late = too_late(number, profile, report.elapsed())
            if late:
                report.skip(ITEMS[number - 1], late)
                if number == 4:
                    report.skip("logprob_gap", f"item 4 did not run ({late})")
                continue
            report.run(ITEMS[number - 1], steps[number])
        if 4 in args.items and "logprob_gap" not in report.data["items"]:
            report.update("logprob_gap", status="not run", error="item 4 ended before its rollout was measured")
        result = report.summary()
        report.data["summary"] = result
        report.write()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
