"""Execution accuracy: test-suite-sql-eval's result comparison on real SQLite results, near-misses both ways,
and EX recorded per episode by the environment."""

from __future__ import annotations

import sqlite3

import pytest

from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation import evaluate
from sqlenv.execution import MAX_PERMUTED_CELLS, results_match
from sqlenv.policies import OraclePolicy, RandomPolicy
from sqlenv.sandbox import Sandbox, has_top_level_order_by
from sqlenv.types import Question, SQLAction


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """A real database: people with ages and scores (one duplicated name, one NULL score)."""
    root = tmp_path_factory.mktemp("shop")
    (root / "shop").mkdir()
    conn = sqlite3.connect(root / "shop" / "shop.sqlite")
    conn.executescript("""
        CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, score REAL);
        INSERT INTO people VALUES (1, 'Ann', 30, 10.0), (2, 'Bob', 25, 3.3333333), (3, 'Ann', 41, NULL),
                                  (4, 'Cid', 25, 7.5);
    """)
    conn.commit()
    conn.close()
    sandbox = Sandbox(root)
    yield root, sandbox
    sandbox.close()


def _match(sandbox: Sandbox, pred: str, gold: str) -> bool:
    p, g = sandbox.execute("shop", pred), sandbox.execute("shop", gold)
    return results_match(p.rows, g.rows, has_top_level_order_by(gold), pred_count=p.n_rows, gold_count=g.n_rows)


# (gold, a query that matches it, a near-miss that does not)
NEAR_MISSES = {
    "column order is free, even with ORDER BY": (
        "SELECT name, age FROM people ORDER BY age, id",
        "SELECT age, name FROM people ORDER BY age, id",
        "SELECT age, name FROM people ORDER BY age DESC, id",  # same rows, wrong order under ORDER BY
    ),
    "rows are a multiset: DISTINCT matters": (
        "SELECT DISTINCT name FROM people",
        "SELECT name FROM people GROUP BY name",
        "SELECT name FROM people",  # an extra 'Ann' row
    ),
    "row order is free without ORDER BY": (
        "SELECT name FROM people WHERE age < 35",
        "SELECT name FROM people WHERE age < 35 ORDER BY name DESC",
        "SELECT name FROM people WHERE age < 30",
    ),
    "float rounding within 1%, not beyond": (
        "SELECT score FROM people WHERE id = 2",
        "SELECT round(score, 2) FROM people WHERE id = 2",
        "SELECT round(score, 0) FROM people WHERE id = 2",
    ),
    "NULL is a row, not an empty result": (
        "SELECT score FROM people WHERE id = 3",
        "SELECT max(score) FROM people WHERE id > 2 AND name = 'Ann'",
        "SELECT score FROM people WHERE id = 99",  # empty
    ),
    "two empty results are equal, whatever their columns": (
        "SELECT name FROM people WHERE age > 100",
        "SELECT id, age FROM people WHERE name = 'Zed'",
        "SELECT NULL",  # one NULL row is not empty
    ),
    "text compares case-insensitively, integers exactly": (
        "SELECT count(*) FROM people WHERE age = 25",
        "SELECT '2'",
        "SELECT 2.01",
    ),
}


@pytest.mark.parametrize("case", list(NEAR_MISSES))
def test_near_misses_both_ways(shop, case):
    _, sandbox = shop
    gold, same, near = NEAR_MISSES[case]
    assert _match(sandbox, gold, gold)
    assert _match(sandbox, same, gold), f"{case}: {same!r} should match {gold!r}"
    assert not _match(sandbox, near, gold), f"{case}: {near!r} should not match {gold!r}"


def test_shapes_and_bounds():
    assert results_match([], [])
    assert not results_match([(1,)], [])
    assert not results_match([(1, 2)], [(1,)])
    assert results_match([(2, "a"), (1, "b")], [("b", 1), ("a", 2)])
    assert not results_match([(2, "a"), (1, "b")], [("a", 1), ("b", 2)])  # no column order fits
    # truncated results: the true row counts decide first
    assert not results_match([(1,)], [(1,)], pred_count=20_000, gold_count=10_000)
    # too big for the column search: only the result's own column order counts
    n = MAX_PERMUTED_CELLS // 4 + 1
    gold = [(i, -i) for i in range(n)]
    assert results_match(list(gold), gold)
    assert not results_match([(-i, i) for i in range(n)], gold)
    assert results_match([(-i, i) for i in range(10)], [(i, -i) for i in range(10)])
    # NULL equals only NULL
    assert not results_match([("",)], [(None,)]) and not results_match([("null",)], [(None,)])
    assert results_match([(None,)], [(None,)])


def _questions():
    return [Question(question_id="q1", question_text="Names of people younger than 35?", database_name="shop",
                     gold_sql="SELECT name FROM people WHERE age < 35", gold_answer=["Ann", "Bob", "Cid"],
                     answer_type="list", difficulty="easy", tables_involved=["people"], split="eval")]


def test_episode_records_the_last_successful_query(shop):
    root, _ = shop
    with SQLEnvironment(_questions(), root) as env:
        env.reset(question_id="q1")
        env.step(SQLAction("QUERY", "SELECT name FROM people WHERE age < 35 ORDER BY name"))
        assert env.transcript()["execution_match"] is None  # withheld while the episode runs
        env.step(SQLAction("QUERY", "SELECT nonsense FROM people"))  # fails: the last successful one still counts
        env.step(SQLAction("ANSWER", "Ann"))
        t = env.transcript()
        assert t["execution_match"] is True and t["correct"] is False

        env.reset(question_id="q1")
        env.step(SQLAction("QUERY", "SELECT name FROM people WHERE age < 35"))
        env.step(SQLAction("QUERY", "SELECT name FROM people"))  # a later wrong query replaces it
        env.step(SQLAction("ANSWER", "Ann, Bob, Cid"))
        t = env.transcript()
        assert t["execution_match"] is False and t["correct"] is True

        env.reset(question_id="q1")
        env.step(SQLAction("DESCRIBE", "people"))
        env.step(SQLAction("ANSWER", "Ann, Bob, Cid"))
        assert env.transcript()["execution_match"] is False  # no query, no execution match


def test_oracle_scores_full_ex_and_random_does_not(builtin):
    for split in builtin.splits:
        with SQLEnvironment(builtin.questions_path(split), builtin.db_dir) as env:
            oracle = evaluate(env, OraclePolicy(), n_episodes=30, seed=0)
            assert all(ep["execution_match"] is True for ep in oracle.episodes), split
            randoms = evaluate(env, RandomPolicy(seed=0), n_episodes=30, seed=0)
            assert all(isinstance(ep["execution_match"], bool) for ep in randoms.episodes)
            assert sum(ep["execution_match"] for ep in randoms.episodes) < 30


def test_the_column_search_is_bounded():
    width = 40
    # a gold column that no predicted column matches: no search at all
    gold = [tuple([1] * (width - 1) + [2]) for _ in range(3)]
    assert not results_match([tuple([1] * width) for _ in range(3)], gold)
    # 38 interchangeable columns, then two gold columns that both need the same predicted one: every order of the
    # first 38 is a dead end found last, so only the bound on the search lets this return (38! orders otherwise)
    gold = [tuple([1] * (width - 2) + [7, 7]) for _ in range(2)]
    pred = [tuple([1] * (width - 2) + [7, 8]) for _ in range(2)]
    assert not results_match(pred, gold)
    assert results_match([tuple([1] * (width - 2) + [8, 7]) for _ in range(2)],
                         [tuple([1] * (width - 2) + [7, 8]) for _ in range(2)])  # found within the bound
