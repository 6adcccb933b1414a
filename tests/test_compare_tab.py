"""The Compare tab's question list and transcript columns on a real comparison: real episodes of the built-in eval
questions, drawn by seed as a run's comparison draws them (with repeats), written to a real run directory."""

from __future__ import annotations

import pytest

from dashboard.compare.tab import RANDOM, base_title, find_pair, question_choices, question_label
from dashboard.core.run_data import RunCache
from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import evaluate
from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy
from training.run.directory import RunDir

N = 60  # enough draws from the eval split that a question repeats (seed 3 repeats one; checked below)


@pytest.fixture(scope="module")
def comparison_run(builtin, tmp_path_factory):
    root = tmp_path_factory.mktemp("compare-tab")
    with SQLEnvironment(builtin.questions_path("eval"), builtin.db_dir, step_budget=4) as env:
        randoms = evaluate(env, RandomPolicy(seed=3), n_episodes=N, seed=3)
        oracle = evaluate(env, OraclePolicy(), n_episodes=N, seed=3)
    run = RunDir.create(root, "warm")
    run.write_config({"model": "builtin:tiny", "dataset": "builtin", "eval_split": "eval"})
    run.write_status("completed", step=1, total_steps=1)
    for i, (r, t) in enumerate(zip(randoms.episodes, oracle.episodes)):
        run.append("comparison", {"kind": "pair", "index": i, "seed": 3 + i, "question_id": t["question_id"],
                                  "random": r, "trained": t, "base": r})
    run.append("comparison", {"kind": "summary", "split": "eval", "n_episodes": N,
                              "base_label": "SFT warm-start (before GRPO)",
                              "trained": {"success_rate": 1.0, "n_episodes": N}})
    return RunCache(root).snapshot("warm")


def test_every_paired_episode_is_a_choice_even_when_questions_repeat(comparison_run):
    pairs = comparison_run.pairs
    ids = [p["question_id"] for p in pairs]
    assert len(set(ids)) < len(ids), "the draw should repeat a question (pick another seed)"
    choices = question_choices(pairs)
    assert choices[0] == RANDOM and len(choices) == N + 1
    values = [value for _, value in choices[1:]]
    assert len(set(values)) == N  # one value per episode, though question ids repeat
    assert [find_pair(pairs, v) for v in values] == list(range(N))
    repeated = next(q for q in ids if ids.count(q) > 1)
    labels = [label for label, _ in choices[1:] if repeated in label]
    assert len(labels) == ids.count(repeated) and len(set(labels)) == len(labels)  # "#i" tells them apart
    assert question_label(N) == f"Eval question ({N} paired)"


def test_picking_by_question_id_and_refusals(comparison_run):
    pairs = comparison_run.pairs
    assert find_pair(pairs, pairs[5]["question_id"]) == [p["question_id"] for p in pairs].index(pairs[5]["question_id"])
    for bad in ("episode:", f"episode:{N}", "episode:-1", "episode:²", "episode:" + "9" * 5000, "nope", None, 3):
        assert find_pair(pairs, bad) is None, bad


def test_the_middle_column_is_titled_as_the_tables_name_the_base():
    assert base_title({"base_label": "SFT warm-start (before GRPO)"}) == "SFT warm-start (before GRPO)"
    assert base_title(None) == base_title({}) == "Base model (before GRPO)"
