"""The checks a `TrainConfig` runs on its values alone when it is built: each field's type and range, and the
combinations that cannot work (a generation batch of partial groups, a compact prompt on TRL's tool loop, QLoRA
after a warm start...). Each failure raises `ConfigError` naming the field and what to change.

What needs the world (the dataset on disk, TRL's own checks of `grpo` / `sft.args`, installed trackers, the device)
is checked by the run plan (`training.plan.check_config`).
"""

from __future__ import annotations

from training.config.choices import DEVICES, LORA_DEFAULTS, PRECISIONS, QUESTION_SAMPLERS, ROLLOUT_MODES, TRACKERS
from training.config.errors import ConfigError, fail, unknown_key_message
from training.config.field_types import check_types
from training.config.passthrough import GRPO_OWNED, check_owned_keys

__all__ = ["validate"]


def validate(config) -> None:
    """Raise `ConfigError` on the first value of `config`, a `TrainConfig` (its `sft` section checked already), that
    cannot work. Called by `TrainConfig.__post_init__`, so every config built holds values that can work."""
    check_types(config)
    if not config.model.strip():
        fail("model is empty: use 'builtin:tiny', a Hub name like 'Qwen/Qwen3-0.6B', or a local directory")
    if not config.dataset.strip():
        fail("dataset is empty: use 'builtin', a prepared dataset name, or a dataset directory")
    if config.step_budget < 1:
        fail(f"step_budget must be at least 1 (got {config.step_budget}); 10 is a good start")
    if config.num_generations < 2:
        fail(
            f"num_generations must be at least 2 (got {config.num_generations}): GRPO compares each completion "
            "with the others of its group"
        )
    if config.per_device_train_batch_size < 1:
        fail(f"per_device_train_batch_size must be at least 1 (got {config.per_device_train_batch_size})")
    if config.gradient_accumulation_steps < 1:
        fail(f"gradient_accumulation_steps must be at least 1 (got {config.gradient_accumulation_steps})")
    generation_batch = config.per_device_train_batch_size * config.gradient_accumulation_steps
    if generation_batch % config.num_generations:
        fail(
            f"per_device_train_batch_size x gradient_accumulation_steps = {generation_batch} is not divisible "
            f"by num_generations = {config.num_generations}: each step must hold whole groups; e.g. set "
            f"per_device_train_batch_size to {config.num_generations} or a multiple of it"
        )
    if config.learning_rate is not None and not config.learning_rate > 0:
        fail(f"learning_rate must be positive (got {config.learning_rate})")
    if config.max_steps <= 0 and not config.num_train_epochs > 0:
        fail("set max_steps > 0, or max_steps <= 0 with num_train_epochs > 0")
    if config.max_completion_length is not None and config.max_completion_length < 16:
        fail(f"max_completion_length must be at least 16 tokens (got {config.max_completion_length})")
    if config.max_turn_tokens < 8:
        fail(f"max_turn_tokens must be at least 8 (got {config.max_turn_tokens})")
    if config.max_tool_calling_iterations is not None and config.max_tool_calling_iterations < 1:
        fail(
            f"max_tool_calling_iterations must be at least 1 (got {config.max_tool_calling_iterations}); "
            "leave it null to use step_budget"
        )
    if config.beta < 0:
        fail(f"beta must be >= 0 (got {config.beta})")
    if not config.temperature > 0:
        fail(f"temperature must be positive (got {config.temperature})")
    if config.reward_weights is not None:
        if len(config.reward_weights) != 3 or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) for w in config.reward_weights
        ):
            fail("reward_weights must be three numbers: [correctness, progress, operational]")
    if config.rollout not in ROLLOUT_MODES:
        fail(f"rollout must be one of {ROLLOUT_MODES} (got {config.rollout!r})")
    from sqlenv.agent.prompts import PROMPTS, renders_tool_schemas  # plain text, no ML import

    if config.prompt not in PROMPTS:
        fail(f"prompt must be one of {list(PROMPTS)} (got {config.prompt!r})")
    if config.rollout == "environment" and not renders_tool_schemas(config.prompt):
        fail(f"prompt={config.prompt!r} lists the tools in the system prompt, but rollout='environment' (TRL's "
             "environment_factory tool loop) always renders the tool schemas of the environment's methods: set "
             "rollout='rollout_func' with it, or prompt='full'")
    for name in ("plot_every", "kl_probe_every"):
        if getattr(config, name) < 1:
            fail(f"{name} must be at least 1 (got {getattr(config, name)})")
    if not 0.0 <= config.negative_advantage_weight <= 1.0:
        fail(f"negative_advantage_weight must be in [0, 1] (got {config.negative_advantage_weight}): 1 is GRPO, "
             "0 keeps only the better-than-average episodes")
    for name in ("trace_every", "eval_every", "eval_episodes", "comparison_episodes", "zero_shot_episodes",
                 "validation_questions", "kl_probe_episodes"):
        if (getattr(config, name) or 0) < 0:
            fail(f"{name} must be >= 0 (got {getattr(config, name)}; 0 turns it off)")
    if config.device not in DEVICES:
        fail(f"device must be one of {DEVICES} (got {config.device!r})")
    if config.precision not in PRECISIONS:
        fail(f"precision must be one of {PRECISIONS} (got {config.precision!r})")
    if config.precision == "fp16" and config.device == "cpu":
        fail("precision=fp16 needs a GPU; use precision='bf16', 'fp32' or 'auto' with device='cpu'")
    if config.cpu_threads is not None and config.cpu_threads < 1:
        fail(f"cpu_threads must be at least 1 or null (got {config.cpu_threads})")
    if config.save_steps is not None and config.save_steps < 0:
        fail(f"save_steps must be >= 0 or null (got {config.save_steps}; 0 = no checkpoints)")
    if config.save_total_limit < 1:
        fail(f"save_total_limit must be at least 1 (got {config.save_total_limit})")
    unknown = [name for name in config.report_to if name not in TRACKERS]
    if unknown:
        fail(f"report_to: unknown tracker {unknown[0]!r}; use any of {sorted(TRACKERS)} (installed)")
    _validate_lora(config)
    if config.train_top_layers is not None:
        if config.train_top_layers < 1:
            fail(f"train_top_layers must be at least 1 or null (got {config.train_top_layers}; null trains every "
                 "weight)")
        if config.lora is not None:
            fail("train_top_layers and lora both choose what GRPO trains: set one of them (null the other)")
    elif not config.train_head:
        fail("train_head=false freezes the output head under train_top_layers; without train_top_layers every "
             "weight trains: set train_top_layers, or train_head=true")
    if config.question_sampler not in QUESTION_SAMPLERS:
        fail(f"question_sampler must be one of {QUESTION_SAMPLERS} (got {config.question_sampler!r})")
    check_owned_keys("grpo", config.grpo, GRPO_OWNED)
    generation = config.grpo.get("generation_kwargs") or {}
    if not isinstance(generation, dict):
        fail(f"grpo.generation_kwargs must be an object (got {generation!r})")
    for key in ("max_new_tokens", "max_tokens"):
        if key in generation:
            fail(f"grpo.generation_kwargs.{key} is set by this config: a turn's token budget is "
                 "max_turn_tokens (translated to max_tokens for vLLM); set max_turn_tokens")
    if config.run_id is not None:
        from training.run.schema import RUN_ID_PATTERN

        if not RUN_ID_PATTERN.match(config.run_id):
            fail(f"run_id {config.run_id!r} is invalid: use letters, digits, '.', '_' and '-' (max 128)")
    if config.env_url is not None and not config.env_url.startswith(("http://", "https://", "ws://", "wss://")):
        fail(f"env_url must be a server URL like http://127.0.0.1:8000 (got {config.env_url!r}), or null to play "
             "in-process")


def _validate_lora(config) -> None:
    if config.lora is None:
        return
    unknown = [k for k in config.lora if k not in LORA_DEFAULTS]
    if unknown:
        raise ConfigError("; ".join(unknown_key_message(k, LORA_DEFAULTS, prefix="lora.") for k in unknown))
    lora = config.resolved_lora()
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
        if config.device in ("cpu", "mps"):
            raise ConfigError("lora.load_in_4bit (QLoRA) needs a CUDA GPU: set device='cuda' or 'auto', or "
                              "load_in_4bit=false")
        if config.sft.enabled:
            raise ConfigError("lora.load_in_4bit (QLoRA) cannot follow an SFT warm start (it fine-tunes every "
                              "weight of the base): set sft.enabled=false")

