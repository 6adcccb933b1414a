"""Reward calibration and the oracle ceiling, on the built-in dataset and on real Spider (spider10).

- an oracle episode totals about 1.1–1.3 (terminal 1.0 plus a small, positive dense part);
- the random policy averages under 0.3 total reward with ≈0% success;
- the oracle answers ≥ 99% of every question of built-in eval and spider10 eval.
"""

from __future__ import annotations

import statistics

import pytest

from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import EvaluationResult, evaluate, play_episode
from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy


@pytest.fixture(scope="session")
def builtin_dataset(tmp_path_factory):
    from sqlenv.data.builtin import build_builtin

    return build_builtin(tmp_path_factory.mktemp("calib") / "builtin", seed=0)


@pytest.fixture(scope="session")
def spider10(spider_source, tmp_path_factory):
    from sqlenv.data.spider import prepare_spider

    return prepare_spider(spider_source, tmp_path_factory.mktemp("calib") / "spider10", preset="spider10")


def _every_question(info, split, policy) -> EvaluationResult:
    env = SQLEnvironment(info.questions_path(split), info.db_dir, step_budget=15)
    episodes = [play_episode(env, policy, question_id=q.question_id) for q in env.questions]
    return EvaluationResult.from_episodes(episodes, policy=policy.name)


def _failures(result: EvaluationResult) -> str:
    bad = [ep for ep in result.episodes if not ep["correct"]]
    return "; ".join(f"{ep['question_id']} ({ep['outcome']}): {ep.get('error') or ep['answer']!r} vs {ep['gold_answer']!r}" for ep in bad[:5])


@pytest.mark.parametrize("dataset", ["builtin_dataset", "spider10"])
def test_oracle_succeeds_on_every_eval_question(dataset, request):
    info = request.getfixturevalue(dataset)
    result = _every_question(info, "eval", OraclePolicy())
    assert result.n_episodes >= 100
    assert result.n_errors == 0, _failures(result)
    assert result.success_rate >= 0.99, _failures(result)
    # Calibration: the oracle's episodes total about 1.1–1.3.
    totals = [ep["total_reward"] for ep in result.episodes if ep["correct"]]
    assert 1.1 <= statistics.mean(totals) <= 1.3
    assert min(totals) >= 1.0 and max(totals) <= 1.35
    assert statistics.median(totals) >= 1.1


@pytest.mark.parametrize("dataset", ["builtin_dataset", "spider10"])
def test_random_policy_is_a_floor(dataset, request):
    info = request.getfixturevalue(dataset)
    env = SQLEnvironment(info.questions_path("eval"), info.db_dir, step_budget=15)
    result = evaluate(env, RandomPolicy(seed=0), n_episodes=200, seed=0)
    assert result.n_errors == 0
    assert result.avg_reward < 0.3
    assert result.success_rate <= 0.02
    # ...but it does play: several steps per episode on average, not just an immediate answer.
    assert result.avg_steps >= 3


def test_oracle_beats_random_on_the_same_questions(builtin_dataset):
    env = SQLEnvironment(builtin_dataset.questions_path("eval"), builtin_dataset.db_dir)
    oracle = evaluate(env, OraclePolicy(), 50, seed=123)
    rand = evaluate(env, RandomPolicy(seed=1), 50, seed=123)
    assert [e["question_id"] for e in oracle.episodes] == [e["question_id"] for e in rand.episodes]
    assert oracle.avg_reward - rand.avg_reward > 0.8
