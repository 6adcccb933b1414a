"""The GRPO question sampler (`training.grpo.sampler`): the mixed-success metric of a known batch, TRL's sampler layout,
a draw that moves toward questions with mixed groups and away from all-equal ones, determinism, saved statistics, and
real GRPO runs of the tiny model with it (both rollout paths, a scripted success reward, a resumed run)."""

from __future__ import annotations

import copy
import json
import os
import random
from functools import partial

import pytest
import torch
from training_helpers import small_train_config

from training.grpo.sampler import (MIXED_METRIC, STATE_FILE, MixedQuestionSampler, QuestionSampling, QuestionStats,
                                   SamplerSettings, mixed_success_fraction, question_groups)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# ---------------------------------------------------------------------------------------------- the metric
def test_mixed_fraction_of_a_known_batch():
    groups = [[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 1]]  # all right, all wrong, two mixed
    assert mixed_success_fraction([bool(v) for g in groups for v in g], 3) == 0.5
    assert mixed_success_fraction(torch.tensor([True, False, True, True]), 2) == 0.5
    assert mixed_success_fraction([True, True], 2) == 0.0
    with pytest.raises(ValueError, match="whole groups"):
        mixed_success_fraction([True, False, True], 2)


# ------------------------------------------------------------------------------------------------ the layout
def _chunks(indices: list[int], batch: int, mini: int, repeat: int) -> list[list[int]]:
    """The distinct questions of each chunk, after checking TRL's layout: each index `mini` times in a row, each
    chunk `repeat` times."""
    size = batch * mini
    blocks = [indices[i:i + size] for i in range(0, len(indices), size)]
    chunks = []
    for start in range(0, len(blocks), repeat):
        copies = blocks[start:start + repeat]
        assert len(copies) == repeat and all(c == copies[0] for c in copies)
        block = copies[0]
        questions = block[::mini]
        assert block == [q for q in questions for _ in range(mini)]
        assert len(set(questions)) == batch
        chunks.append(questions)
    return chunks


@pytest.mark.parametrize("batch,mini,repeat", [(3, 2, 1), (2, 4, 3)])
def test_layout_is_trls_repeat_sampler(batch, mini, repeat):
    from trl.trainer.utils import RepeatSampler

    ids = [f"q{i}" for i in range(11)]
    sampler = MixedQuestionSampler(QuestionStats(ids, mini), batch_size=batch, mini_repeat_count=mini,
                                   repeat_count=repeat, seed=0)
    trl = RepeatSampler(ids, mini_repeat_count=mini, batch_size=batch, repeat_count=repeat, seed=0)
    ours = list(sampler)
    assert len(ours) == len(sampler) == len(trl) == len(list(trl))
    assert len(_chunks(ours, batch, mini, repeat)) == len(ids) // batch
    assert len(_chunks(list(trl), batch, mini, repeat)) == len(ids) // batch  # the helper reads TRL's layout too


def test_a_batch_larger_than_the_dataset_is_refused():
    with pytest.raises(ValueError, match="distinct questions"):
        MixedQuestionSampler(QuestionStats(["a", "b"], 2), batch_size=3, mini_repeat_count=2)


# ------------------------------------------------------------------------------------------- the estimate
def _simulate(draw, success_rate, steps: int, batch: int, generations: int, seed: int, stats=None):
    """Plays `steps` generation batches with TRL's lag: chunk k + 1 is drawn before chunk k's outcomes are recorded.
    Returns the questions of each scored chunk and the mixed fraction of each."""
    rng = random.Random(seed)
    pending, played, fractions = [], [], []
    for _ in range(steps + 1):
        pending.append(draw())
        if len(pending) < 2:
            continue
        chunk = pending.pop(0)
        ids, outcomes = [], []
        for q in chunk:
            ids += [q] * generations
            outcomes += [rng.random() < success_rate[q] for _ in range(generations)]
        fractions.append(mixed_success_fraction(outcomes, generations))
        played.append(chunk)
        if stats is not None:
            stats.record(ids, outcomes)
    return played, fractions


def _kinds():
    """60 questions in 6 templates: two always answered, two never, two half the time."""
    rates = {"always": 1.0, "never": 0.0, "half": 0.5}
    ids, groups, success = [], {}, {}
    for t, kind in enumerate(["always", "never", "half"] * 2):
        for i in range(10):
            q = f"{kind}-{t}-{i}"
            ids.append(q)
            groups[q] = (f"t{t}@db", f"t{t}")
            success[q] = rates[kind]
    return ids, groups, success


def test_draws_move_toward_mixed_questions_and_replace_all_equal_ones():
    ids, groups, success = _kinds()
    stats = QuestionStats(ids, 4, groups)
    generator = torch.Generator().manual_seed(0)
    played, mixed = _simulate(lambda: [ids[r] for r in stats.draw(4, generator)], success, 40, 4, 4, seed=0,
                              stats=stats)
    late = [q for chunk in played[20:] for q in chunk]
    half = sum(q.startswith("half") for q in late) / len(late)
    assert half > 0.7  # a uniform draw gives a third
    generator = torch.Generator().manual_seed(0)
    _, uniform = _simulate(lambda: [ids[i] for i in torch.randperm(len(ids), generator=generator)[:4]], success,
                           40, 4, 4, seed=0)
    assert sum(mixed[20:]) / 20 > sum(uniform[20:]) / 20 + 0.3
    weights = dict(zip(ids, stats.row_weights().tolist()))
    assert max(weights[q] for q in ids if not q.startswith("half")) < min(weights[q] for q in ids
                                                                          if q.startswith("half"))


def test_a_question_whose_group_was_all_equal_gives_way():
    """Unseen questions are presumed promising; one group all right (or all wrong) puts a question below them, one
    mixed group above; a question in flight is not drawn again before its outcome is in."""
    ids = [f"q{i}" for i in range(6)]
    stats = QuestionStats(ids, 4)
    stats.record(["q0"] * 4 + ["q1"] * 4 + ["q2"] * 4, [True] * 4 + [False] * 4 + [True, False, True, False])
    p = dict(zip(ids, stats.mixed_probability().tolist()))
    assert p["q0"] < p["q5"] and p["q1"] < p["q5"] and p["q2"] > p["q5"]
    assert p["q3"] == p["q4"] == p["q5"]
    generator = torch.Generator().manual_seed(0)
    first, second = stats.draw(3, generator), stats.draw(3, generator)
    assert not set(first) & set(second)  # six questions: the second chunk takes the other three
    stats.record([ids[r] for r in first for _ in range(4)], [False] * 12)
    assert set(stats.draw(3, generator)) == set(first)  # the first chunk is scored, the second still in flight


def test_a_group_speaks_for_its_unseen_questions():
    ids, groups, _ = _kinds()
    stats = QuestionStats(ids, 4, groups)
    stats.record(["always-0-0"] * 4 + ["half-2-0"] * 4, [True] * 4 + [True, False, False, True])
    p = dict(zip(ids, stats.mixed_probability().tolist()))
    assert p["always-0-5"] < p["never-1-5"] < p["half-2-5"]  # never-1 is unseen: its prior is flat


def test_deterministic_given_seed_and_outcomes():
    def run(seed):
        ids, groups, success = _kinds()
        stats = QuestionStats(ids, 4, groups)
        generator = torch.Generator().manual_seed(seed)
        return _simulate(lambda: stats.draw(4, generator), dict(enumerate(success.values())), 10, 4, 4, seed=1,
                         stats=stats)[0]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_statistics_survive_a_checkpoint():
    ids, groups, success = _kinds()
    stats = QuestionStats(ids, 4, groups, SamplerSettings(half_life=3))
    generator = torch.Generator().manual_seed(0)
    _simulate(lambda: [ids[r] for r in stats.draw(4, generator)], success, 6, 4, 4, seed=0, stats=stats)
    restored = QuestionStats(ids, 4, groups, SamplerSettings(half_life=3))
    restored.load_state_dict(json.loads(json.dumps(stats.state_dict())))
    assert torch.equal(restored.mixed_probability(), stats.mixed_probability()) and restored.records == 6
    other = QuestionStats(ids[:30] + ["new"], 4, groups)  # another dataset: what it shares is restored
    other.load_state_dict(stats.state_dict())
    assert torch.equal(other.success[:30], stats.success[:30])


def test_settings_are_checked():
    with pytest.raises(ValueError, match="explore"):
        SamplerSettings(explore=0)
    with pytest.raises(ValueError, match="half_life"):
        SamplerSettings(half_life=0)


def test_question_groups_of_builtin_and_spider_records(tmp_path, builtin):
    groups = question_groups(builtin.questions_path("train"))
    record = json.loads(builtin.questions_path("train").read_text())[0]
    assert groups[record["question_id"]] == (f"{record['template']}@{record['database_name']}", record["template"])
    spider_like = tmp_path / "questions_train.json"
    spider_like.write_text(json.dumps([{"question_id": "spider-train-0", "database_name": "concert_singer"}]))
    assert question_groups(spider_like) == {"spider-train-0": ("concert_singer",)}


def test_config_switch():
    from training.config import ConfigError, TrainConfig

    assert TrainConfig().question_sampler == "uniform"
    assert TrainConfig(question_sampler="mixed").question_sampler == "mixed"
    with pytest.raises(ConfigError, match="question_sampler"):
        TrainConfig(question_sampler="hard")


def test_the_health_chart_shows_the_mixed_fraction():
    from dashboard.core import charts

    metrics = [{"phase": "sft", "step": 10, "mean_token_accuracy": 0.5}]
    metrics += [{"phase": "grpo", "step": step, "frac_reward_zero_std": 0.5, MIXED_METRIC: value}
                for step, value in ((1, 0.25), (2, 0.75))]
    fig = charts.tool_health_figure(metrics)
    trace = next(t for t in fig["data"] if t["name"] == "mixed-success groups")
    assert trace["x"] == [1, 2] and trace["y"] == [0.25, 0.75] and trace["xaxis"] == "x2"  # the GRPO panel
    assert fig["layout"]["yaxis" + trace["yaxis"][1:]]["tickformat"] == ".0%"


# ---------------------------------------------------------------------------------------- real GRPO runs
def _trainer_class():
    from trl import GRPOTrainer

    class Trainer(QuestionSampling, GRPOTrainer):
        pass

    return Trainer


def _fresh(tiny):
    model, tokenizer = tiny
    model, tokenizer = copy.deepcopy(model), copy.deepcopy(tokenizer)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def _sqlenv_trainer(tiny, tmp_path, sampler, **overrides):
    """What `training.grpo.build_trainer` builds, on `Trainer(QuestionSampling, GRPOTrainer)`."""
    from training.grpo import grpo_args
    from training.grpo.rewards import REWARD_FUNCS
    from training.grpo.rollout import BatchedRollout, rollout_rows
    from training.environment.trl_env import SQLEnvTRL, train_rows
    from training.plan import RunPlan

    plan = RunPlan.resolve(small_train_config(tmp_path, **overrides))
    source = plan.episodes(plan.config.train_split)
    model, tokenizer = _fresh(tiny)
    common = dict(model=model, reward_funcs=list(REWARD_FUNCS), processing_class=tokenizer,
                  args=grpo_args(plan, str(tmp_path / "trainer")), question_sampler=sampler,
                  question_groups=question_groups(source))
    if plan.config.rollout == "rollout_func":
        from training.generation.chat import ChatRenderer

        rollout = BatchedRollout(source, max_turn_tokens=16)
        trainer = _trainer_class()(train_dataset=rollout_rows(source), rollout_func=rollout, **common)
        rollout.renderer = ChatRenderer(tokenizer, chat_template=True)  # as build_trainer sets it
        rollout.renderer.eos_token_ids = list(trainer.eos_token_ids)
        return trainer
    return _trainer_class()(train_dataset=train_rows(source), environment_factory=partial(SQLEnvTRL, source), **common)


@pytest.mark.slow
@pytest.mark.usefixtures("one_cpu_thread")
@pytest.mark.parametrize("rollout,sampler", [("environment", "mixed"), ("rollout_func", "uniform")])
def test_grpo_logs_the_mixed_fraction_on_both_paths(tiny, tmp_path, rollout, sampler):
    trainer = _sqlenv_trainer(tiny, tmp_path, sampler, rollout=rollout, per_device_train_batch_size=4)
    from trl.trainer.utils import RepeatSampler

    assert isinstance(trainer._get_train_sampler(), MixedQuestionSampler if sampler == "mixed" else RepeatSampler)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2 and all(0.0 <= h[MIXED_METRIC] <= 1.0 for h in logs)
    if sampler == "mixed":
        assert trainer.question_stats.records == 2  # one record per generation batch


def _scripted_trainer(tiny, tmp_path, sampler, seen: list, **args):
    """A plain GRPO run of the tiny model whose success is scripted: in each group of a question named `even-*`, the
    first completion succeeds; `odd-*` questions never do (each kind one group of the sampler's prior). `seen` gets
    each batch's question ids."""
    from datasets import Dataset
    from trl import GRPOConfig

    def reward_correctness(prompts, completions, question_id, **kwargs):
        seen.append(list(question_id))
        return [1.0 if q.startswith("even") and (i == 0 or question_id[i - 1] != q) else 0.0
                for i, q in enumerate(question_id)]

    ids = [f"{'even' if i % 2 == 0 else 'odd'}-{i}" for i in range(24)]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"question {q}"}] for q in ids],
                                 "question_id": ids})
    config = GRPOConfig(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=8, num_generations=2,
                        max_completion_length=4, learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True,
                        disable_tqdm=True, remove_unused_columns=False, seed=0, **args)
    model, tokenizer = _fresh(tiny)
    return _trainer_class()(model=model, reward_funcs=[reward_correctness], args=config, train_dataset=dataset,
                            processing_class=tokenizer, question_sampler=sampler,
                            question_groups={q: q.split("-")[0] for q in ids})


@pytest.mark.slow
@pytest.mark.usefixtures("one_cpu_thread")
def test_the_logged_fraction_is_the_batchs_and_the_sampler_follows_it(tiny, tmp_path):
    seen: list = []
    trainer = _scripted_trainer(tiny, tmp_path, "mixed", seen, max_steps=8)
    stats, records_at_draw = trainer.question_stats, []
    draw = stats.draw
    stats.draw = lambda n, generator: records_at_draw.append(stats.records) or draw(n, generator)
    trainer.train()
    # The dataloader reads one batch ahead: chunk k is drawn once the outcomes of chunks < k - 1 are in, never later.
    assert records_at_draw[:2] == [0, 0] and all(r >= k - 1 for k, r in enumerate(records_at_draw))
    logs = [h for h in trainer.state.log_history if MIXED_METRIC in h]
    assert len(logs) == len(seen) == 8
    for log, ids in zip(logs, seen):
        groups = ids[::2]
        assert log[MIXED_METRIC] == pytest.approx(sum(q.startswith("even") for q in groups) / len(groups))
    # Once a few outcomes are in, the even questions (mixed groups) are drawn far more than their half.
    late = [q for ids in seen[4:] for q in ids[::2]]
    assert sum(q.startswith("even") for q in late) / len(late) >= 0.75


@pytest.mark.slow
@pytest.mark.usefixtures("one_cpu_thread")
def test_a_resumed_run_restores_the_statistics(tiny, tmp_path):
    seen: list = []
    first = _scripted_trainer(tiny, tmp_path, "mixed", seen, max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    saved = json.loads((tmp_path / "trainer" / "checkpoint-2" / STATE_FILE).read_text())
    assert saved["records"] == 2 and saved["questions"]
    second = _scripted_trainer(tiny, tmp_path, "mixed", seen, max_steps=3, save_strategy="no")
    second.train(resume_from_checkpoint=True)
    assert second.question_stats.records == 3
    assert second.question_stats.success.sum() > 0
