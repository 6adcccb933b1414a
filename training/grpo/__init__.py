"""The GRPO trainer of a run: `grpo_args(plan)` (its `GRPOConfig`) and `build_trainer(plan, model, tokenizer)`.

`build_trainer` wires TRL's `GRPOTrainer` to SQLEnv on one of two rollout paths (`TrainConfig.rollout`), both through
`training.grpo.trainer.SQLEnvGRPOTrainer` (its loss phase skips the rows that teach nothing: `TrainConfig.lean_loss`):

- `"environment"` (default): TRL's own multi-turn tool loop; `environment_factory` builds `SQLEnvTRL` instances bound
  to the run's train split (`functools.partial(SQLEnvTRL, plan.episodes())`), whose tools TRL calls.
- `"rollout_func"`: the batched path, `training.grpo.rollout.BatchedRollout`, which plays all episodes of a step together.

Everything comes from the run's `training.plan.RunPlan` (a `TrainConfig` is resolved into one): the dataset, the
trainer's checkpoint folder, device and precision, LoRA (`peft_config`), trackers, and the `grpo` pass-through of any
other `GRPOConfig` field. Our settings that must win (budget-derived lengths, precision, device, run files) are
refused in `grpo` when the config is built (`training.config.GRPO_OWNED`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

__all__ = ["grpo_args", "build_trainer", "lora_config", "turn_generation_kwargs", "set_tracker_dir"]


def turn_generation_kwargs(config: Any) -> dict[str, Any]:
    """The per-turn generation settings for the backend the run generates with.

    Each turn of TRL's tool loop generates at most `max_turn_tokens` (capped by the episode budget): transformers'
    `generate` (plain or continuous batching) calls it `max_new_tokens`, vLLM's `SamplingParams` `max_tokens` (TRL
    passes `generation_kwargs` to `SamplingParams` as they are). The user's `grpo.generation_kwargs` are merged in.
    """
    grpo = config.grpo or {}
    limit = min(config.max_turn_tokens, config.resolved_max_completion_length())
    key = "max_tokens" if grpo.get("use_vllm") else "max_new_tokens"
    return {**(grpo.get("generation_kwargs") or {}), key: limit}


def lora_config(config: Any):
    """The `peft.LoraConfig` of `config.lora` (None: full fine-tuning)."""
    lora = config.resolved_lora()
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                      target_modules=lora["target_modules"], task_type="CAUSAL_LM")


def grpo_args(plan: Any, output_dir: str | None = None, **overrides: Any):
    """The `GRPOConfig` of a run.

    Args:
        plan: the run's `RunPlan` (a `TrainConfig` is resolved into one; `output_dir` then defaults to its run dir).
        output_dir: the trainer's folder (checkpoints); default `plan.phase_dir("grpo")`.
        overrides: GRPOConfig fields set last (scripts and tests; a config's own pass-through is `grpo`).
    """
    import warnings

    from trl import GRPOConfig

    plan = _as_plan(plan)
    config = plan.config
    save_steps = config.resolved_save_steps("grpo")
    kwargs = dict(
        output_dir=str(output_dir or plan.phase_dir("grpo")),
        run_name=config.run_id,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=config.num_generations,
        learning_rate=config.resolved_learning_rate(),
        max_steps=config.max_steps if config.max_steps > 0 else -1,
        num_train_epochs=config.num_train_epochs,
        max_completion_length=config.resolved_max_completion_length(),
        max_tool_calling_iterations=config.resolved_max_tool_calling_iterations(),
        beta=config.beta,
        temperature=config.temperature,
        reward_weights=config.resolved_reward_weights(),
        chat_template_kwargs={"enable_thinking": config.enable_thinking},
        seed=config.seed,
        logging_steps=config.plot_every,
        save_strategy="steps" if save_steps > 0 else "no",
        save_steps=max(save_steps, 1),
        save_total_limit=config.save_total_limit,
        report_to=list(config.report_to) or "none",
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        use_cpu=plan.device == "cpu",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        # Always passed: TRL's GRPOConfig defaults it to True, which would make small CPU runs recompute activations.
        gradient_checkpointing=config.gradient_checkpointing,
        # An episode cut by max_completion_length (a cap eval does not have) has no outcome: leave it out of the loss
        # instead of training it with reward 0 and a negative advantage. `grpo.mask_truncated_completions=false` keeps
        # TRL's default.
        mask_truncated_completions=True,
    )
    kwargs.update({k: v for k, v in (config.grpo or {}).items() if k != "generation_kwargs"})
    kwargs["generation_kwargs"] = turn_generation_kwargs(config)
    kwargs.update(overrides)
    with warnings.catch_warnings():
        # transformers renamed it `activation_checkpointing`; TRL's configs still define the old name.
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
        return GRPOConfig(**kwargs)


def _as_plan(plan: Any):
    from training.plan import RunPlan

    return plan if isinstance(plan, RunPlan) else RunPlan.resolve(plan)


def build_trainer(plan: Any, model: Any, tokenizer: Any, *, output_dir: str | None = None,
                  callbacks: list | None = None, **grpo_overrides: Any):
    """A `GRPOTrainer` for a run (`training.grpo.trainer.SQLEnvGRPOTrainer`; see the module docstring).

    Args:
        plan: the run's `RunPlan`, or a `TrainConfig` (resolved into one here).
        model: the policy (full weights; with `lora` TRL wraps it in the adapter).
        tokenizer: its tokenizer (left padding is set here, as TRL's batched generation needs).
        output_dir: the trainer's checkpoint folder; default `plan.phase_dir("grpo")`.
        callbacks: extra `TrainerCallback`s (the run callback).
        grpo_overrides: GRPOConfig fields set last (see `grpo_args`).
    """
    import os
    import warnings

    from training.grpo.rewards import REWARD_FUNCS
    from training.grpo.rollout import BatchedRollout, rollout_rows
    from training.grpo.sampler import question_groups
    from training.grpo.trainer import SQLEnvGRPOTrainer
    from training.environment.trl_env import SQLEnvTRL, train_rows

    plan = _as_plan(plan)
    config = plan.config
    grpo = config.grpo or {}
    if config.rollout == "rollout_func" and (grpo.get("use_vllm") or grpo.get("use_transformers_continuous_batching")):
        raise ValueError("rollout='rollout_func' generates with its own batched decoder: use rollout='environment' "
                         "with grpo.use_vllm or grpo.use_transformers_continuous_batching")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args = grpo_args(plan, output_dir, **grpo_overrides)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    source = plan.episodes(config.train_split)
    if config.beta > 0 and config.resolved_lora() is None:
        _plain_reference_source(plan, model, tokenizer)
    if config.train_top_layers is not None:
        from training.models.trainable import train_top_layers

        train_top_layers(model, config.train_top_layers, train_head=config.train_head)
    from training.grpo.kl_probe import KLProbe

    kl_probe = KLProbe(plan, tokenizer, config.kl_probe_episodes, config.temperature, every=config.kl_probe_every,
                       file=Path(args.output_dir) / "kl_probe.json" if args.save_strategy != "no" else None) \
        if config.kl_probe_episodes > 0 else None
    common = dict(model=model, reward_funcs=list(REWARD_FUNCS), args=args, processing_class=tokenizer,
                  callbacks=callbacks, peft_config=lora_config(config), lean_loss=config.lean_loss,
                  negative_advantage_weight=config.negative_advantage_weight, kl_probe=kl_probe,
                  question_sampler=config.question_sampler,
                  question_groups=question_groups(source) if config.question_sampler == "mixed" else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if config.rollout == "rollout_func":
            rollout = BatchedRollout(source, max_turn_tokens=config.max_turn_tokens, prompt=config.prompt)
            trainer = SQLEnvGRPOTrainer(train_dataset=rollout_rows(source, config.prompt),
                                        rollout_func=rollout, **common)
            # TRL only parses tool calls when a response schema is set; the batched path parses them itself.
            from training.generation.chat import ChatRenderer

            rollout.renderer = ChatRenderer(tokenizer, chat_template=True,
                                            chat_template_kwargs={"enable_thinking": config.enable_thinking},
                                            prompt=config.prompt)
            rollout.renderer.eos_token_ids = list(trainer.eos_token_ids)
        else:
            trainer = SQLEnvGRPOTrainer(train_dataset=train_rows(source),
                                        environment_factory=functools.partial(SQLEnvTRL, source), **common)
    ref_model = getattr(trainer, "ref_model", None)
    if ref_model is not None:
        # TRL builds the KL reference from `model.config._name_or_path`, i.e. the weights on disk, not the ones in
        # memory: after an SFT warm-start that is the random-init model. Anchor it to the policy GRPO starts from.
        ref_model.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # raw log dicts on stdout; progress goes through the run callback
    set_tracker_dir(trainer, plan.run_dir / "tracker" / "grpo")
    return trainer


def _plain_reference_source(plan: Any, model: Any, tokenizer: Any) -> None:
    """TRL builds the KL reference with `from_pretrained(model.config._name_or_path)`, which cannot read a GGUF file
    (its weights need `gguf_file=` and dequantizing). A model still pointing at one is saved as a plain model to
    `<run>/base_model/` first (once) and pointed there; `build_trainer` then loads the policy's weights into it."""
    source = str(getattr(model.config, "_name_or_path", "") or "")
    if not source.lower().endswith(".gguf"):
        return
    import os
    import shutil

    folder = plan.run_dir / "base_model"
    if not (folder / "config.json").exists():
        tmp = plan.run_dir / f".base_model-{os.getpid()}"  # per process: every rank builds a trainer
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        try:
            os.replace(tmp, folder)
        except OSError:  # another rank got there first: its copy is the same model
            shutil.rmtree(tmp, ignore_errors=True)
    model.config.name_or_path = model.name_or_path = str(folder.resolve())


def set_tracker_dir(trainer: Any, folder: Path) -> None:
    """Point file-based trackers (TensorBoard) at `folder` in the run directory instead of the checkpoint folder,
    which is removed when the run completes."""
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = str(folder)
