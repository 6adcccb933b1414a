"""SFT warm-start: oracle episodes rendered as GRPO renders them, assistant-only loss, a few real SFTTrainer steps.
(That the examples' ids are play's own, token for token: tests/test_sft_tokens.py.)"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from training.warm_start import SFTSettings, build_sft_dataset, teacher_conversations, run_sft


@pytest.fixture(scope="module")
def conversations():
    return teacher_conversations("builtin", "train", episodes=24, seed=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, conversations):
    from training.models import build_tiny_model
    from training.models.tokenizer import render_conversations

    path = build_tiny_model(tmp_path_factory.mktemp("sft") / "tiny", render_conversations(conversations), seed=0)
    return path


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _dataset(conversations, tokenizer):
    """The warm start's examples, rendered by the renderer play uses (as `run_sft` builds them)."""
    from training.generation.chat import ChatRenderer

    return build_sft_dataset(conversations, ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False}))


def test_oracle_conversation_matches_what_grpo_renders(conversations, tiny):
    """The SFT text starts with exactly the prompt TRL renders in GRPO: train row + reset() text, bound tools."""
    from trl.chat_template_utils import qwen3_training_chat_template

    from sqlenv.agent.prompts import FINAL_MESSAGE
    from training.environment.trl_env import SQLEnvTRL, tool_methods, train_rows

    _, tokenizer = _load(tiny)
    conv = conversations[0]
    messages = conv["messages"]
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert messages[-1] == {"role": "assistant", "content": FINAL_MESSAGE}
    roles = [m["role"] for m in messages[2:-1]]
    assert roles == ["assistant", "tool"] * (len(roles) // 2)
    names = [m["tool_calls"][0]["function"]["name"] for m in messages[2:-1:2]]
    assert names[-2:] == ["query", "answer"] and set(names[:-2]) <= {"describe"}

    # What GRPO does: configure, reset(**row), append the text to the row's user turn, tools = bound methods.
    SQLEnvTRL.configure(dataset="builtin", split="train", step_budget=10)
    rows = {r["question_id"]: r for r in train_rows(dataset="builtin", split="train").to_list()}
    row = rows[conv["question_id"]]
    env = SQLEnvTRL()
    prompt = copy.deepcopy(row["prompt"])
    prompt[-1]["content"] += env.reset(**row)
    grpo_prompt = tokenizer.apply_chat_template(prompt, tools=tool_methods(env), chat_template=qwen3_training_chat_template,
                                                add_generation_prompt=True, tokenize=False)
    sft_text = tokenizer.apply_chat_template(messages, tools=json.loads(conv["tools"]),
                                             chat_template=qwen3_training_chat_template, tokenize=False)
    assert sft_text.startswith(grpo_prompt)
    # The oracle's answer is correct and the tool results are the environment's own texts.
    assert "correct" in messages[-2]["content"].lower()


def test_assistant_mask_covers_assistant_turns_only(conversations, tiny):
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = _load(tiny)
    args = SFTConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True,
                     max_steps=1, save_strategy="no", disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=_dataset(conversations[:4], tokenizer),
                         processing_class=tokenizer)
    example = trainer.train_dataset[0]
    ids, labels = example["input_ids"], example.get("labels")
    mask = example["assistant_masks"] if labels is None else [int(label != -100) for label in labels]
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    ignored = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    messages = conversations[0]["messages"]
    for message in messages[2:]:
        if message["role"] == "assistant" and message.get("tool_calls"):
            arguments = message["tool_calls"][0]["function"]["arguments"]
            assert arguments in trained and arguments not in ignored
        elif message["role"] == "tool":
            assert message["content"] in ignored and message["content"] not in trained
    assert messages[1]["content"] in ignored and "You answer a question" not in trained
    assert trained.count("<|im_end|>") == sum(m["role"] == "assistant" for m in messages)
    assert "<|im_start|>" not in trained  # the role header is context, not target
    # The empty think block that closes each generation prompt is trained, as TRL's template marks it.
    assert trained.count("<think>") == sum(m["role"] == "assistant" for m in messages)


def test_examples_on_a_splitting_tokenizer_are_what_assistant_only_loss_trained(conversations, tiny):
    """On a tokenizer that splits at the segment boundaries (the tiny model's), each example is, token for token and
    mask for mask, what `SFTTrainer(assistant_only_loss=True)` built from the joined text with TRL's training
    template (less the joined text's trailing newline, outside the loss): the default run's warm start is unchanged."""
    from trl.chat_template_utils import qwen3_training_chat_template

    _, tokenizer = _load(tiny)
    for conversation, example in zip(conversations[:6], _dataset(conversations[:6], tokenizer)):
        joined = tokenizer.apply_chat_template(conversation["messages"], tools=json.loads(conversation["tools"]),
                                               chat_template=qwen3_training_chat_template, tokenize=True,
                                               return_dict=True, return_assistant_tokens_mask=True)
        n = len(example["input_ids"])
        assert joined["input_ids"][:n] == example["input_ids"]
        assert list(joined["assistant_masks"][:n]) == example["assistant_masks"]
        assert not any(joined["assistant_masks"][n:]) and len(joined["input_ids"]) - n <= 1


def test_few_sft_steps_reduce_assistant_loss(conversations, tiny):
    model, tokenizer = _load(tiny)

    examples = _dataset(conversations[:6], tokenizer)

    def assistant_loss() -> float:
        total, count = 0.0, 0
        model.eval()
        with torch.no_grad():
            for example in examples:
                ids = torch.tensor([example["input_ids"]])
                labels = ids.clone()
                labels[0, torch.tensor(example["assistant_masks"]) == 0] = -100
                n = int((labels[0, 1:] != -100).sum())
                total += model(input_ids=ids, labels=labels).loss.item() * n
                count += n
        model.train()
        return total / count

    before = assistant_loss()
    result = run_sft(model, tokenizer, SFTSettings(max_steps=12, batch_size=4, learning_rate=2e-3, logging_steps=4),
                     conversations=conversations)
    after = assistant_loss()
    assert result.steps == 12 and result.n_examples == len(conversations)
    assert after < before - 1.0, (before, after)
    assert result.final_loss < result.first_loss


def test_a_short_warm_start_plays_only_the_episodes_its_steps_take(tiny):
    """With `episodes` unset the teacher plays one episode per train question (3,421 built-in ones, ~30 s of CPU
    rendered for SmolLM2): a warm start of a few steps takes a seeded sample of just the examples it sees."""
    model, tokenizer = _load(tiny)
    settings = SFTSettings(max_steps=2, batch_size=2, step_budget=4, args={"gradient_accumulation_steps": 2})
    result = run_sft(model, tokenizer, settings)
    assert result.steps == 2 and result.n_examples == 2 * 2 * 2
    some = teacher_conversations("builtin", "train", step_budget=4, at_most=8)
    assert len(some) == 8 and len({c["question_id"] for c in some}) == 8
    assert len(teacher_conversations("builtin", "eval", step_budget=4, at_most=10_000)) == len(
        teacher_conversations("builtin", "eval", step_budget=4))  # a cap past the split plays each question once


def test_settings_from_train_config_fields():
    from training.config import TrainConfig

    settings = SFTSettings.from_config(TrainConfig(
        dataset="builtin", step_budget=7, seed=3, model="builtin:tiny",
        sft={"epochs": 2.0, "learning_rate": 5e-4, "batch_size": 4, "max_steps": 9, "episodes": 100}))
    assert (settings.step_budget, settings.seed, settings.epochs, settings.learning_rate) == (7, 3, 2.0, 5e-4)
    assert (settings.batch_size, settings.max_steps, settings.episodes) == (4, 9, 100)


# ------------------------------------------------------------------------------------------- the teacher
def _actions(conversation):
    return [(m["tool_calls"][0]["function"]["name"], json.loads(m["tool_calls"][0]["function"]["arguments"]))
            for m in conversation["messages"] if m.get("tool_calls")]


def test_teacher_at_rate_zero_plays_exactly_the_oracle():
    from sqlenv.environment import SQLEnvironment
    from sqlenv.scoring.verifier import format_answer

    conversations = teacher_conversations("builtin", "train", episodes=40, seed=2, describe=False, error_rate=0.0)
    env = SQLEnvironment.from_dataset("builtin", split="train")
    questions = {q.question_id: q for q in env.questions}
    env.close()
    for conv in conversations:
        q = questions[conv["question_id"]]
        assert conv["teacher"] == "oracle"
        assert _actions(conv) == [("query", {"sql": q.gold_sql}),
                                  ("answer", {"value": format_answer(q.gold_answer, q.answer_type)})]
        assert "correct" in conv["messages"][-2]["content"] and "incorrect" not in conv["messages"][-2]["content"]


def test_teacher_mistakes_are_that_share_and_deterministic_by_seed():
    from training.warm_start import teacher_plan

    both = ["guess", "wrong_query"]
    plan = teacher_plan(200, 0.3, both, seed=5)
    assert sum(who != "oracle" for who in plan) == 60
    assert set(plan) == {"oracle", "guess", "wrong_query"}
    assert teacher_plan(200, 0.3, both, seed=5) == plan and teacher_plan(200, 0.3, both, seed=6) != plan
    assert set(teacher_plan(200, 0.3, seed=5)) == {"oracle", "guess"}  # the default mistake: answer unseen
    assert teacher_plan(10, 0.0) == ["oracle"] * 10 and teacher_plan(10, 1.0, mistakes=["guess"]) == ["guess"] * 10
    with pytest.raises(ValueError, match="unknown teacher mistakes"):
        teacher_plan(10, 0.5, mistakes=["typo"])

    first = teacher_conversations("builtin", "train", episodes=60, seed=3, describe=False, error_rate=0.5,
                                  mistakes=both)
    again = teacher_conversations("builtin", "train", episodes=60, seed=3, describe=False, error_rate=0.5,
                                  mistakes=both)
    assert [c["messages"] for c in first] == [c["messages"] for c in again]
    assert sum(c["teacher"] != "oracle" for c in first) == 30
    for conv in first:
        names = [name for name, _ in _actions(conv)]
        verdict = conv["messages"][-2]["content"]
        if conv["teacher"] == "guess":  # answers without looking
            assert names == ["answer"] and "incorrect" in verdict
        elif conv["teacher"] == "wrong_query":  # a query, then an answer from its (wrong) result
            assert names in (["query", "answer"], ["answer"])
        else:
            assert names == ["query", "answer"] and "incorrect" not in verdict
    wrong = [c for c in first if c["teacher"] == "wrong_query" and len(_actions(c)) == 2]
    assert wrong and sum("incorrect" in c["messages"][-2]["content"] for c in wrong) >= len(wrong) * 0.7


# ----------------------------------------------------------------------------------------- the trainer
def test_warm_start_trainer_loss_and_gradient_equal_sfttrainer(conversations, tiny):
    """On CPU the LM head runs only where the loss is taken: the same loss and gradients as TRL's own."""
    from trl import SFTConfig, SFTTrainer

    from training.warm_start.trainer import WarmStartTrainer

    model, tokenizer = _load(tiny)
    args = SFTConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True,
                     per_device_train_batch_size=4, max_steps=1, save_strategy="no", disable_tqdm=True)
    dataset = _dataset(conversations[:8], tokenizer)
    ours = WarmStartTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trl = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    batch = next(iter(trl.get_train_dataloader()))
    weight = model.model.layers[0].mlp.up_proj.weight
    for n_items in (None, int((batch["labels"][:, 1:] != -100).sum())):
        losses, grads = [], []
        for trainer in (trl, ours):
            loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=n_items)
            losses.append(float(loss))
            grads.append(torch.autograd.grad(loss, weight)[0])
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        assert torch.allclose(grads[0], grads[1], atol=1e-6)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradient_checkpointing_setting_reaches_the_sft_trainer(conversations, tiny, checkpointing):
    from transformers import TrainerCallback

    from training.config import TrainConfig

    seen = {}

    class Spy(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen["args"] = args.gradient_checkpointing
            seen["model"] = model.is_gradient_checkpointing

    model, tokenizer = _load(tiny)
    config = TrainConfig(gradient_checkpointing=checkpointing, sft={"max_steps": 1, "batch_size": 2})
    run_sft(model, tokenizer, config, conversations=conversations[:4], callbacks=[Spy()])
    assert seen == {"args": checkpointing, "model": checkpointing}
