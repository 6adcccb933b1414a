"""TrainConfig: defaults, auto fields, validation messages, JSON round trip, --set parsing, shipped configs; plain
data (no file read, no torch/TRL import) with the world checked by the run plan (`check_config`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.config import ConfigError, TrainConfig, WarmStart
from training.plan import check_config

REPO = Path(__file__).resolve().parent.parent


def test_defaults_and_auto_fields():
    config = TrainConfig()
    assert config.model == "builtin:tiny" and config.dataset == "builtin"
    assert (config.step_budget, config.num_generations) == (10, 4)
    assert (config.eval_every, config.trace_every, config.plot_every, config.eval_episodes) == (100, 50, 10, 3)
    resolved = config.resolved()
    assert resolved.max_tool_calling_iterations == config.step_budget
    assert resolved.sft.enabled is True  # auto: on for the built-in tiny model
    assert resolved.sft.teacher_error_rate == 0.3 and config.sft.teacher_error_rate is None
    assert resolved.max_completion_length >= 256
    assert resolved.output_dir.endswith(resolved.run_id)
    hub = TrainConfig(model="Qwen/Qwen3-0.6B").resolved()
    assert hub.sft.enabled is False and hub.max_completion_length >= 512
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
        ({"rollout": "vllm"}, ["rollout", "environment"]),
        ({"learning_rate": -1.0}, ["learning_rate"]),
        ({"learning_rate": "fast"}, ["learning_rate", "float"]),
        ({"precision": "fp16", "device": "cpu"}, ["precision", "GPU"]),
        ({"run_id": "../escape"}, ["run_id"]),
        ({"max_tool_calling_iterations": 0}, ["max_tool_calling_iterations"]),
        ({"reward_weights": [1.0, 2.0]}, ["reward_weights"]),
        ({"sft": {"max_stesp": 3}}, ["sft.max_stesp", "sft.max_steps"]),
        ({"sft": {"teacher_error_rate": 2.0}}, ["sft.teacher_error_rate"]),
        ({"sft": {"batch_size": "eight"}}, ["sft.batch_size", "int"]),
        ({"sft": "yes"}, ["sft must be"]),
        ({"zero_shot_episodes": -1}, ["zero_shot_episodes"]),
        ({"train_top_layers": 0}, ["train_top_layers"]),
    ],
)
def test_invalid_combinations_fail_at_construction(kwargs, words):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs)
    message = str(info.value)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"dataset": "no-such-dataset"}, ["dataset", "no-such-dataset"]),
        ({"eval_split": "nope"}, ["eval_split", "train", "eval"]),
        ({"train_split": "validation"}, ["train_split"]),
        ({"model": "Qwen/Qwen3-0.6B", "max_completion_length": 256}, ["max_completion_length", "512"]),
        ({"grpo": {"loss_typ": "dr_grpo"}}, ["unknown GRPOConfig field 'grpo.loss_typ'", "'grpo.loss_type'"]),
        ({"sft": {"args": {"max_lenght": 1}}}, ["unknown SFTConfig field 'sft.args.max_lenght'",
                                                "'sft.args.max_length'"]),
        ({"grpo": {"num_iterations": 0, "steps_per_generation": 3, "generation_batch_size": 5}}, ["grpo: "]),
    ],
)
def test_what_the_values_name_is_checked_by_the_plan(kwargs, words):
    config = TrainConfig(**kwargs)  # plain data: the values themselves are fine
    with pytest.raises(ConfigError) as info:
        check_config(config)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_constructing_a_config_reads_no_file_and_imports_no_ml_library():
    """The issue's check: constructing a config for a dataset that does not exist succeeds without torch or TRL."""
    import subprocess
    import sys

    code = ("import sys; from training.config import TrainConfig; TrainConfig(dataset='no-such-dataset'); "
            "TrainConfig.from_dict({'model': 'Qwen/Qwen3-0.6B', 'sft': {'max_steps': 5}, 'grpo': {'loss_type': 'x'}})"
            ".resolved(); bad = [m for m in ('torch', 'trl', 'transformers') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_older_flat_warm_start_keys_still_load_with_a_deprecation_message():
    old = {"max_steps": 3, "sft": True, "sft_max_steps": 50, "sft_learning_rate": 0.003, "sft_batch_size": 4,
           "sft_teacher_error_rate": 0.3, "sft_args": {"lr_scheduler_type": "constant"}, "sft_eval_every": 10}
    with pytest.warns(FutureWarning, match=r"sft_max_steps.*deprecated.*sft\.max_steps"):
        config = TrainConfig.from_dict(old)
    assert config.sft == WarmStart(enabled=True, max_steps=50, learning_rate=0.003, batch_size=4,
                                   teacher_error_rate=0.3, args={"lr_scheduler_type": "constant"}, eval_every=10)
    assert config.to_dict()["sft"]["max_steps"] == 50 and "sft_max_steps" not in config.to_dict()
    with pytest.warns(FutureWarning):  # `--set` of older commands too
        assert TrainConfig().with_overrides(["sft_max_steps=7"]).sft.max_steps == 7
    with pytest.raises(ConfigError, match="sft_max_steps and sft.max_steps"):
        TrainConfig.from_dict({"sft": {"max_steps": 1}, "sft_max_steps": 2})


def test_warm_start_section_overrides():
    config = TrainConfig().with_overrides(["sft.max_steps=5000", "sft.learning_rate=3e-3", "sft.args.max_length=512",
                                           "sft.teacher_mistakes=guess,wrong_query", "sft=false"])
    assert config.sft.max_steps == 5000 and config.sft.learning_rate == 3e-3 and config.sft.enabled is False
    assert config.sft.args == {"max_length": 512} and config.sft.teacher_mistakes == ["guess", "wrong_query"]
    assert TrainConfig(sft=True).sft == WarmStart(enabled=True)
    assert TrainConfig.from_dict(config.to_dict()) == config
    for bad, word in (["sft.max_stpes=3"], "sft.max_steps"), (["sft.args=3"], "args"), (["sft.epochs.x=1"], "no keys"):
        with pytest.raises(ConfigError, match=word):
            TrainConfig().with_overrides(bad)


def test_sft_settings_take_the_one_set_of_defaults():
    from training.warm_start import SFTSettings

    section, settings = WarmStart(), SFTSettings()
    for name in ("epochs", "max_steps", "learning_rate", "batch_size", "episodes", "describe", "teacher_mistakes"):
        assert getattr(settings, name) == getattr(section, name), name


def test_divisibility_accounts_for_gradient_accumulation():
    config = TrainConfig(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=4)
    assert config.generation_batch_size == 4


def test_json_round_trip(tmp_path):
    config = TrainConfig(max_steps=7, learning_rate=3e-4, sft={"enabled": False, "max_steps": 9},
                         reward_weights=[1, 0.1, 0.5])
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
    assert config.sft.enabled is False and config.compare_base is None
    assert config.reward_weights == [1.0, 0.2, 1.0]
    assert config.model == "Qwen/Qwen3-0.6B" and config.rollout == "rollout_func"
    for bad, word in (["max_steps=ten"], "max_steps"), (["sft=maybe"], "sft"), (["nosuchkey=1"], "unknown"), \
            (["max_steps"], "key=value"), (["num_generations=1"], "num_generations"):
        with pytest.raises(ConfigError, match=word):
            TrainConfig().with_overrides(bad)


@pytest.mark.parametrize("name", ["tiny_cpu.json", "qwen3_0.6b_gpu.json"])
def test_shipped_configs_are_valid(name):
    config = TrainConfig.from_json(REPO / "configs" / name)
    check_config(config)
    resolved = config.resolved()
    assert resolved.max_tool_calling_iterations == resolved.step_budget
    if not config.is_builtin_model:
        assert resolved.max_completion_length >= 512
    else:
        assert config.device == "cpu" and resolved.sft.enabled


def test_grpo_and_sft_args_pass_through_and_refusals():
    config = TrainConfig().with_overrides(["grpo.loss_type=dr_grpo", "grpo.num_iterations=2",
                                           'grpo.generation_kwargs={"top_k": 20}', "sft.args.max_length=512"])
    assert config.grpo == {"loss_type": "dr_grpo", "num_iterations": 2, "generation_kwargs": {"top_k": 20}}
    assert config.sft.args == {"max_length": 512}
    check_config(config)
    assert TrainConfig.from_dict(config.to_dict()) == config  # JSON round trip
    for key, hint in (("bf16", "precision"), ("use_cpu", "device"), ("max_completion_length", "max_completion_length"),
                      ("max_tool_calling_iterations", "step_budget"), ("beta", "beta"), ("output_dir", "run")):
        with pytest.raises(ConfigError, match=rf"grpo.{key} is set by this config.*{hint}"):
            TrainConfig(grpo={key: 1})
    with pytest.raises(ConfigError, match="max_turn_tokens"):
        TrainConfig(grpo={"generation_kwargs": {"max_new_tokens": 5}})
    with pytest.raises(ConfigError, match=r"sft.args.learning_rate is set.*sft.learning_rate"):
        TrainConfig(sft={"args": {"learning_rate": 1.0}})
    with pytest.raises(ConfigError, match="grpo="):
        TrainConfig().with_overrides(["grpo=not json"])


def test_lora_checkpoint_and_tracker_fields():
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
    assert TrainConfig(max_steps=30, sft={"max_steps": 300}).resolved_save_steps("sft") == 30
    assert TrainConfig(save_steps=0).resolved_save_steps() == 0
    # a pretrained model's checkpoint (optimizer included) is ~12 bytes a parameter: one per phase, past half-way
    assert TrainConfig(model="smollm2-135m", max_steps=8).resolved_save_steps() == 5
    assert TrainConfig(model="smollm2-135m", sft={"max_steps": 40}).resolved_save_steps("sft") == 21
    assert TrainConfig(model="smollm2-135m", save_steps=3).resolved_save_steps() == 3
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


@pytest.mark.parametrize("override, words", [("dataset=nope", ["dataset", "nope"]),
                                             ("grpo.loss_typ=x", ["grpo.loss_typ", "grpo.loss_type"])])
def test_cli_refuses_what_the_plan_refuses_in_one_line_with_exit_code_2(tmp_path, override, words):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "training.train", "--set", override, "--set",
                           f"output_dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert all(word in proc.stderr for word in words) and not (tmp_path / "run").exists()


def test_zero_shot_episodes_defaults_to_the_comparison_and_never_exceeds_it():
    assert TrainConfig(comparison_episodes=100).resolved_zero_shot_episodes() == 100
    assert TrainConfig(comparison_episodes=100, zero_shot_episodes=32).resolved_zero_shot_episodes() == 32
    assert TrainConfig(comparison_episodes=20, zero_shot_episodes=32).resolved_zero_shot_episodes() == 20
    assert TrainConfig(zero_shot_episodes=0).resolved_zero_shot_episodes() == 0


def test_a_secret_in_a_pass_through_section_is_refused_and_the_token_comes_from_the_environment():
    """`grpo.hub_token` from the owner's Advanced JSON was saved in the run's config.json, which the dashboard
    shows to anyone. No value named like a credential gets into a config, at any depth of `grpo` or `sft.args`."""
    for values, path in (({"grpo": {"hub_token": "hf_x"}}, "grpo.hub_token"),
                         ({"sft": {"args": {"hub_token": "hf_x"}}}, "sft.args.hub_token"),
                         ({"grpo": {"model_init_kwargs": {"token": "hf_x"}}}, "grpo.model_init_kwargs.token"),
                         ({"grpo": {"vllm_api_key": "k"}}, "grpo.vllm_api_key"),
                         ({"sft": {"args": {"password": "p"}}}, "sft.args.password")):
        with pytest.raises(ConfigError, match="HF_TOKEN") as refused:
            TrainConfig.from_dict(values)
        assert path in str(refused.value)
    with pytest.raises(ConfigError, match="grpo.hub_token looks like a secret"):
        TrainConfig().with_overrides(["grpo.hub_token=hf_x"])
    # Token counts and a tokenizer's special tokens are not secrets.
    kept = TrainConfig(grpo={"generation_kwargs": {"top_k": 20}, "max_prompt_length": 64},
                       sft={"args": {"eos_token": "<|im_end|>", "pad_token": "<pad>"}})
    assert kept.sft.args["eos_token"] == "<|im_end|>"


def test_cpu_threads_auto_takes_the_idle_cores_of_real_models():
    import os
    import subprocess
    import sys
    import time

    from training.config import TrainConfig
    from training.device import idle_cores, resolve_cpu_threads

    cores = len(os.sched_getaffinity(0))
    assert 1 <= idle_cores() <= cores
    # A job that keeps a core busy now is counted (a load average would still lag behind it).
    spin = "import time\nend = time.time() + 4\nwhile time.time() < end: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        assert idle_cores() <= max(1, cores - 1)
    finally:
        spinner.kill()
        spinner.wait()
    assert resolve_cpu_threads(TrainConfig(cpu_threads=3)) == 3
    assert resolve_cpu_threads(TrainConfig()) == 1  # builtin:tiny: one thread
    assert 1 <= resolve_cpu_threads(TrainConfig(model="smollm2-135m")) <= cores
