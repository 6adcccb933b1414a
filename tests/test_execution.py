"""Execution accuracy as test-suite-sql-eval's `eval_exec_match` computes it (`sqlenv.scoring.execution`), on real
SQLite results: near-misses both ways (each also labelled by the official code when it is installed), the comparison's
bounds, and EX recorded per episode by the environment."""

from __future__ import annotations

import itertools
import random
import sqlite3
import time

import pytest

from official_eval import official_label
from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import evaluate
from sqlenv.scoring.execution import (ExecutionNotScored, execution_match, official_sql, order_matters,
                                     replace_cur_year)
from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy
from sqlenv.scoring.result_eq import results_match
from sqlenv.sandbox.sandbox import Sandbox, SandboxSettings
from sqlenv.types import Question, SQLAction

BIG_ROWS = 10_005  # past the 10,000 rows the sandbox keeps of a QUERY for display and progress


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """A real database: people with ages and scores (one duplicated name, one NULL score), and a table of more
    rows than a QUERY's result keeps."""
    root = tmp_path_factory.mktemp("shop")
    (root / "shop").mkdir()
    conn = sqlite3.connect(root / "shop" / "shop.sqlite")
    conn.executescript("""
        CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, score REAL);
        INSERT INTO people VALUES (1, 'Ann', 30, 10.0), (2, 'Bob', 25, 3.3333333), (3, 'Ann', 41, NULL),
                                  (4, 'Cid', 25, 7.5);
        CREATE TABLE big (n INTEGER);
    """)
    conn.executemany("INSERT INTO big VALUES (?)", [(i,) for i in range(1, BIG_ROWS + 1)])
    conn.commit()
    conn.close()
    sandbox = Sandbox(root)
    yield root, sandbox
    sandbox.close()


def _match(sandbox: Sandbox, pred: str, gold: str) -> bool:
    """EX as an episode scores it: the prediction's stored QUERY result, then `execution_match`."""
    return execution_match(sandbox, "shop", pred, gold, sandbox.execute("shop", pred))


# (gold, queries that match it, near-misses that do not): the official rules, which are stricter than the answer
# verifier's (case, spaces, float tolerance, numbers as text) and drop DISTINCT from both queries.
NEAR_MISSES = {
    "column order is free, even with ORDER BY": (
        "SELECT name, age FROM people ORDER BY age, id",
        ["SELECT age, name FROM people ORDER BY age, id"],
        ["SELECT age, name FROM people ORDER BY age DESC, id"],  # same rows, wrong order under ORDER BY
    ),
    "DISTINCT is dropped from both queries": (
        "SELECT DISTINCT name FROM people",
        ["SELECT name FROM people"],  # the official code runs the gold without DISTINCT: 'Ann' twice
        ["SELECT name FROM people GROUP BY name"],
    ),
    "row order is free without ORDER BY": (
        "SELECT name FROM people WHERE age < 35",
        ["SELECT name FROM people WHERE age < 35 ORDER BY name DESC"],
        ["SELECT name FROM people WHERE age < 30"],
    ),
    "text compares exactly: case, trailing spaces and periods": (
        "SELECT name FROM people WHERE id = 1",
        ["SELECT 'Ann'", "SELECT max(name) FROM people WHERE age < 35 AND score > 9"],
        ["SELECT upper(name) FROM people WHERE id = 1", "SELECT name || ' ' FROM people WHERE id = 1",
         "SELECT name || '.' FROM people WHERE id = 1"],
    ),
    "floats compare exactly": (
        "SELECT score FROM people WHERE id = 2",
        ["SELECT 3.3333333", "SELECT score + 0 FROM people WHERE id = 2"],
        ["SELECT score * 1.004 FROM people WHERE id = 2", "SELECT round(score, 2) FROM people WHERE id = 2"],
    ),
    "an average rounded is another number": (
        "SELECT avg(score) FROM people",
        ["SELECT avg(score) FROM people WHERE score IS NOT NULL"],
        ["SELECT round(avg(score), 2) FROM people"],
    ),
    "numbers: 2 equals 2.0, not '2'": (
        "SELECT count(*) FROM people WHERE age = 25",
        ["SELECT 2.0", "SELECT count(name) FROM people WHERE age < 30"],
        ["SELECT '2'", "SELECT 2.01"],
    ),
    "an ORDER BY in a subquery makes order matter": (
        "SELECT name FROM (SELECT name, age FROM people ORDER BY age, id LIMIT 3)",
        ["SELECT name FROM people WHERE age < 35 ORDER BY age, id"],
        ["SELECT name FROM people WHERE age < 35 ORDER BY name"],  # the same three names, another order
    ),
    "every row counts, past row 10,000 too": (
        "SELECT n FROM big ORDER BY n",
        ["SELECT n AS m FROM big ORDER BY n"],
        ["SELECT CASE WHEN n = 10003 THEN 0 ELSE n END FROM big ORDER BY n", "SELECT n FROM big ORDER BY n DESC"],
    ),
    "NULL is a row, not an empty result": (
        "SELECT score FROM people WHERE id = 3",
        ["SELECT max(score) FROM people WHERE id > 2 AND name = 'Ann'"],
        ["SELECT score FROM people WHERE id = 99", "SELECT ''"],
    ),
    "two empty results are equal, whatever their columns": (
        "SELECT name FROM people WHERE age > 100",
        ["SELECT id, age FROM people WHERE name = 'Zed'"],
        ["SELECT NULL"],  # one NULL row is not empty
    ),
}


@pytest.mark.parametrize("case", list(NEAR_MISSES))
def test_near_misses_both_ways(shop, case):
    _, sandbox = shop
    gold, same, near = NEAR_MISSES[case]
    assert _match(sandbox, gold, gold)
    for pred in same:
        assert _match(sandbox, pred, gold), f"{case}: {pred!r} should match {gold!r}"
    for pred in near:
        assert not _match(sandbox, pred, gold), f"{case}: {pred!r} should not match {gold!r}"


@pytest.mark.parametrize("case", list(NEAR_MISSES))
def test_near_misses_are_labelled_so_by_the_official_code(shop, case):
    root, _ = shop
    gold, same, near = NEAR_MISSES[case]
    db = root / "shop" / "shop.sqlite"
    assert [official_label(db, pred, gold) for pred in [gold, *same, *near]] == [1] * (1 + len(same)) + [0] * len(near)


def test_the_official_text_rules():
    assert official_sql("SELECT DISTINCT a FROM t WHERE b > = 1") == "SELECT  a FROM t WHERE b >= 1"
    assert official_sql("select count(distinct a), 'distinct' from t") == "select count( a), 'distinct' from t"
    assert official_sql("SELECT a FROM t; SELECT b FROM t") == "SELECT a FROM t; "  # the first statement only
    assert official_sql("SELECT a FROM t") == "SELECT a FROM t"
    assert order_matters("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 2)")
    assert order_matters("SELECT a FROM t WHERE b = 'x order by y'")  # a substring test, as the official one
    assert not order_matters("SELECT a FROM t ORDER  BY a")
    assert replace_cur_year("SELECT YEAR(CURDATE()) - year FROM t") == "SELECT 2020- year FROM t"


def test_shapes():
    assert results_match([], [], False) and results_match([], [(1,)][:0], True)
    assert not results_match([(1,)], [], False)
    assert not results_match([(1, 2)], [(1,)], False)
    assert results_match([(2, "a"), (1, "b")], [("b", 1), ("a", 2)], False)
    assert not results_match([(2, "a"), (1, "b")], [("a", 1), ("b", 2)], False)  # no column order fits
    assert results_match([(1, "x"), (2, "y")], [("x", 1.0), ("y", 2)], True)
    assert not results_match([(1, "x"), (2, "y")], [("y", 2), ("x", 1)], True)
    # the official quick rejection sorts each row's values by their text: '1.5' lands before 1 but after 1.0
    assert results_match([("1.5", 1.0)], [(1.0, "1.5")], False)
    assert not results_match([(1, "1.5")], [("1.5", 1.0)], False)  # though swapping the columns makes them equal
    assert results_match([(None,)], [(None,)], False)
    assert not results_match([("",)], [(None,)], False) and not results_match([("null",)], [(None,)], False)


def test_the_column_search_is_bounded():
    rng = random.Random(0)
    # a wide result, its 300 columns shuffled: one step per column, no backtracking
    gold = [tuple(rng.randrange(1000) for _ in range(300)) for _ in range(200)]
    order = list(range(300))
    rng.shuffle(order)
    pred = [tuple(row[j] for j in order) for row in gold]
    start = time.perf_counter()
    assert results_match(pred[::-1], gold, False)
    assert not results_match(pred[::-1][:-1] + [pred[0][::-1]], gold, False)
    # 40 identical columns: one group, not 40! orders
    assert results_match([(1,) * 39 + (2,)] * 3, [(2,) + (1,) * 39] * 3, False)
    assert time.perf_counter() - start < 10
    # rows that are the even permutations of 1..8, one swapped for an odd one: every column, every pair of columns
    # and every projection short of the last two columns agrees with the gold's, so each order fails only at its
    # end; no column order makes them equal (the official code would try all 8!). The bound ends the search.
    even = [p for p in itertools.permutations(range(1, 9)) if _parity(p) == 0]
    pred = even[1:] + [(2, 1, 3, 4, 5, 6, 7, 8)]
    start = time.perf_counter()
    assert not results_match(pred, even, False)
    assert time.perf_counter() - start < 30


def _parity(perm) -> int:
    return sum(a > b for a, b in itertools.combinations(perm, 2)) % 2


def _questions():
    def question(qid, text, gold_sql, gold_answer, answer_type="list"):
        return Question(question_id=qid, question_text=text, database_name="shop", gold_sql=gold_sql,
                        gold_answer=gold_answer, answer_type=answer_type, difficulty="easy",
                        tables_involved=["people"], split="eval")

    return [question("q1", "Names of people younger than 35?", "SELECT name FROM people WHERE age < 35",
                     ["Ann", "Bob", "Cid"]),
            question("q2", "Every person's name?", "SELECT name FROM people", ["Ann", "Bob", "Ann", "Cid"]),
            question("q3", "Every number?", "SELECT n FROM big", list(range(1, BIG_ROWS + 1)))]


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


def test_episode_ex_runs_the_official_text_when_it_differs(shop):
    root, _ = shop
    with SQLEnvironment(_questions(), root) as env:
        # the QUERY's own result has 'Ann' once; the official rules run it without DISTINCT, as the gold
        env.reset(question_id="q2")
        obs = env.step(SQLAction("QUERY", "SELECT DISTINCT name FROM people"))
        assert "3 rows" in obs.action_history[-1]
        env.step(SQLAction("ANSWER", "Ann, Bob, Cid"))
        assert env.transcript()["execution_match"] is True
        # a QUERY's result keeps 10,000 rows: EX runs it again and compares every row
        for sql, match in (("SELECT n FROM big", True), ("SELECT n FROM big WHERE n <> 10004 UNION ALL SELECT 0", False)):
            env.reset(question_id="q3")
            env.step(SQLAction("QUERY", sql))
            env.step(SQLAction("ANSWER", "1"))
            assert env.transcript()["execution_match"] is match, sql


# Cheap as sent (three scans of `big`), a cross join of 10,005^3 rows once the official rules drop DISTINCT. Issue 35:
# a server's `state` reply built the transcript, which scored EX then: the event loop waited 17.3 s on it.
CHEAP_ONLY_WITH_DISTINCT = ("SELECT count(*) FROM (SELECT DISTINCT n % 3 AS j FROM big) a, "
                            "(SELECT DISTINCT n % 3 AS j FROM big) b, (SELECT DISTINCT n % 3 AS j FROM big) c")


@pytest.mark.parametrize("budget", [15, 1])  # the episode ended by ANSWER, or by its budget on the QUERY itself
def test_ex_is_scored_by_the_step_that_ends_the_episode_and_only_read_after(shop, budget):
    """EX runs the official text of the last QUERY, another query than the step ran: it is scored once, by the step
    that ends the episode, within that step's time limit; the transcript (and a server's `state`) only reads it."""
    root, _ = shop
    timeout = 1.0
    with SQLEnvironment(_questions(), root, sandbox=SandboxSettings(timeout_s=timeout)) as env:
        env.reset(question_id="q1", step_budget=budget)
        start = time.monotonic()
        obs = env.step(SQLAction("QUERY", CHEAP_ONLY_WITH_DISTINCT))
        assert obs.error == "" and "27" in obs.result
        if not obs.done:
            assert time.monotonic() - start < timeout / 2
            start = time.monotonic()
            obs = env.step(SQLAction("ANSWER", "Ann, Bob, Cid"))
        assert obs.done and time.monotonic() - start <= timeout + 1.0  # the query and EX's together
        start = time.monotonic()
        transcript = env.transcript()
        assert time.monotonic() - start < timeout / 2  # nothing runs: the official text alone would take `timeout`
        # The official text was stopped at the time limit: a prediction that fails, as before.
        assert transcript["execution_match"] is False and env.execution_match is False


def test_ex_runs_no_query_without_its_whole_time_limit(shop):
    """Issue 43: EX's query started with whatever time the step had left, and SQLite checks no time limit while it
    prepares a statement: an official text that took seconds to prepare ran the step 0.5-1.8 s past its limit. It
    starts only with its whole time limit left now (within `max_uninterruptible_s`); with less, nothing runs and EX
    is unknown (`ExecutionNotScored`), not a wrong prediction."""
    root, sandbox = shop
    pred, gold = "SELECT DISTINCT name FROM people", "SELECT name FROM people"  # the official text differs: run
    result = sandbox.execute("shop", pred)
    with pytest.raises(ExecutionNotScored, match="left 0.[0-9]+ s of the 5 s"):
        execution_match(sandbox, "shop", pred, gold, result, deadline=time.monotonic() + 0.3)
    assert execution_match(sandbox, "shop", pred, gold, result, deadline=time.monotonic() + 5.0) is True
    # A prediction the official rules leave unchanged is compared from its stored result: nothing to run.
    assert execution_match(sandbox, "shop", gold, gold, sandbox.execute("shop", gold),
                           deadline=time.monotonic() + 0.3) is True


def test_an_episode_whose_last_step_left_ex_no_time_says_so(shop):
    """The budget's last step is a QUERY that runs to its time limit: the previous QUERY's official text (DISTINCT
    dropped) is what EX must run, with no time left. EX used to count it wrong ("No time left for this query");
    the transcript says now that it is unknown, and why."""
    root, _ = shop
    runaway = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    with SQLEnvironment(_questions(), root, sandbox=SandboxSettings(timeout_s=1.0)) as env:
        env.reset(question_id="q2", step_budget=2)
        assert env.step(SQLAction("QUERY", "SELECT DISTINCT name FROM people")).error == ""
        obs = env.step(SQLAction("QUERY", runaway))
        assert obs.done and "timed out" in obs.error
        transcript = env.transcript()
        assert transcript["execution_match"] is None and env.execution_match is None
        assert transcript["execution_note"].startswith("EX not scored: the step that ended the episode left")
        env.reset(question_id="q2", step_budget=2)  # a new episode: no note
        env.step(SQLAction("QUERY", "SELECT DISTINCT name FROM people"))
        env.step(SQLAction("ANSWER", "Ann, Bob, Cid"))
        assert env.execution_match is True and "execution_note" not in env.transcript()


def test_oracle_scores_full_ex_and_random_does_not(builtin):
    for split in builtin.splits:
        with SQLEnvironment(builtin.questions_path(split), builtin.db_dir) as env:
            oracle = evaluate(env, OraclePolicy(), n_episodes=30, seed=0)
            assert all(ep["execution_match"] is True for ep in oracle.episodes), split
            randoms = evaluate(env, RandomPolicy(seed=0), n_episodes=30, seed=0)
            assert all(isinstance(ep["execution_match"], bool) for ep in randoms.episodes)
            assert sum(ep["execution_match"] for ep in randoms.episodes) < 30
