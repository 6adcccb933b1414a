"""Breakdowns of evaluation results: Wilson intervals, cells per hardness and database, old transcripts."""

from __future__ import annotations

import json

import pytest

from sqlenv.evaluation.breakdown import breakdown, rate_cell, wilson_interval
from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import EvaluationResult, all_questions, evaluate
from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy


@pytest.mark.parametrize("k, n, low, high", [
    (0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0), (81, 263, 0.2553, 0.3662),
])
def test_wilson_interval_known_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)
    assert lo <= k / n <= hi


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    # more episodes, narrower interval around the same rate
    assert (lambda a, b: b[1] - b[0] < a[1] - a[0])(wilson_interval(3, 10), wilson_interval(30, 100))


def _ep(db, hardness, correct, ex=None, with_ex=True):
    ep = {"database": db, "difficulty": hardness, "correct": correct}
    if with_ex:
        ep["execution_match"] = ex
    return ep


def test_cells_per_hardness_and_database():
    episodes = ([_ep("a", "hard", True, True)] * 3 + [_ep("a", "easy", False, True)] * 2
                + [_ep("b", "extra", False, False)] + [_ep("b", "medium", True, with_ex=False)]
                + [_ep("c", "level_3", False, None)])
    cells = breakdown(episodes)
    assert list(cells["hardness"]) == ["easy", "medium", "hard", "extra", "level_3"]  # Spider's order, then others
    assert list(cells["database"]) == ["a", "b", "c"]
    overall = cells["overall"]
    assert overall["n"] == 8 and overall["success_rate"] == pytest.approx(4 / 8)
    assert overall["n_execution"] == 6 and overall["execution_accuracy"] == pytest.approx(5 / 6)
    assert overall["success_ci"][0] < 0.5 < overall["success_ci"][1]
    a = cells["database"]["a"]
    assert (a["n"], a["success_rate"], a["execution_accuracy"]) == (5, 0.6, 1.0)
    medium = cells["hardness"]["medium"]  # a transcript from before EX: success counted, EX unknown
    assert (medium["n"], medium["success_rate"], medium["n_execution"], medium["execution_accuracy"],
            medium["execution_ci"]) == (1, 1.0, 0, None, None)
    assert sum(c["n"] for c in cells["hardness"].values()) == sum(c["n"] for c in cells["database"].values()) == 8
    assert rate_cell([])["n"] == 0
    json.dumps(cells)  # plain JSON


def test_evaluation_results_carry_the_breakdown(builtin):
    with SQLEnvironment(builtin.questions_path("eval"), builtin.db_dir) as env:
        oracle = evaluate(env, OraclePolicy(), seed=0, question_ids=all_questions(env)[:25])
        randoms = evaluate(env, RandomPolicy(seed=0), n_episodes=25, seed=0)
    assert [ep["question_id"] for ep in oracle.episodes] == all_questions(env)[:25]
    data = json.loads(json.dumps(oracle.to_dict(include_episodes=False)))
    assert data["success_rate"] == data["execution_accuracy"] == 1.0
    assert data["breakdown"]["overall"]["n"] == 25 and data["execution_ci"][1] == 1.0
    assert sum(c["n"] for c in data["breakdown"]["hardness"].values()) == 25
    assert set(data["breakdown"]["database"]) == {ep["database"] for ep in oracle.episodes}
    assert randoms.execution_accuracy is not None and randoms.execution_accuracy < 1.0
    # results rebuilt from stored transcripts score the same; transcripts without EX read as unknown
    assert EvaluationResult.from_episodes(oracle.episodes).breakdown() == oracle.breakdown()
    old = [{k: v for k, v in ep.items() if k != "execution_match"} for ep in oracle.episodes]
    assert EvaluationResult.from_episodes(old).execution_accuracy is None
    with pytest.raises(ValueError):
        evaluate(env, OraclePolicy(), n_episodes=3, question_ids=["only-one"])
