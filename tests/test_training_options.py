"""The TRL options a user expects, on real tiny-model runs: a `grpo.` field reaches the trainer (read back from
grpo_config.json), LoRA (adapter saved, reloaded and evaluated; KL reference = adapter disabled, no second model),
TensorBoard files written offline, the run's --data-dir honoured."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from training_helpers import small_train_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_cpu_thread")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_lora_run_with_passthrough_and_tensorboard(tmp_path):
    """One run exercises three things: a `grpo.` field (read back from grpo_config.json), LoRA after an SFT warm
    start (adapter + merged model saved; reloaded and evaluated), and TensorBoard event files in the run directory."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.models import load_model_and_tokenizer
    from training.generation.model_policy import evaluate_model
    from training.run.directory import RunDir
    from training.train import run_training

    config = small_train_config(tmp_path, sft={"enabled": True, "max_steps": 2, "episodes": 4, "batch_size": 2}, beta=0.04,
                     lora={"r": 4, "alpha": 8, "merge": True}, report_to=["tensorboard"]).with_overrides(
        ["grpo.loss_type=dr_grpo", "grpo.top_p=0.9", "grpo.mask_truncated_completions=true"])
    run = RunDir(run_training(config))
    assert run.read_status()["status"] == "completed"
    effective = json.loads(run.file("grpo_config.json").read_text())
    assert effective["loss_type"] == "dr_grpo" and effective["top_p"] == 0.9
    assert effective["mask_truncated_completions"] is True
    assert effective["beta"] == 0.04 and effective["run_name"] == config.resolved().run_id == "run"
    assert effective["generation_kwargs"] == {"max_new_tokens": 16}

    adapter = json.loads((run.final_dir / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8
    # The base of the adapter is the warm-started model, kept in the run (not the random-init cache).
    assert Path(adapter["base_model_name_or_path"]) == (run.path / "warm_start").resolve()
    assert not (run.final_dir / "model.safetensors").exists()  # the adapter only
    reloaded, tokenizer = load_model_and_tokenizer(str(run.final_dir), device="cpu")
    merged, _ = load_model_and_tokenizer(str(run.final_dir / "merged"), device="cpu")
    ids = torch.tensor([tokenizer("Question: how many singers?")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, merged(ids).logits, atol=1e-5)
    result = evaluate_model(reloaded, tokenizer, split="eval", n_episodes=2, step_budget=2, max_turn_tokens=16)
    assert result.n_episodes == 2 and all(e["policy"] == "model" for e in result.episodes)

    for phase, tag in (("grpo", "train/reward"), ("sft", "train/loss")):
        events = list((run.path / "tracker" / phase).glob("events.out.tfevents.*"))
        assert events, phase
        accumulator = EventAccumulator(str(events[0].parent))
        accumulator.Reload()
        assert tag in accumulator.Tags()["scalars"], accumulator.Tags()["scalars"]


def test_lora_reference_is_the_base_with_the_adapter_disabled(tmp_path):
    """With beta > 0 and LoRA, TRL keeps no second model: the reference is the policy with its adapter disabled."""
    from peft import PeftModel

    from training.grpo import build_trainer
    from training.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("builtin:tiny", device="cpu")
    config = small_train_config(tmp_path, beta=0.1, lora={"r": 2, "target_modules": ["q_proj", "v_proj"]})
    trainer = build_trainer(config, copy.deepcopy(model), tokenizer, output_dir=str(tmp_path / "trainer"))
    assert trainer.ref_model is None and isinstance(trainer.model, PeftModel)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ("q_proj" in n or "v_proj" in n) for n in trainable)


def test_data_dir_is_where_named_datasets_resolve(tmp_path):
    """A dataset named in a custom data folder validates and trains from there (the dashboard's --data-dir)."""
    import shutil

    from sqlenv.data.datasets import resolve_dataset
    from training.config import ConfigError, TrainConfig
    from training.plan import RunPlan, check_config

    source = resolve_dataset("builtin")
    data = tmp_path / "data"
    shutil.copytree(source.root, data / "mine")
    (data / "mine" / "dataset.json").write_text(json.dumps({**source.meta, "name": "mine"}))
    with pytest.raises(ConfigError, match="unknown dataset 'mine'"):
        check_config(TrainConfig(dataset="mine"))
    config = small_train_config(tmp_path, dataset="mine", data_dir=str(data))
    plan = RunPlan.resolve(config)
    assert plan.dataset.root == data / "mine"
    assert plan.episodes("train").questions_path == data / "mine" / "questions_train.json"


def test_train_top_layers_trains_only_the_top_layers(tmp_path):
    """`train_top_layers=1` with the head frozen (`train_head=false`) on a real GRPO trainer: its optimizer holds the
    top decoder layer and the final norm and nothing else; a backward pass computes gradients for those alone
    (autograd stops at the top layer); a step of the trainer's optimizer changes them and leaves the embeddings (tied
    to the output head) and lower layers as they were. The head trained by default: tests/test_recipe.py."""
    import torch

    from training.grpo import build_trainer
    from training.models import load_model_and_tokenizer
    from training.models.trainable import decoder_layers, trainable_parameters

    model, tokenizer = load_model_and_tokenizer("builtin:tiny", device="cpu")
    n_layers = len(decoder_layers(model))
    assert n_layers >= 2
    top = f"layers.{n_layers - 1}."
    expected = {name for name, _ in model.named_parameters() if top in name or name == "model.norm.weight"}
    config = small_train_config(tmp_path, train_top_layers=1, train_head=False, learning_rate=1e-2)
    trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / "trainer"))
    names = {id(p): name for name, p in model.named_parameters()}
    optimizer = trainer.create_optimizer()
    assert {names[id(p)] for group in optimizer.param_groups for p in group["params"]} == expected
    assert trainable_parameters(model) == sum(p.numel() for n, p in model.named_parameters() if n in expected)

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ids = torch.tensor([tokenizer("Question: how many singers are there?")["input_ids"]])
    model(input_ids=ids, labels=ids).loss.backward()
    assert {name for name, p in model.named_parameters() if p.grad is not None} == expected
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])}
    assert changed and changed <= expected and any(top in name for name in changed)


def test_train_top_layers_is_checked():
    """Out-of-range values and the LoRA combination are refused with the field named; a model's layer count bounds it."""
    from training.config import ConfigError, TrainConfig
    from training.models import load_model_and_tokenizer
    from training.models.trainable import train_top_layers

    with pytest.raises(ConfigError, match="train_top_layers must be at least 1"):
        TrainConfig(train_top_layers=0)
    with pytest.raises(ConfigError, match="train_top_layers and lora"):
        TrainConfig(train_top_layers=2, lora={"r": 4})
    model, _ = load_model_and_tokenizer("builtin:tiny", device="cpu")
    with pytest.raises(ValueError, match="decoder layers: use 1 to"):
        train_top_layers(model, 99)
