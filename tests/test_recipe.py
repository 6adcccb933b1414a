"""The GRPO recipe's defects fixed at their cause (issue 34, part 1), on the real tiny model and real TRL trainers:
top-layer training trains the output head (tied to the embedding) without backward reaching the frozen layers, the
learning-rate schedule of short runs, and what a capped turn or a truncated episode does in training and in eval."""

from __future__ import annotations

import copy
import os

import pytest
from training_helpers import small_train_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_cpu_thread")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# ------------------------------------------------------------------------------------ top layers and the head
def _lm_step(model, tokenizer, optimizer=None):
    """One language-model loss backward pass (and optimizer step) on a short text; returns the loss."""
    import torch

    ids = torch.tensor([tokenizer("Question: how many singers are there? Tables: singer, concert")["input_ids"]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return loss


def _watch_lower_layer(model):
    """A hook on the bottom decoder layer's output: whether it required grad (a graph was built below the trained
    layers) and every gradient that reached it."""
    from training.models.trainable import decoder_layers

    built, seen = [], []

    def on_output(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        built.append(hidden.requires_grad)
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: seen.append(grad))

    return built, seen, decoder_layers(model)[0].register_forward_hook(on_output)


def test_top_layer_training_trains_the_tied_head_from_the_output_side_only(tmp_path, tiny):
    """`train_top_layers=1` (head trained by default) on a real GRPO trainer: the optimizer holds the top layer, the
    final norm and the head, whose weight is the input embedding's; a step changes the head; no gradient reaches the
    layer below, with or without gradient checkpointing (which makes the embedding output require grad)."""
    import torch

    from training.grpo import build_trainer
    from training.models.trainable import decoder_layers

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied, as SmolLM2
    top = f"layers.{len(decoder_layers(model)) - 1}."
    head = "model.embed_tokens.weight"  # the tied head is listed once, under the embedding's name
    expected = {n for n, _ in model.named_parameters() if top in n or n in ("model.norm.weight", head)}
    trainer = build_trainer(small_train_config(tmp_path, train_top_layers=1, learning_rate=1e-2), model, tokenizer,
                            output_dir=str(tmp_path / "trainer"))
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = trainer.create_optimizer()
    assert {names[id(p)] for group in optimizer.param_groups for p in group["params"]} == expected

    built, seen, handle = _watch_lower_layer(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _lm_step(model, tokenizer, optimizer)
    assert built == [False] and seen == []  # no graph below the top layer, no gradient there
    assert {n for n, p in model.named_parameters() if p.grad is not None} == expected
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert head in changed and changed <= expected

    # The head's gradient is the output side's alone: that of an untied copy whose head alone trains. (A copy of
    # the fixture's model: the trainer's accelerator rebinds `model.forward`, which a deep copy would keep.)
    reference = copy.deepcopy(tiny[0])
    reference.load_state_dict(model.state_dict())
    reference.requires_grad_(False)
    reference.lm_head.weight = torch.nn.Parameter(model.get_output_embeddings().weight.detach().clone())
    model.zero_grad()
    _lm_step(model, tokenizer)
    _lm_step(reference, tokenizer)
    assert torch.allclose(model.get_output_embeddings().weight.grad, reference.lm_head.weight.grad, atol=1e-6)

    model.zero_grad()
    built.clear()
    model.gradient_checkpointing_enable()  # transformers then makes the embedding output require grad
    model.train()
    _lm_step(model, tokenizer)
    handle.remove()
    assert built == [True] and seen == []  # a graph below, but backward stops at the top layer's input
    assert model.get_output_embeddings().weight.grad is not None


def test_train_head_false_freezes_the_head(tmp_path, tiny):
    """`train_head=false`: the tied head/embedding stays frozen and unchanged; backward still stops above layer 0.
    Without train_top_layers the switch is refused (every weight trains then)."""
    import torch

    from training.config import ConfigError, TrainConfig
    from training.grpo import build_trainer

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    trainer = build_trainer(small_train_config(tmp_path, train_top_layers=1, train_head=False, learning_rate=1e-2),
                            model, tokenizer, output_dir=str(tmp_path / "trainer"))
    optimizer = trainer.create_optimizer()
    head = model.get_output_embeddings().weight
    assert not head.requires_grad
    assert all(p is not head for group in optimizer.param_groups for p in group["params"])
    built, seen, handle = _watch_lower_layer(model)
    before = head.detach().clone()
    _lm_step(model, tokenizer, optimizer)
    handle.remove()
    assert built == [False] and seen == [] and head.grad is None and torch.equal(head.detach(), before)

    with pytest.raises(ConfigError, match="train_head=false"):
        TrainConfig(train_head=False)
    assert TrainConfig(train_top_layers=2, train_head=False).train_head is False


# ---------------------------------------------------------------------------------------- the learning rate
def _applied_rates(tmp_path, tiny, **overrides):
    """The learning rate each optimizer step of a real 5-step GRPO run of the tiny model was taken at (read from the
    optimizer just before it steps), and the rates the trainer logged."""
    from transformers import TrainerCallback

    from training.grpo import build_trainer

    rates = []

    class Rates(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            rates.append(optimizer.param_groups[0]["lr"])

    config = small_train_config(tmp_path, max_steps=5, learning_rate=1e-3, rollout="rollout_func", **overrides)
    trainer = build_trainer(config, copy.deepcopy(tiny[0]), tiny[1], output_dir=str(tmp_path / "trainer"),
                            callbacks=[Rates()])
    trainer.train()
    logged = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    return rates, logged


def test_constant_with_warmup_holds_the_rate_after_warmup(tmp_path, tiny):
    """`grpo.lr_scheduler_type=constant_with_warmup` passes through to TRL: after `warmup_steps` every step runs at the
    nominal rate. Without a schedule TRL's linear decay runs each step at a smaller rate than the one before (the
    recipe's old defect: over a short run the mean rate is about half the nominal one)."""
    rates, logged = _applied_rates(tmp_path / "warmup", tiny,
                                   grpo={"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 2})
    assert rates == pytest.approx([0.0, 5e-4, 1e-3, 1e-3, 1e-3])  # transformers' linear warmup starts from 0
    assert logged and logged[-3:] == pytest.approx([1e-3] * 3)

    decaying, _ = _applied_rates(tmp_path / "default", tiny)
    assert decaying[0] == pytest.approx(1e-3) and all(b < a for a, b in zip(decaying, decaying[1:]))


# ------------------------------------------------------------------------- capped turns and truncated episodes
def _play(model, tokenizer, question_seeds, *, max_turn_tokens, max_completion_tokens=None):
    """Greedy episodes of the built-in train split (step budget 2) through `play_batched`: as training plays them
    (`max_completion_tokens`) or as evals do (None)."""
    from sqlenv.environment import SQLEnvironment
    from sqlenv.agent.prompts import format_tool_result, initial_messages
    from training.generation.chat import ChatRenderer
    from training.generation.episodes import Episode, play_batched

    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False})
    envs = [SQLEnvironment.from_dataset("builtin", "train", step_budget=2) for _ in question_seeds]
    episodes = []
    for env, seed in zip(envs, question_seeds):
        observation = env.reset(seed=seed)
        messages = initial_messages(observation)

        def step(action, env=env):
            obs = env.step(action)
            return format_tool_result(obs), obs, obs.done

        episodes.append(Episode(messages=messages, prompt_ids=renderer.prompt_ids(messages), step=step,
                                observation=observation))
    try:
        play_batched(model, renderer, episodes, max_turn_tokens=max_turn_tokens,
                     max_completion_tokens=max_completion_tokens, sample=False)
        return episodes, [env.transcript() for env in envs]
    finally:
        for env in envs:
            env.close()


def test_a_capped_turn_is_closed_and_played_on_in_training_as_in_eval(tiny):
    """The untrained tiny model babbles: every 6-token turn is capped. Training (an episode budget) and eval (none)
    play the same greedy episodes: each capped turn is closed by an end-of-turn token the model did not write
    (env_mask 0), its text runs as an action, and the episode plays on to its step budget; none is truncated."""
    model, tokenizer = tiny
    trained, trained_steps = _play(model, tokenizer, [0, 1, 2], max_turn_tokens=6, max_completion_tokens=1000)
    evaluated, eval_steps = _play(model, tokenizer, [0, 1, 2], max_turn_tokens=6)
    eos = tokenizer.eos_token_id
    for t, e in zip(trained, evaluated):
        assert (t.completion_ids, t.env_mask, t.actions) == (e.completion_ids, e.env_mask, e.actions)
        assert t.turns == 2 and t.done and not t.truncated and not e.truncated
        # An end of turn right after the model's tokens, not written by the model: the turn was closed for it.
        closes = [i for i, token in enumerate(t.completion_ids) if token == eos and t.env_mask[i - 1:i + 1] == [1, 0]]
        assert len(closes) == 2 and closes[-1] == len(t.completion_ids) - 1
    assert [len(s["steps"]) for s in trained_steps] == [len(s["steps"]) for s in eval_steps] == [2, 2, 2]


def test_truncated_episodes_leave_the_loss(tmp_path, tiny):
    """A real GRPO trainer on the batched path: with an episode budget that cuts every episode (its first capped turn
    fits, the tool result after it does not: the record ends on an end-of-turn token, which TRL's own check would
    miss) each row's loss mask is empty, so `mask_truncated_completions` (on by default) leaves it out of the loss;
    a budget that fits them masks nothing, nor does turning the option off."""
    from training.grpo import build_trainer, grpo_args

    assert grpo_args(small_train_config(tmp_path)).mask_truncated_completions is True

    def rollout(**overrides):
        config = small_train_config(tmp_path, rollout="rollout_func", max_turn_tokens=8, **overrides)
        trainer = build_trainer(config, copy.deepcopy(tiny[0]), tiny[1], output_dir=str(tmp_path / "trainer"))
        prompts = [trainer.train_dataset[i]["prompt"] for i in range(4)]
        return trainer, trainer.rollout_func(prompts, trainer)

    trainer, cut = rollout(max_completion_length=20)
    eos = tiny[1].eos_token_id
    assert all(ids[-1] == eos and len(ids) <= 20 for ids in cut["completion_ids"])
    assert all(sum(mask) == 0 for mask in cut["env_mask"])
    trainer.train()  # TRL takes the masked rows: the step runs, and their loss is 0
    assert trainer.state.global_step == 2

    _, whole = rollout(max_completion_length=400)
    assert all(sum(mask) > 0 and ids[-1] == eos for mask, ids in zip(whole["env_mask"], whole["completion_ids"]))
    _, unmasked = rollout(max_completion_length=20, grpo={"mask_truncated_completions": False})
    assert unmasked["completion_ids"] == cut["completion_ids"] and all(sum(mask) > 0 for mask in unmasked["env_mask"])
