"""Reward layers: operational constants, progress score, potential-based shaping, clipping, calibration."""

from __future__ import annotations

import random

import pytest

from sqlenv.environment import SQLEnvironment
from sqlenv.rewards import GoldProfile, RewardConfig, progress_score
from sqlenv.types import SQLAction
from sqlenv.scoring.verifier import format_answer


def test_defaults_match_the_design():
    c = RewardConfig()
    assert (c.executed_ok, c.new_info, c.repeat_penalty, c.step_cost) == (0.02, 0.01, -0.03, -0.02)
    assert (c.weight_cardinality, c.weight_overlap, c.weight_numeric) == (0.25, 0.50, 0.25)
    assert (c.progress_scale, c.dense_min, c.dense_max, c.correct_answer) == (0.15, -0.10, 0.15, 1.0)


def test_operational_layer():
    c = RewardConfig()
    assert c.operational(ok=True, new_info=True, repeat=False) == pytest.approx(0.01)
    assert c.operational(ok=True, new_info=False, repeat=False) == pytest.approx(0.0)
    assert c.operational(ok=True, new_info=False, repeat=True) == pytest.approx(-0.03)
    assert c.operational(ok=False, new_info=False, repeat=False) == pytest.approx(-0.02)
    assert c.operational(ok=False, new_info=True, repeat=True) == pytest.approx(-0.05)  # errors reveal nothing


def test_potential_bins_and_shaping():
    c = RewardConfig()
    assert [c.potential(x) for x in (0, 0.2, 0.25, 0.49, 0.5, 0.74, 0.99, 1.0)] == \
        [0, 0, 0.25, 0.25, 0.5, 0.5, 0.75, 1.0]
    assert c.shaping(0.0, 1.0) == pytest.approx(0.15)
    assert c.shaping(0.3, 0.45) == 0.0  # same bin: no reward
    assert c.shaping(0.3, 0.8) == pytest.approx(0.15 * 0.5)


def test_clip_dense():
    c = RewardConfig()
    op, prog = c.clip_dense(0.01, 0.15)
    assert (op, op + prog) == (pytest.approx(0.01), pytest.approx(0.15))
    op, prog = c.clip_dense(-0.05, 0.0)
    assert op + prog == pytest.approx(-0.05)
    op, prog = c.clip_dense(-0.2, 0.0)
    assert op + prog == pytest.approx(-0.10)


def test_progress_score_properties():
    gold_rows = [("Summit Arena", 76125), ("North Arena", 52000), ("Harbor Arena", 31000)]
    gold = GoldProfile.from_rows(gold_rows)
    assert progress_score(gold_rows, 3, gold) == 1.0
    assert progress_score(list(reversed(gold_rows)), 3, gold) == 1.0  # sets, not order
    assert progress_score([("Summit Arena", 76125.0)] + gold_rows[1:], 3, gold) == 1.0  # 76125 == 76125.0
    assert progress_score([("Summit Arena", 76125.0000000001)] + gold_rows[1:], 3, gold) == 1.0  # float noise
    assert progress_score([("SUMMIT ARENA", 76125)] + gold_rows[1:], 3, gold) < 1.0  # text compared as stored
    partial = progress_score(gold_rows[:1], 1, gold)
    unrelated = progress_score([("x", 1), ("y", 2)], 2, gold)
    assert 0 < unrelated < partial < 1
    assert progress_score([], 0, gold) == 0.0
    # numeric closeness on a log scale: close counts score higher than far ones
    count = GoldProfile.from_rows([(30,)])
    near, mid, far = (progress_score([(n,)], 1, count) for n in (29, 100, 3000))
    assert far == pytest.approx(0.25)  # 100x off: only the cardinality term is left
    assert far < mid < near < 1
    assert progress_score([(30.0,)], 1, count) == 1.0
    # a gold result with no numbers: the numeric term follows the overlap
    names = GoldProfile.from_rows([("a",), ("b",)])
    assert progress_score([("c",), ("d",)], 2, names) == pytest.approx(0.25)


def test_oracle_episode_totals_about_1_1_to_1_3(env):
    for q in env.questions:
        env.reset(question_id=q.question_id)
        for table in q.tables_involved:
            assert not env.step(SQLAction("DESCRIBE", table)).error
        obs = env.step(SQLAction("QUERY", q.gold_sql))
        assert not obs.error
        assert obs.reward_layers.progress > 0 or q.gold_answer == []
        obs = env.step(SQLAction("ANSWER", format_answer(q.gold_answer, q.answer_type)))
        assert obs.done and env.transcript()["correct"], q.question_id
        total = env.reward_breakdown.total
        assert 1.1 <= total <= 1.3, (q.question_id, total)
        assert total == pytest.approx(sum(s["reward"] for s in env.transcript()["steps"]))


def test_repeat_penalty_uses_normalised_sql(env):
    env.reset(question_id="music_q1")
    first = env.step(SQLAction("QUERY", "SELECT name FROM singer WHERE age > 60"))
    again = env.step(SQLAction("QUERY", "select   NAME from SINGER where age>60;"))
    assert first.reward_layers.operational == pytest.approx(0.01)
    assert again.reward_layers.operational == pytest.approx(-0.03)  # ran, nothing new, repeated
    same_result = env.step(SQLAction("QUERY", "SELECT name FROM singer WHERE age > 60 AND 1 = 1"))
    assert same_result.reward_layers.operational == pytest.approx(0.0)  # not a repeat, but nothing new
    d1 = env.step(SQLAction("DESCRIBE", "singer"))
    d2 = env.step(SQLAction("describe", "SINGER"))
    assert d1.reward == pytest.approx(0.01) and d2.reward == pytest.approx(-0.03)
    s1 = env.step(SQLAction("SAMPLE", "singer"))  # first SAMPLE of the table is new information
    assert s1.reward == pytest.approx(0.01)


def test_progress_shaping_telescopes_to_at_most_the_scale(env):
    env.reset(question_id="music_q4")
    rewards = []
    for sql in ["SELECT name FROM singer WHERE age > 60", "SELECT name FROM singer WHERE age > 45",
                "SELECT name FROM singer WHERE age > 40", "SELECT name FROM singer WHERE age > 45"]:
        obs = env.step(SQLAction("QUERY", sql))
        assert not obs.error
        rewards.append(obs.reward_layers.progress)
    assert all(r >= 0 for r in rewards)
    assert rewards[-1] == 0.0  # going back down never pays and never costs
    # Potential-based: the progress rewards telescope to 0.15 x (Phi(final) - Phi(0)) = 0.15, less at most the
    # cent the clip takes when one step jumps the whole way.
    assert 0.14 - 1e-9 <= sum(rewards) <= 0.15 + 1e-9
    assert env.best_progress == 1.0


def test_every_step_reward_is_clipped(env):
    env.reset(question_id="shop_q3")
    for action in [SQLAction("BAD", "x"), SQLAction("BAD", "x"), SQLAction("QUERY", "DROP TABLE orders"),
                   SQLAction("QUERY", "SELECT category, count(*) FROM products GROUP BY category")]:
        obs = env.step(action)
        dense = obs.reward_layers.operational + obs.reward_layers.progress
        assert -0.10 - 1e-9 <= dense <= 0.15 + 1e-9


def test_terminal_layer(env):
    env.reset(question_id="music_q1")
    obs = env.step(SQLAction("ANSWER", "29"))
    assert obs.done and obs.reward_layers.terminal == 0.0 and env.reward_breakdown.correctness == 0.0
    assert env.transcript()["outcome"] == "wrong_answer"
    env.reset(question_id="music_q1")
    obs = env.step(SQLAction("ANSWER", "30"))
    assert obs.reward_layers.terminal == 1.0 and env.reward_breakdown.correctness == 1.0


def test_budget_exhaustion_earns_no_terminal(toy):
    env = SQLEnvironment(*toy, step_budget=3)
    env.reset(question_id="music_q1")
    for _ in range(3):
        obs = env.step(SQLAction("SAMPLE", "singer"))
    assert obs.done and obs.budget_remaining == 0 and obs.reward_layers.terminal == 0.0
    t = env.transcript()
    assert t["outcome"] == "budget_exhausted" and not t["correct"] and t["reward_breakdown"]["correctness"] == 0


def test_custom_config_is_used(toy):
    env = SQLEnvironment(*toy, reward_config=RewardConfig(step_cost=-0.05, correct_answer=2.0))
    env.reset(question_id="music_q1")
    assert env.step(SQLAction("NOPE", "")).reward == pytest.approx(-0.05)
    assert env.step(SQLAction("ANSWER", "30")).reward == pytest.approx(2.0 - 0.05 + 0.02)
    t = env.transcript()
    assert t["total_reward"] == pytest.approx(sum(s["reward"] for s in t["steps"]))
    assert t["reward_breakdown"]["correctness"] == 1.0  # correctness stays 0/1 whatever the reward scale


def test_random_actions_earn_little(env):
    """A seeded random agent (random action types, tables, simple SELECTs, answers) stays far from success."""
    rng = random.Random(0)
    totals, wins = [], 0
    for episode in range(40):
        obs = env.reset(seed=episode)
        tables = env.tables
        while not obs.done:
            kind = rng.choice(["DESCRIBE", "SAMPLE", "QUERY", "ANSWER"] + ["QUERY"] * 2)
            table = rng.choice(tables)
            arg = {"DESCRIBE": table, "SAMPLE": table, "QUERY": f"SELECT * FROM {table} LIMIT {rng.randint(1, 9)}",
                   "ANSWER": str(rng.randint(0, 100))}[kind]
            obs = env.step(SQLAction(kind, arg))
        totals.append(env.reward_breakdown.total)
        wins += env.transcript()["correct"]
    assert sum(totals) / len(totals) < 0.3
    assert wins <= 2


@pytest.mark.parametrize("bad", [{"dense_min": 0.2}, {"progress_bins": 0}, {"weight_overlap": -1.0}])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        RewardConfig(**bad)
