"""TrainConfig: defaults, auto fields, validation messages, JSON round trip, --set parsing, shipped configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.config import ConfigError, TrainConfig

REPO = Path(__file__).resolve().parent.parent


def test_defaults_and_auto_fields():
    config = TrainConfig()
    assert config.model == "builtin:tiny" and config.dataset == "builtin"
    assert (config.step_budget, config.num_generations) == (10, 4)
    assert (config.eval_every, config.trace_every, config.plot_every, config.eval_episodes) == (100, 50, 10, 3)
    resolved = config.resolved()
    assert resolved.max_tool_calling_iterations == config.step_budget
    assert resolved.sft is True  # auto: on for the built-in tiny model
    assert resolved.max_completion_length >= 256
    assert resolved.output_dir.endswith(resolved.run_id)
    hub = TrainConfig(model="Qwen/Qwen3-0.6B").resolved()
    assert hub.sft is False and hub.max_completion_length >= 512
    assert TrainConfig(step_budget=7).resolved().max_tool_calling_iterations == 7
    # every call without a run_id names a fresh run; an explicit one is kept
    assert TrainConfig(run_id="abc").resolved().run_id == "abc"


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"num_generations": 1}, ["num_generations", "at least 2"]),
        ({"num_generations": 3}, ["divisible", "num_generations"]),
        ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "num_generations": 4}, ["divisible"]),
        ({"step_budget": 0}, ["step_budget"]),
        ({"dataset": "no-such-dataset"}, ["dataset", "no-such-dataset"]),
        ({"eval_split": "nope"}, ["eval_split", "train", "eval"]),
        ({"train_split": "validation"}, ["train_split"]),
        ({"rollout": "vllm"}, ["rollout", "environment"]),
        ({"model": "Qwen/Qwen3-0.6B", "max_completion_length": 256}, ["max_completion_length", "512"]),
        ({"learning_rate": -1.0}, ["learning_rate"]),
        ({"learning_rate": "fast"}, ["learning_rate", "float"]),
        ({"precision": "bf16", "device": "cpu"}, ["precision", "GPU"]),
        ({"run_id": "../escape"}, ["run_id"]),
        ({"max_tool_calling_iterations": 0}, ["max_tool_calling_iterations"]),
        ({"reward_weights": [1.0, 2.0]}, ["reward_weights"]),
    ],
)
def test_invalid_combinations_fail_at_construction(kwargs, words):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs)
    message = str(info.value)
    for word in words:
        assert word in message, message


def test_divisibility_accounts_for_gradient_accumulation():
    config = TrainConfig(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=4)
    assert config.generation_batch_size == 4


def test_json_round_trip(tmp_path):
    config = TrainConfig(max_steps=7, learning_rate=3e-4, sft=False, reward_weights=[1, 0.1, 0.5])
    path = tmp_path / "c.json"
    config.to_json(path)
    again = TrainConfig.from_json(path)
    assert again == config
    assert again.reward_weights == [1.0, 0.1, 0.5]


def test_from_json_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        TrainConfig.from_json(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        TrainConfig.from_json(tmp_path / "missing.json")
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"max_step": 3}))
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        TrainConfig.from_json(typo)


def test_set_overrides_parse_by_type():
    config = TrainConfig().with_overrides([
        "max_steps=12", "learning_rate=1e-4", "sft=false", "compare_base=null", "reward_weights=1,0.2,1",
        "model=Qwen/Qwen3-0.6B", "max_completion_length=1024", "temperature=0.7", "rollout=rollout_func",
    ])
    assert config.max_steps == 12 and isinstance(config.max_steps, int)
    assert config.learning_rate == 1e-4
    assert config.sft is False and config.compare_base is None
    assert config.reward_weights == [1.0, 0.2, 1.0]
    assert config.model == "Qwen/Qwen3-0.6B" and config.rollout == "rollout_func"
    for bad, word in (["max_steps=ten"], "max_steps"), (["sft=maybe"], "sft"), (["nosuchkey=1"], "unknown"), \
            (["max_steps"], "key=value"), (["num_generations=1"], "num_generations"):
        with pytest.raises(ConfigError, match=word):
            TrainConfig().with_overrides(bad)


@pytest.mark.parametrize("name", ["tiny_cpu.json", "qwen3_0.6b_gpu.json"])
def test_shipped_configs_are_valid(name):
    config = TrainConfig.from_json(REPO / "configs" / name)
    resolved = config.resolved()
    assert resolved.max_tool_calling_iterations == resolved.step_budget
    if not config.is_builtin_model:
        assert resolved.max_completion_length >= 512
    else:
        assert config.device == "cpu" and resolved.sft


def test_grpo_and_sft_args_pass_through_and_refusals():
    from training.config import ConfigError, TrainConfig

    config = TrainConfig().with_overrides(["grpo.loss_type=dr_grpo", "grpo.num_iterations=2",
                                           'grpo.generation_kwargs={"top_k": 20}', "sft_args.max_length=512"])
    assert config.grpo == {"loss_type": "dr_grpo", "num_iterations": 2, "generation_kwargs": {"top_k": 20}}
    assert config.sft_args == {"max_length": 512}
    assert TrainConfig.from_dict(config.to_dict()) == config  # JSON round trip
    with pytest.raises(ConfigError, match=r"unknown GRPOConfig field 'grpo.loss_typ' \(did you mean 'grpo.loss_type'"):
        TrainConfig(grpo={"loss_typ": "dr_grpo"})
    with pytest.raises(ConfigError, match=r"unknown SFTConfig field 'sft_args.max_lenght'.*'sft_args.max_length'"):
        TrainConfig(sft_args={"max_lenght": 1})
    for key, hint in (("bf16", "precision"), ("use_cpu", "device"), ("max_completion_length", "max_completion_length"),
                      ("max_tool_calling_iterations", "step_budget"), ("beta", "beta"), ("output_dir", "run")):
        with pytest.raises(ConfigError, match=rf"grpo.{key} is set by this config.*{hint}"):
            TrainConfig(grpo={key: 1})
    with pytest.raises(ConfigError, match="max_turn_tokens"):
        TrainConfig(grpo={"generation_kwargs": {"max_new_tokens": 5}})
    with pytest.raises(ConfigError, match="sft_learning_rate"):
        TrainConfig(sft_args={"learning_rate": 1.0})
    with pytest.raises(ConfigError, match="grpo: "):  # TRL's own check of a value
        TrainConfig(grpo={"num_iterations": 0, "steps_per_generation": 3, "generation_batch_size": 5})
    with pytest.raises(ConfigError, match="grpo="):
        TrainConfig().with_overrides(["grpo=not json"])


def test_lora_checkpoint_and_tracker_fields():
    from training.config import ConfigError, TrainConfig

    lora = TrainConfig(lora={"r": 8}).resolved_lora()
    assert lora == {"r": 8, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear", "merge": False,
                    "load_in_4bit": False}
    assert TrainConfig().resolved_lora() is None
    for bad, match in (({"rank": 8}, "unknown config key 'lora.rank'"), ({"r": 0}, "lora.r"),
                       ({"dropout": 1.5}, "lora.dropout"), ({"target_modules": 3}, "target_modules"),
                       ({"load_in_4bit": True}, "QLoRA")):
        with pytest.raises(ConfigError, match=match):
            TrainConfig(lora=bad, device="cpu")
    assert TrainConfig(max_steps=30).resolved_save_steps() == 3
    assert TrainConfig(max_steps=30, sft_max_steps=300).resolved_save_steps("sft") == 30
    assert TrainConfig(save_steps=0).resolved_save_steps() == 0
    with pytest.raises(ConfigError, match="save_total_limit"):
        TrainConfig(save_total_limit=0)
    assert TrainConfig().with_overrides(["report_to=tensorboard"]).report_to == ["tensorboard"]
    with pytest.raises(ConfigError, match="unknown tracker 'tensorbored'"):
        TrainConfig(report_to=["tensorbored"])


def test_turn_length_translates_for_each_generation_backend(tmp_path):
    """TRL hands generation_kwargs to transformers' generate (max_new_tokens) or to vLLM's SamplingParams
    (max_tokens): a turn's budget must use the backend's name. The vLLM path is only configured here, never run."""
    from training.config import TrainConfig
    from training.grpo import grpo_args, turn_generation_kwargs

    base = dict(max_turn_tokens=48, output_dir=str(tmp_path / "run"), device="cpu")
    assert turn_generation_kwargs(TrainConfig(**base)) == {"max_new_tokens": 48}
    continuous = TrainConfig(**base, grpo={"use_transformers_continuous_batching": True})
    assert turn_generation_kwargs(continuous) == {"max_new_tokens": 48}
    vllm = TrainConfig(**base, grpo={"use_vllm": True, "vllm_mode": "colocate",
                                     "generation_kwargs": {"top_k": 20}})
    assert turn_generation_kwargs(vllm) == {"top_k": 20, "max_tokens": 48}
    args = grpo_args(vllm)
    assert args.use_vllm and args.vllm_mode == "colocate" and args.generation_kwargs == {"top_k": 20, "max_tokens": 48}
    assert args.output_dir == str(tmp_path / "run" / "checkpoints" / "grpo") and args.run_name == "run"
