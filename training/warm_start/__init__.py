"""SFT warm-start: teach the policy the tool protocol by imitating a teacher's episodes, before GRPO.

A randomly initialised model never emits a well-formed `<tool_call>` by chance, so GRPO alone gets no signal. Here
a teacher plays every train-split question through `SQLEnvTRL` itself: the oracle (DESCRIBE the tables involved —
skipped for tiny models, see `SFTSettings.describe` — QUERY the gold SQL, ANSWER the formatted gold answer), except
on a share of the episodes (`SFTSettings.teacher_error_rate`) where it makes the mistakes an untrained agent makes:
it answers without looking, or queries with a wrong filter or column and answers from that. Each episode
becomes one chat conversation as GRPO's tool loop would have built it: the same system prompt and first user turn
(the dataset row's prompt plus the text `reset()` returns), the same tool schemas in the same order (TRL lists the
environment's public methods alphabetically: answer, describe, query, sample; none with the compact prompt,
`SFTSettings.prompt`, whose system prompt names the tools) and the same tool-result texts. Each conversation is then
tokenized segment by segment exactly as play builds its ids (`training.warm_start.examples`: the prompt's ids, each
turn's generated ids through its `<|im_end|>`, each tool result's ids as `ChatRenderer` renders them; tokenizing the
joined text instead merges tokens across those boundaries). TRL's `SFTTrainer` (as
`training.warm_start.trainer.WarmStartTrainer`) trains on the assistant turns only (the examples' `assistant_masks`),
including the `<|im_end|>` that ends each turn and the final turn after the answer, which teaches the model to stop
calling tools when the episode is over. With mistakes in the demonstrations the warm-started model samples careless and careful episodes alike,
and GRPO, rewarded by the verifier, learns that exploring before answering pays.

```python
from training.models import load_model_and_tokenizer
from training.warm_start import SFTSettings, run_sft
model, tokenizer = load_model_and_tokenizer("builtin:tiny")
result = run_sft(model, tokenizer, SFTSettings(epochs=3))
```
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from training.config import WarmStart
from training.distributed import world_size
from training.environment.teacher import DEFAULT_MISTAKES, teacher_conversations, teacher_plan
from training.warm_start.examples import build_sft_dataset

__all__ = ["SFTResult", "SFTSettings", "build_sft_dataset", "teacher_conversations", "teacher_plan", "run_sft",
           "foreign_questions", "DEFAULT_MISTAKES"]

#: The warm start's settings and their defaults: one set, `TrainConfig.sft` (`training.config.WarmStart`).
_DEFAULTS = WarmStart()

@dataclass
class SFTSettings:
    """SFT warm-start settings: a run's `TrainConfig.sft` section (`training.config.WarmStart`, whose defaults these
    are) plus what the run decides (dataset, precision, checkpoints, trackers).

    Args:
        dataset: dataset whose oracle episodes are imitated (`builtin`, a prepared name or a path).
        split: split to take the episodes from (`train`; never an eval split).
        step_budget: the environment's step budget, as in GRPO (10), so the observations match.
        epochs: passes over the teacher's episodes (3). The tiny model needs more steps than that to copy
            values from the question and the results (measured on the built-in data, ~3,400 train questions,
            batches of 4, clean oracle: 5000 steps gave 68% eval greedy success with a cosine schedule, 77-80%
            with warmup-stable-decay; copying is learned late and unevenly, so single runs differ by several
            points; a few hundred steps teach the protocol and the SQL shapes only; docs/EXPERIMENTS.md).
        learning_rate: peak learning rate (1e-3, `WarmStart`'s default; 3e-3 suits the tiny model from scratch,
            ~1e-5 a pretrained Qwen3).
        batch_size: episodes per optimizer step (8; the default recipe takes 4: on CPU the step cost is proportional
            to the batch, and the tiny model learns more per second from more, smaller steps).
        gradient_accumulation_steps: 1.
        warmup: linear warm-up, as a fraction of the steps when < 1, else a number of steps (0.05).
        weight_decay: 0.0.
        lr_scheduler_type: "cosine". The default recipe (configs/tiny_cpu.json) passes "warmup_stable_decay"
            through `TrainConfig.sft.args`: the constant phase crosses the copying transition sooner.
        lr_scheduler_kwargs: extra arguments of the schedule (None), e.g. `{"num_decay_steps": 1000}` for
            "warmup_stable_decay".
        max_steps: optimizer steps; overrides `epochs` when > 0 (-1).
        max_length: longest tokenized episode; longer ones are truncated (2048).
        episodes: oracle episodes to imitate (None = one per question of the split, at most as many as `max_steps`
            steps take: a seeded sample, so a short warm start does not play episodes it never sees).
        describe: the oracle DESCRIBEs the tables involved before querying (True, the careful analyst's path the
            system prompt advises). `None` = auto: off for a small model trained from scratch (< 20M parameters: the
            shortest successful path, query then answer, is learned several times faster), on for pretrained ones.
        teacher_error_rate: share of the episodes in which the teacher makes a mistake instead of playing the
            oracle (0.0 = the clean oracle). A model warm-started on a clean oracle leaves GRPO nothing to find:
            its sampled episodes are the oracle's or copy errors no sample fixes. With mistakes in the
            demonstrations the model samples both careless and careful episodes, and GRPO, rewarded by the
            verifier, learns which pays. See `teacher_conversations`.
        teacher_mistakes: the mistakes the teacher makes, drawn uniformly (default `["guess"]`: answer without
            looking; "wrong_query": query with a wrong filter or column and answer from that).
        gradient_checkpointing: recompute activations in the backward pass (False). TRL turns it on by default;
            it saves memory on big models but costs ~20-30% time, which the tiny model does not need.
        seed: data order and dropout seed (0).
        logging_steps: how often the trainer logs the loss (50: the sampler groups episodes of similar length in
            runs of 50 batches, so the loss of fewer steps swings between long and short episodes).
        output_dir: the trainer's folder (checkpoints); `None` (default) = a scratch folder removed afterwards.
        save_steps: save a resumable checkpoint into `output_dir` every N steps (0, default: never).
        save_total_limit: checkpoints kept (2).
        report_to: experiment trackers (`[]`; see `TrainConfig.report_to`).
        run_name: the trackers' run name (the run id).
        args: any other `trl.SFTConfig` field, set last (`TrainConfig.sft.args`; default `{}`).
        precision: "bf16", "fp16" (autocast) or "fp32"; `None` (default) = the weights' dtype. A run passes its
            plan's precision, as GRPO uses.
        prompt: the prompt the episodes start with (`sqlenv.agent.prompts.PROMPTS`, `TrainConfig.prompt`): `"full"`
            (default) or `"compact"` (no tool schemas rendered). The model learns the prompt it will play on.
        enable_thinking: the chat template's `enable_thinking` (False, `TrainConfig.enable_thinking`), as play renders:
            off, the generation prompt holds an empty `<think>` block; on, the model learns to write it.
        held_out: question ids the teacher never plays (a run's validation panel, `RunPlan.validation_ids`).
        tidy_sql: the teacher's gold queries in one spelling (False; `OraclePolicy`).
        sample_values: the teacher SAMPLEs the tables whose values the gold query filters on (False).
        extra_dataset: a second dataset whose train questions the teacher also plays (None), less every question on
            a database of `dataset` (`foreign_questions`).
        extra_episodes: episodes of `extra_dataset` (0).
    """

    dataset: Any = "builtin"
    split: str = "train"
    step_budget: int = 10
    epochs: float = _DEFAULTS.epochs
    learning_rate: float = _DEFAULTS.learning_rate
    batch_size: int = _DEFAULTS.batch_size
    gradient_accumulation_steps: int = 1
    warmup: float = 0.05
    weight_decay: float = 0.0
    lr_scheduler_type: str = "cosine"
    lr_scheduler_kwargs: dict | None = None
    max_steps: int = _DEFAULTS.max_steps
    max_length: int | None = 2048
    episodes: int | None = _DEFAULTS.episodes
    describe: bool | None = _DEFAULTS.describe
    teacher_error_rate: float = 0.0
    teacher_mistakes: list[str] = field(default_factory=lambda: list(DEFAULT_MISTAKES))
    gradient_checkpointing: bool = False
    seed: int = 0
    logging_steps: int = 50
    output_dir: str | None = None
    save_steps: int = 0
    save_total_limit: int = 2
    report_to: list[str] = field(default_factory=list)
    run_name: str | None = None
    args: dict = field(default_factory=dict)
    precision: str | None = None
    prompt: str = "full"
    enable_thinking: bool = False
    held_out: tuple[str, ...] = ()
    tidy_sql: bool = _DEFAULTS.tidy_sql
    sample_values: bool = _DEFAULTS.sample_values
    extra_dataset: str | None = _DEFAULTS.extra_dataset
    extra_episodes: int = _DEFAULTS.extra_episodes

    @classmethod
    def from_config(cls, config: Any) -> "SFTSettings":
        """Build settings from an `SFTSettings`, a dict of its fields, or a `TrainConfig`.

        A `TrainConfig` contributes its `sft` section (resolved: `enabled`, `teacher_error_rate` and `eval_every`
        filled in; `args` as `args`), `dataset`, `train_split` (as `split`), `step_budget`, `seed`,
        `gradient_checkpointing`, `prompt` and `enable_thinking`.
        """
        if isinstance(config, cls):
            return config
        if config is None:
            return cls()
        names = {f.name for f in fields(cls)}
        if isinstance(getattr(config, "sft", None), WarmStart):  # a TrainConfig
            section = config.resolved_sft()
            values = {f.name: getattr(section, f.name) for f in fields(section) if f.name in names}
            values.update(dataset=config.dataset, split=config.train_split, step_budget=config.step_budget,
                          seed=config.seed, gradient_checkpointing=config.gradient_checkpointing,
                          prompt=config.prompt, enable_thinking=config.enable_thinking)
        else:
            values = dict(config) if isinstance(config, dict) else {f.name: getattr(config, f.name)
                                                                       for f in fields(config)}
            unknown = sorted(set(values) - names)
            if unknown:
                raise ValueError(f"unknown SFT settings {unknown}; known: {sorted(names)}")
        if isinstance(values.get("dataset"), os.PathLike):
            values["dataset"] = str(values["dataset"])
        return cls(**values)


@dataclass
class SFTResult:
    """What `run_sft` did: episodes seen, steps, first and last logged loss, wall time, the trainer's log."""

    n_examples: int
    steps: int
    first_loss: float | None
    final_loss: float | None
    seconds: float
    log_history: list[dict] = field(default_factory=list)
    trainer_args: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------- conversations


def foreign_questions(extra: Any, dataset: Any) -> frozenset[str]:
    """The ids of `extra`'s train questions that are on a database of `dataset` (any split): what a warm start that
    adds `extra`'s questions to `dataset`'s leaves out, so no eval question of `dataset`, and no other question on
    its databases, enters through `extra`."""
    from sqlenv.data.datasets import load_questions, resolve_dataset

    own = resolve_dataset(dataset)
    databases = {q.database_name for split in own.splits for q in load_questions(own.questions_path(split))}
    return frozenset(q.question_id for q in load_questions(resolve_dataset(extra).questions_path("train"))
                     if q.database_name in databases)


# ---------------------------------------------------------------------------------------------------- training


def _examples_seen(settings: "SFTSettings") -> int | None:
    """Examples `max_steps` optimizer steps take (steps x batch x accumulation x processes), `args` overrides
    included; None when the warm start is sized by epochs."""
    args = settings.args or {}
    steps = args.get("max_steps", settings.max_steps)
    if not isinstance(steps, int) or steps <= 0:
        return None
    batch = args.get("per_device_train_batch_size", settings.batch_size)
    accumulation = args.get("gradient_accumulation_steps", settings.gradient_accumulation_steps)
    return steps * batch * accumulation * world_size()


def run_sft(
    model: Any,
    tokenizer: Any,
    config: Any = None,
    *,
    conversations: list[dict[str, Any]] | None = None,
    callbacks: list | None = None,
    resume_from_checkpoint: str | None = None,
    tracker_dir: str | None = None,
    trainer_class: type | None = None,
) -> SFTResult:
    """Warm-start `model` in place on the teacher's episodes with TRL's `SFTTrainer` (loss on assistant turns only),
    each episode as the ids play builds (`training.warm_start.examples`).

    Args:
        model: a causal LM (e.g. from `training.models.load_model_and_tokenizer`); trained in place.
        tokenizer: its tokenizer, with a Qwen3-style chat template that TRL knows (rendered with the template
            `ChatRenderer` picks, the one GRPO renders with).
        config: an `SFTSettings`, a dict of its fields, or a `TrainConfig` (see `SFTSettings.from_config`). Default
            `SFTSettings()`.
        conversations: episodes to imitate (default: `teacher_conversations(...)` from the settings).
        callbacks: extra `transformers.TrainerCallback`s (e.g. to log or to stop).
        resume_from_checkpoint: a `checkpoint-<step>` folder of an earlier, interrupted warm start (its optimizer,
            scheduler, RNG and step are restored; the episodes are rebuilt the same from the seed).
        tracker_dir: where file-based trackers (TensorBoard) write (default: under the trainer's folder).
        trainer_class: the trainer (default `training.warm_start.trainer.WarmStartTrainer`; TRL's `SFTTrainer` gives the
            same training, slower on CPU: `bench/learning/step_profile.py` runs both).

    Returns:
        an `SFTResult` with the number of episodes, steps, first and last loss, seconds and the trainer's log.
    """
    import tempfile
    import time
    import warnings

    import torch
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig

    from training.warm_start.trainer import WarmStartTrainer

    settings = SFTSettings.from_config(config)
    start = time.perf_counter()
    if conversations is None:
        describe = settings.describe
        if describe is None:
            describe = sum(p.numel() for p in model.parameters()) >= 20_000_000
        teacher = dict(step_budget=settings.step_budget, describe=describe, error_rate=settings.teacher_error_rate,
                       mistakes=settings.teacher_mistakes, seed=settings.seed, prompt=settings.prompt,
                       tidy_sql=settings.tidy_sql, sample_values=settings.sample_values)
        conversations = teacher_conversations(settings.dataset, settings.split, episodes=settings.episodes,
                                              held_out=settings.held_out, at_most=_examples_seen(settings), **teacher)
        if settings.extra_dataset and settings.extra_episodes:
            conversations += teacher_conversations(
                settings.extra_dataset, "train", episodes=settings.extra_episodes,
                held_out=foreign_questions(settings.extra_dataset, settings.dataset), **teacher)
    if not conversations:
        raise ValueError(f"no oracle episodes to imitate in {settings.dataset!r} split {settings.split!r}")
    from training.generation.chat import ChatRenderer

    # The renderer play uses for this prompt and template variables: the examples are play's own ids.
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": settings.enable_thinking},
                            prompt=settings.prompt)
    dataset = build_sft_dataset(conversations, renderer)
    param = next(model.parameters())
    on_cpu = param.device.type == "cpu"
    precision = settings.precision or {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(param.dtype, "fp32")
    with tempfile.TemporaryDirectory(prefix="sqlenv-sft-") as scratch, warnings.catch_warnings():
        # TRL's config sets the deprecated `gradient_checkpointing` alias itself; its FutureWarning is noise here.
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
        args = SFTConfig(**{**dict(
            output_dir=settings.output_dir or scratch,
            num_train_epochs=settings.epochs,
            max_steps=settings.max_steps,
            per_device_train_batch_size=settings.batch_size,
            gradient_accumulation_steps=settings.gradient_accumulation_steps,
            learning_rate=settings.learning_rate,
            lr_scheduler_type=settings.lr_scheduler_type,
            lr_scheduler_kwargs=settings.lr_scheduler_kwargs,
            warmup_steps=settings.warmup,
            weight_decay=settings.weight_decay,
            max_length=settings.max_length,
            # The examples are pre-tokenized with their own `assistant_masks` (TRL builds labels from them);
            # TRL's `assistant_only_loss` re-renders conversations, which is what the examples avoid.
            assistant_only_loss=False,
            packing=False,
            logging_steps=settings.logging_steps,
            logging_first_step=True,
            save_strategy="steps" if settings.save_steps > 0 and settings.output_dir else "no",
            save_steps=max(1, settings.save_steps),
            save_total_limit=settings.save_total_limit,
            report_to=list(settings.report_to) or "none",
            run_name=settings.run_name,
            seed=settings.seed,
            gradient_checkpointing=settings.gradient_checkpointing,
            use_cpu=on_cpu,
            bf16=precision == "bf16",
            fp16=precision == "fp16",
            dataloader_pin_memory=not on_cpu,
            disable_tqdm=True,
            # Batches of similar lengths waste less compute on padding.
            train_sampling_strategy="group_by_length",
        ), **settings.args})
        trainer = (trainer_class or WarmStartTrainer)(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks
        )
        trainer.remove_callback(PrinterCallback)  # raw log dicts on stdout; callers log through their callbacks
        if tracker_dir is not None:
            from training.grpo import set_tracker_dir

            set_tracker_dir(trainer, tracker_dir)
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        history = list(trainer.state.log_history)
        steps = trainer.state.global_step
        trainer_args = trainer.args.to_dict()
    losses = [h["loss"] for h in history if "loss" in h and isinstance(h["loss"], (int, float))]
    return SFTResult(
        n_examples=len(conversations),
        steps=steps,
        first_loss=losses[0] if losses else None,
        final_loss=losses[-1] if losses else None,
        seconds=time.perf_counter() - start,
        log_history=history,
        trainer_args=trainer_args,
    )
