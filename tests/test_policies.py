"""RandomPolicy and OraclePolicy against the real environment on the built-in dataset."""

from __future__ import annotations

import sqlite3

import pytest

from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import play_episode
from sqlenv.evaluation.policies import OraclePolicy, Policy, RandomPolicy, table_names
from sqlenv.types import ACTION_TYPES
from sqlenv.scoring.verifier import format_answer


@pytest.fixture(scope="module")
def builtin(tmp_path_factory):
    from sqlenv.data.builtin import build_builtin

    return build_builtin(tmp_path_factory.mktemp("data") / "builtin", seed=0)


def _env(builtin, split="eval", budget=15):
    return SQLEnvironment(builtin.questions_path(split), builtin.db_dir, step_budget=budget)


def _db_tables(builtin, db):
    with sqlite3.connect(f"file:{builtin.db_dir / db / (db + '.sqlite')}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'").fetchall()
    return sorted(r[0].lower() for r in rows)


def test_policies_follow_the_protocol():
    assert isinstance(RandomPolicy(0), Policy) and isinstance(OraclePolicy(), Policy)
    assert RandomPolicy(0).name == "random" and OraclePolicy().name == "oracle"


def test_table_names_are_read_from_the_observation(builtin):
    env = _env(builtin)
    for seed in range(10):
        obs = env.reset(seed=seed)
        assert sorted(t.lower() for t in table_names(obs)) == _db_tables(builtin, env.question.database_name)
    # After a DESCRIBE adds columns to the schema text, the table list is unchanged.
    table = env.question.tables_involved[0]
    obs = env.step(__import__("sqlenv").SQLAction("DESCRIBE", table))
    assert sorted(t.lower() for t in table_names(obs)) == _db_tables(builtin, env.question.database_name)


def test_oracle_plays_describe_query_answer(builtin):
    env = _env(builtin)
    for seed in range(5):
        ep = play_episode(env, OraclePolicy(), seed=seed)
        q = env.question
        kinds = [s["action_type"] for s in ep["steps"]]
        described = [s["argument"] for s in ep["steps"] if s["action_type"] == "DESCRIBE"]
        assert kinds == ["DESCRIBE"] * len(described) + ["QUERY", "ANSWER"]
        assert [d.lower() for d in described] == list(dict.fromkeys(t.lower() for t in q.tables_involved))
        assert ep["steps"][-2]["argument"] == q.gold_sql
        assert ep["steps"][-1]["argument"] == ep["answer"] == format_answer(q.gold_answer, q.answer_type)
        assert ep["correct"] and all(not s["error"] for s in ep["steps"])


def test_oracle_fits_a_tiny_budget(builtin):
    env = _env(builtin, budget=2)
    for seed in range(5):
        ep = play_episode(env, OraclePolicy(), seed=seed)
        assert [s["action_type"] for s in ep["steps"]] == ["QUERY", "ANSWER"] and ep["correct"]
    env = _env(builtin, budget=1)
    ep = play_episode(env, OraclePolicy(), seed=0)
    assert [s["action_type"] for s in ep["steps"]] == ["ANSWER"] and ep["correct"]


def test_random_policy_is_seeded_and_valid(builtin):
    def actions(seed):
        env = _env(builtin, "train")
        policy = RandomPolicy(seed=seed)
        out = []
        for s in range(15):
            ep = play_episode(env, policy, seed=s)
            out.append([(st["action_type"], st["argument"]) for st in ep["steps"]])
            tables = _db_tables(builtin, env.question.database_name)
            for st in ep["steps"]:
                assert st["action_type"] in ACTION_TYPES
                if st["action_type"] in ("DESCRIBE", "SAMPLE"):
                    assert st["argument"].lower() in tables
            assert ep["steps"][-1]["done"] and ep["outcome"] in ("wrong_answer", "budget_exhausted", "correct")
        return out

    a = actions(1)
    assert a == actions(1)
    assert a != actions(2)
    kinds = {k for episode in a for k, _ in episode}
    assert kinds == set(ACTION_TYPES)  # it explores with every action type
    # Its queries are mostly valid SQL: the random baseline explores, it does not just produce errors.
    env = _env(builtin, "train")
    policy = RandomPolicy(seed=9)
    steps = [st for s in range(30) for st in play_episode(env, policy, seed=s)["steps"] if st["action_type"] == "QUERY"]
    assert steps and sum(1 for st in steps if not st["error"]) / len(steps) > 0.8
