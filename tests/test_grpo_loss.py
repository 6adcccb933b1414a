"""`SQLEnvGRPOTrainer`'s loss phase against TRL's own, on the tiny model: one real GRPO step (`train()`, gradient
accumulation, TRL's buffering and shuffling) through each trainer from the same weights on the same rollouts, and the
gradients compared before the optimizer step, for every `loss_type` of TRL 1.16.

The rollouts are one fixed generation batch (a `rollout_func` that replays it): 4 groups of 4 with prompts of
different lengths, completions of uneven lengths with tool-result spans, and rewards that make 10 of the 16
advantages exactly 0 (two all-equal groups, and two rows equal to their group's mean). With 2 rows per micro-batch
and 8 micro-batches, at least two micro-batches have no row left.
"""

from __future__ import annotations

import copy
import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_cpu_thread")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

GROUP_REWARDS = [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.5, 0.5], [1.0, 0.0, 0.0, 0.0]]
PROMPT_LENGTHS = [20, 27, 31, 23]  # one per group: a group shares its question
MAX_COMPLETION = 24
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def _rollouts(tokenizer) -> dict:
    """The generation batch every trainer here trains on (see the module docstring)."""
    import random

    rng = random.Random(0)
    vocab = [t for t in range(len(tokenizer)) if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)]
    prompt_ids, completion_ids, env_mask, scores = [], [], [], []
    for group, rewards in enumerate(GROUP_REWARDS):
        prompt = [rng.choice(vocab) for _ in range(PROMPT_LENGTHS[group])]
        for row, reward in enumerate(rewards):
            length = rng.randint(3, MAX_COMPLETION)
            ids = [rng.choice(vocab) for _ in range(length)]
            if (group + row) % 5:  # most end their episode; the others were cut at their budget
                ids[-1] = tokenizer.eos_token_id
            mask = [1] * length
            if length > 10:  # a tool result inside the completion: attended, not trained
                mask[4:8] = [0] * 4
            prompt_ids.append(prompt)
            completion_ids.append(ids)
            env_mask.append(mask)
            scores.append(reward)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None, "env_mask": env_mask,
            "score": scores}


def reward_score(prompts, completions, score, **kwargs):
    return list(score)


class Replay:
    """A `rollout_func` that returns the same generation batch whatever it is asked."""

    def __init__(self, batch: dict):
        self.batch = batch

    def __call__(self, prompts, trainer):
        assert len(prompts) == len(self.batch["prompt_ids"])
        return copy.deepcopy(self.batch)


class Probe:
    """Gradients before the optimizer step (a callback) and the rows x columns of each forward (a hook)."""

    def __init__(self, model):
        from transformers import TrainerCallback

        probe = self
        self.forwards: list[tuple[int, int]] = []
        self.tight: list[bool] = []  # per forward: its first and last columns hold a real token of some row
        self.grads: dict = {}

        class _Grads(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
                probe.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

        self.callback = _Grads()
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.forwards.append(tuple(ids.shape))
        mask = kwargs["attention_mask"]
        self.tight.append(bool(mask[:, 0].any() and mask[:, -1].any()))


def _step(trainer_class, tiny, tmp_path, loss_type: str, **settings):
    """One GRPO step of a fresh copy of the tiny model through `trainer_class`: (probe, trainer)."""
    from datasets import Dataset
    from trl import GRPOConfig

    model, tokenizer = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    probe = Probe(model)
    lean = settings.pop("lean_loss", None)
    # fp32 as the project's CPU runs (TRL's config turns bf16 autocast on by default, on CPU too); no clipping, so
    # the gradients compared are the loss's own.
    args = GRPOConfig(**{
        **dict(output_dir=str(tmp_path / trainer_class.__name__), per_device_train_batch_size=2,
               gradient_accumulation_steps=8, num_generations=4, max_completion_length=MAX_COMPLETION, max_steps=1,
               learning_rate=1e-3, loss_type=loss_type, beta=0.0, max_grad_norm=0.0, seed=0, use_cpu=True,
               bf16=False, report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
               gradient_checkpointing=False, remove_unused_columns=False, dataloader_num_workers=0),
        **settings})
    extra = {} if lean is None else {"lean_loss": lean}
    trainer = trainer_class(model=model, reward_funcs=[reward_score], args=args, processing_class=tokenizer,
                            train_dataset=Dataset.from_dict({"prompt": [f"q{i}" for i in range(4)]}),
                            rollout_func=Replay(_rollouts(tokenizer)), callbacks=[probe.callback], **extra)
    trainer.train()
    return probe, trainer


def _max_rel_diff(new: dict, ref: dict) -> float:
    """Max over parameters of max|g_new - g_ref| / max|g_ref| (the absolute difference where g_ref is all 0)."""
    assert new.keys() == ref.keys() and ref
    worst = 0.0
    for name, g in ref.items():
        scale = float(g.abs().max())
        diff = float((new[name] - g).abs().max())
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def _zero_advantage_rows() -> int:
    return sum(sum(1 for r in group if r == sum(group) / len(group)) for group in GROUP_REWARDS)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradient_equals_trl_for_each_loss_type(tiny, tmp_path, loss_type):
    from trl import GRPOTrainer

    from training.grpo.trainer import SQLEnvGRPOTrainer

    ref, _ = _step(GRPOTrainer, tiny, tmp_path, loss_type)
    new, trainer = _step(SQLEnvGRPOTrainer, tiny, tmp_path, loss_type)
    assert any(float(g.abs().max()) > 0 for g in ref.grads.values())  # the step moves the model
    assert _max_rel_diff(new.grads, ref.grads) <= 1e-5
    # TRL fed every row, each padded to the batch's longest prompt and completion; the lean loss fed the rows with a
    # non-zero advantage only (no forward at all for a micro-batch left empty), each trimmed to its micro-batch.
    rows = sum(len(g) for g in GROUP_REWARDS)
    assert [shape[0] for shape in ref.forwards] == [2] * 8
    assert {shape[1] for shape in ref.forwards} == {max(PROMPT_LENGTHS) + MAX_COMPLETION}
    kept = rows - _zero_advantage_rows()
    assert sum(shape[0] for shape in new.forwards) == kept
    assert len(new.forwards) < 8 and 1 in [shape[0] for shape in new.forwards]  # skipped and half-kept micro-batches
    assert all(new.tight) and not all(ref.tight)  # each micro-batch trimmed to its own longest prompt and completion
    stats = trainer.loss_phase
    assert (stats.rows, stats.rows_dropped, stats.micro_batches) == (rows, rows - kept, 8)
    assert stats.micro_batches_skipped == 8 - len(new.forwards) >= 2
    logged = [h for h in trainer.state.log_history if "loss_phase/rows_dropped_frac" in h]
    assert logged and logged[-1]["loss_phase/rows_dropped_frac"] == pytest.approx((rows - kept) / rows)


@pytest.mark.parametrize("settings, dropped", [
    # A KL term reads every row: only the rows with an empty loss mask (truncated, masked) may leave.
    (dict(beta=0.04, mask_truncated_completions=True), "empty"),
    # An entropy bonus reads every row: nothing leaves, padding is still trimmed.
    (dict(entropy_coef=0.01), "none"),
    # The high-entropy token mask takes a quantile over the micro-batch's tokens: only empty rows may leave.
    (dict(top_entropy_quantile=0.5, mask_truncated_completions=True), "empty"),
    # Sequence-level importance ratios and truncation masking: both kinds of row leave.
    (dict(importance_sampling_level="sequence", mask_truncated_completions=True), "both"),
    # The switch: TRL's loss as it is.
    (dict(lean_loss=False), "off"),
])
def test_gradient_equals_trl_when_other_terms_read_every_row(tiny, tmp_path, settings, dropped):
    from trl import GRPOTrainer

    from training.grpo.trainer import SQLEnvGRPOTrainer

    loss_type = "bnpo"  # its normaliser counts the micro-batch's tokens: the most sensitive to what is dropped
    ref_settings = {k: v for k, v in settings.items() if k != "lean_loss"}
    ref, _ = _step(GRPOTrainer, tiny, tmp_path, loss_type, **ref_settings)
    new, trainer = _step(SQLEnvGRPOTrainer, tiny, tmp_path, loss_type, **settings)
    assert _max_rel_diff(new.grads, ref.grads) <= 1e-5
    batch = _rollouts(tiny[1])
    truncated = sum(1 for ids in batch["completion_ids"] if ids[-1] != tiny[1].eos_token_id)
    zero = [r == sum(g) / len(g) for g in GROUP_REWARDS for r in g]
    either = sum(1 for z, ids in zip(zero, batch["completion_ids"]) if z or ids[-1] != tiny[1].eos_token_id)
    expected = {"empty": truncated, "none": 0, "both": either, "off": 0}[dropped]
    assert truncated and trainer.loss_phase.rows_dropped == expected
    assert sum(shape[0] for shape in new.forwards) == 16 - expected
    if dropped == "off":
        assert new.forwards == ref.forwards and not trainer.loss_phase.rows
    else:
        assert all(new.tight) and not all(ref.tight)


def test_build_trainer_uses_it_on_both_rollout_paths(tiny, tmp_path):
    from training.grpo import build_trainer
    from training.grpo.trainer import SQLEnvGRPOTrainer
    from training_helpers import small_train_config

    for rollout, lean in (("rollout_func", True), ("environment", False)):
        config = small_train_config(tmp_path / rollout, rollout=rollout, lean_loss=lean)
        model, tokenizer = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
        trainer = build_trainer(config, model, tokenizer, output_dir=str(tmp_path / rollout / "trainer"))
        assert isinstance(trainer, SQLEnvGRPOTrainer) and trainer.lean_loss is lean


def test_the_bench_runs_its_smallest_form(tmp_path, capsys):
    """`bench/learning/grpo_loss.py --model builtin:tiny`, at its smallest (one round, a step of 2 groups of 2
    episodes): the teacher plays the recipe's own batched rollout (its decoder is asked to forget as a kept-cache
    decoder is), the three loss phases run, and the lean loss's gradient equals TRL's."""
    import json
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    from bench.learning import grpo_loss

    recipe = json.loads((repo / "configs" / "smollm2_cpu.json").read_text())
    config = tmp_path / "step.json"
    # GRPO's dataset is every question of its split rendered by each of the 4 trainers: the eval split is a third
    # of the train split's size.
    config.write_text(json.dumps({**recipe, "num_generations": 2, "gradient_accumulation_steps": 4,
                                  "max_completion_length": 256, "cpu_threads": 1, "train_split": "eval"}))
    assert grpo_loss.main(["--model", "builtin:tiny", "--config", str(config), "--repeats", "1",
                           "--mixed-groups", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["step"]["episodes"] == 4 and out["rollouts"]["episodes"] == 4 and out["rollouts"]["groups"] == 2
    assert out["max_rel_grad_diff"] <= 1e-4
    tokens = out["tokens"]
    assert tokens["new_fed"] <= tokens["trim_only_fed"] == tokens["real"] < tokens["trl_fed"]
