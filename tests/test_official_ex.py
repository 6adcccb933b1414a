"""EX agrees with test-suite-sql-eval's own `eval_exec_match` (default settings), pair by pair.

The pairs are Spider dev's gold queries and seven perturbations of each, built here from `../shared/spider`
(nothing derived from Spider is written anywhere): the gold itself, its columns reversed, its ORDER BY dropped,
DISTINCT added, a number changed, LIMIT 1 added, an `=` against a value turned to `!=`. Each pair is labelled by
the official code (PyPI's nl2sql360 ships it unchanged: `tests/official_eval.py`) and scored by the project the
way an episode scores it: the prediction run by the sandbox as a QUERY (its stored result reused when the
official rules allow), then `sqlenv.scoring.execution.execution_match`. A second test compares the result comparison
alone on generated results, where the official `result_eq` has its subtle cases (1 against 1.0 in its quick
rejection, duplicated columns, wide results).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter

import pytest
import sqlglot
from sqlglot import exp

from official_eval import official_exec_eval, official_label
from sqlenv.scoring.execution import execution_match, official_sql
from sqlenv.scoring.result_eq import results_match
from sqlenv.sandbox.sandbox import Sandbox, SandboxError

KINDS = ("identity", "columns reversed", "ORDER BY dropped", "DISTINCT added", "number changed", "LIMIT 1 added",
         "= to !=")


# ------------------------------------------------------------------------------------------ the perturbations

def _selects(node: exp.Expression) -> list[exp.Select]:
    """The SELECTs whose columns make a query's result: the query's own, or every branch of its set operation."""
    if isinstance(node, exp.Select):
        return [node]
    if isinstance(node, exp.SetOperation):
        return _selects(node.this) + _selects(node.expression)
    return []


def perturb(gold: str) -> dict[str, str]:
    """The perturbations of one gold query that apply to it, by kind (a kind that cannot apply is left out)."""
    out = {"identity": gold}
    if not re.match(r"(?is)\s*select\s+distinct\b", gold):
        out["DISTINCT added"] = re.sub(r"(?is)^\s*select\s+", "SELECT DISTINCT ", gold, count=1)
    try:
        tree = sqlglot.parse_one(gold, read="sqlite")
    except sqlglot.errors.ParseError:
        return out

    def edit(change) -> str | None:
        copy = tree.copy()
        if change(copy) is False:
            return None
        return copy.sql(dialect="sqlite")

    def reverse(t):
        selects = _selects(t)
        if not selects or len(selects[0].expressions) < 2:
            return False
        for s in selects:
            s.set("expressions", list(reversed(s.expressions)))

    def drop_order(t):
        if not t.args.get("order"):
            return False
        t.set("order", None)

    def change_number(t):
        number = next((n for n in t.find_all(exp.Literal) if n.is_number), None)
        if number is None:
            return False
        number.replace(exp.Literal.number(str(int(float(number.this)) + 1)))

    def add_limit(t):
        if t.args.get("limit") or not isinstance(t, (exp.Select, exp.SetOperation)):
            return False
        t.set("limit", exp.Limit(expression=exp.Literal.number(1)))

    def negate(t):
        eq = next((e for e in t.find_all(exp.EQ) if isinstance(e.expression, exp.Literal)
                   or isinstance(e.this, exp.Literal)), None)  # against a value: a join's `=` would multiply rows
        if eq is None:
            return False
        eq.replace(exp.NEQ(this=eq.this, expression=eq.expression))

    for kind, change in (("columns reversed", reverse), ("ORDER BY dropped", drop_order),
                         ("number changed", change_number), ("LIMIT 1 added", add_limit), ("= to !=", negate)):
        sql = edit(change)
        if sql is not None:
            out[kind] = sql
    return out


# -------------------------------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def dev_pairs(spider_source):
    """(db_id, kind, prediction, gold) for every present dev database's question, in dev.json's order."""
    official_exec_eval()  # skip before building anything when the official code is missing
    dev = json.loads((spider_source / "dev.json").read_text())
    pairs = []
    for item in dev:
        db_id = item["db_id"]
        if not (spider_source / "database" / db_id / f"{db_id}.sqlite").is_file():
            continue
        gold = item["query"].strip()
        for kind, pred in perturb(gold).items():
            pairs.append((db_id, kind, pred, gold))
    return pairs


def _project_label(sandbox: Sandbox, db_id: str, pred: str, gold: str) -> bool:
    """EX as an episode scores it: the prediction runs as a QUERY would (a QUERY the sandbox refuses is never an
    episode's last successful one: then EX runs the official text itself), then `execution_match`."""
    try:
        stored = sandbox.execute(db_id, pred)
    except SandboxError:
        stored = None
    return execution_match(sandbox, db_id, pred, gold, stored)


def test_ex_equals_the_official_label_on_spider_dev_perturbations(dev_pairs, spider_source):
    sandbox = Sandbox(spider_source / "database")
    labels: Counter = Counter()
    disagreements = []
    official_s = project_s = 0.0
    try:
        for db_id, kind, pred, gold in dev_pairs:
            start = time.perf_counter()
            official = official_label(spider_source / "database" / db_id / f"{db_id}.sqlite", pred, gold)
            official_s += time.perf_counter() - start
            start = time.perf_counter()
            ours = _project_label(sandbox, db_id, pred, gold)
            project_s += time.perf_counter() - start
            labels[kind, official] += 1
            if bool(official) != ours:
                disagreements.append((kind, db_id, pred, gold, official))
    finally:
        sandbox.close()
    report = "\n".join(f"  {kind:<17} {labels[kind, 1]:>5} match {labels[kind, 0]:>5} no match" for kind in KINDS)
    print(f"\n{len(dev_pairs)} pairs (official {official_s:.1f} s, project {project_s:.1f} s):\n{report}")
    assert not disagreements, f"{len(disagreements)} disagreements, e.g. {disagreements[:3]}"
    assert len(dev_pairs) >= 3000 and all(labels[kind, 0] + labels[kind, 1] >= 100 for kind in KINDS)
    # The pairs test both verdicts: the kinds that keep the denotation (the gold, its columns reversed, DISTINCT
    # added: the official rules drop DISTINCT from both) are matches, the others are mostly not.
    assert labels["identity", 0] == 0 and labels["DISTINCT added", 0] == 0
    for kind in ("ORDER BY dropped", "number changed", "LIMIT 1 added", "= to !="):
        assert labels[kind, 0] >= 20 and labels[kind, 1] >= 10, (kind, labels[kind, 0], labels[kind, 1])


def test_official_sql_equals_the_official_text_rules(dev_pairs):
    """`official_sql` against the official `postprocess` + `remove_distinct` (which parses with sqlparse's grouping)
    on every dev gold query, DISTINCT added to each, and texts where statements split or tokens hide DISTINCT."""
    import importlib

    parse = importlib.import_module(official_exec_eval().__package__ + ".parse")
    texts = [pred for _, kind, pred, _ in dev_pairs if kind in ("identity", "DISTINCT added")] + [
        "SELECT DISTINCT a FROM t; SELECT b FROM t", "SELECT a FROM t;  -- note\n", "SELECT a FROM t GO SELECT 2",
        "SELECT a AS GO FROM t", "select Distinct a, count(DISTINCT b) from t where c > = 1 and d ! = 'distinct'",
        'SELECT "distinct", `DISTINCT`, t.distinct FROM t /* distinct */', "SELECT CASE WHEN a THEN 1 END; SELECT 2",
    ]
    for text in texts:
        assert official_sql(text) == parse.remove_distinct(parse.postprocess(text)), text


VALUES = (0, 1, 1.0, 2, 2.0, -1, 1.5, "1", "1.5", "a", "A", "a ", None, b"x")


def _shuffled_columns(rng: random.Random, rows: list[tuple]) -> list[tuple]:
    order = list(range(len(rows[0]))) if rows else []
    rng.shuffle(order)
    return [tuple(row[j] for j in order) for row in rows]


def test_the_result_comparison_equals_result_eq_on_generated_results():
    """Random small results against the official `result_eq`: permuted columns and rows, one value changed,
    1 against 1.0 (where its quick rejection and its column search disagree), duplicated and wide columns."""
    result_eq = official_exec_eval().result_eq
    rng = random.Random(0)
    verdicts = Counter()
    for _ in range(10_000):
        width, n_rows = rng.randint(1, 7), rng.randint(0, 6)
        pool = VALUES[:rng.randint(2, len(VALUES))]
        gold = [tuple(rng.choice(pool) for _ in range(width)) for _ in range(n_rows)]
        if rng.random() < 0.3 and width > 2:  # duplicated columns: the search runs over groups of equal columns
            gold = [row[:-1] + (row[0],) for row in gold]
        pred = _shuffled_columns(rng, gold)
        if rng.random() < 0.5:
            rng.shuffle(pred)
        roll = rng.random()
        if roll < 0.3 and pred:
            i = rng.randrange(len(pred))
            row = list(pred[i])
            row[rng.randrange(width)] = rng.choice(VALUES)
            pred[i] = tuple(row)
        elif roll < 0.5:  # the same numbers as the other numeric type
            pred = [tuple(float(v) if type(v) is int else v for v in row) for row in pred]
        elif roll < 0.6:
            pred = pred[:-1]
        order_matters = rng.random() < 0.5
        official = bool(result_eq(gold, pred, order_matters=order_matters))
        verdicts[official] += 1
        assert results_match(pred, gold, order_matters) is official, (gold, pred, order_matters)
    assert verdicts[True] > 1500 and verdicts[False] > 1500
