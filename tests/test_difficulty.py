"""Spider hardness from a sqlglot parse, checked on known queries and against Spider's own rules applied
to Spider's own parse (the `sql` field of dev.json)."""

from __future__ import annotations

import json

import pytest

from sqlenv.data.difficulty import HardnessError, hardness_components, spider_hardness

KNOWN = [
    # (sql, hardness) — examples from Spider's dev set and its evaluation README categories
    ("SELECT count(*) FROM singer", "easy"),
    ("SELECT name FROM singer WHERE age > 30", "easy"),
    ("SELECT name , country , age FROM singer ORDER BY age DESC", "medium"),
    ("SELECT avg(age) , min(age) , max(age) FROM singer WHERE country = 'France'", "medium"),
    ("SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id WHERE T1.year = 2014", "medium"),
    ("SELECT song_name FROM singer WHERE age > (SELECT avg(age) FROM singer)", "hard"),
    ("SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)", "hard"),
    ("SELECT country FROM singer WHERE age > 40 INTERSECT SELECT country FROM singer WHERE age < 30", "hard"),
    ("SELECT T2.name , count(*) FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id GROUP BY T1.stadium_id", "medium"),
    ("SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id GROUP BY T1.stadium_id ORDER BY count(*) DESC LIMIT 1", "extra"),
    ("SELECT name FROM singer WHERE country = 'France' AND age > (SELECT avg(age) FROM singer)", "extra"),
    ("SELECT name FROM people WHERE name LIKE '%a%' OR name LIKE '%e%'", "extra"),  # where+or+2 likes = 4
]


@pytest.mark.parametrize("sql,level", KNOWN)
def test_known_queries(sql, level):
    assert spider_hardness(sql) == level


def test_components_count_each_rule():
    c = hardness_components(
        "SELECT a, count(*) FROM t JOIN u ON t.id = u.id WHERE x = 1 OR y LIKE 'z%' GROUP BY a, b ORDER BY count(*) LIMIT 3"
    )
    # where, group, order, limit, 1 join, 1 OR, 1 LIKE
    assert c["component1"] == 7
    assert c["component2"] == 0
    # >1 aggregate (select + order), >1 select column, >1 where condition, >1 group column
    assert c["others"] == 4
    nested = hardness_components("SELECT a FROM t WHERE b IN (SELECT b FROM u) UNION SELECT a FROM v")
    assert nested["component2"] == 2


@pytest.mark.parametrize("bad", ["", "SELEC nonsense FROM", "SELECT 1; SELECT 2", "DELETE FROM t"])
def test_bad_sql_raises_value_error(bad):
    with pytest.raises(HardnessError):
        spider_hardness(bad)
    assert issubclass(HardnessError, ValueError)


# ---- Spider's evaluation.py rules on Spider's own parse (reference implementation for the check) ----

_LIKE = 9  # index of 'like' in Spider's WHERE_OPS


def _count_agg(units):
    return len([u for u in units if u[0] != 0])


def _official(sql: dict) -> str:
    conds = sql["from"]["conds"][::2] + sql["where"][::2] + sql["having"][::2]
    c1 = (len(sql["where"]) > 0) + (len(sql["groupBy"]) > 0) + (len(sql["orderBy"]) > 0) + (sql["limit"] is not None)
    c1 += max(len(sql["from"]["table_units"]) - 1, 0)
    c1 += len([t for t in sql["from"]["conds"][1::2] + sql["where"][1::2] + sql["having"][1::2] if t == "or"])
    c1 += len([c for c in conds if c[1] == _LIKE])
    c2 = sum((type(c[3]) is dict) + (type(c[4]) is dict) for c in conds)
    c2 += sum(sql[k] is not None for k in ("intersect", "except", "union"))
    agg = _count_agg(sql["select"][1]) + _count_agg(sql["where"][::2]) + _count_agg(sql["groupBy"])
    if sql["orderBy"]:
        agg += _count_agg([u[1] for u in sql["orderBy"][1] if u[1]] + [u[2] for u in sql["orderBy"][1] if u[2]])
    agg += _count_agg(sql["having"])
    o = (agg > 1) + (len(sql["select"][1]) > 1) + (len(sql["where"]) > 1) + (len(sql["groupBy"]) > 1)
    if c1 <= 1 and o == 0 and c2 == 0:
        return "easy"
    if (o <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and o < 2 and c2 == 0):
        return "medium"
    if (o > 2 and c1 <= 2 and c2 == 0) or (2 < c1 <= 3 and o <= 2 and c2 == 0) or (c1 <= 1 and o == 0 and c2 <= 1):
        return "hard"
    return "extra"


def test_matches_spider_official_rules_on_dev(spider_source):
    dev = json.loads((spider_source / "dev.json").read_text())
    mismatches = [(d["query"], _official(d["sql"]), spider_hardness(d["query"])) for d in dev
                  if spider_hardness(d["query"]) != _official(d["sql"])]
    assert len(dev) > 1000
    assert mismatches == []
    levels = {_official(d["sql"]) for d in dev}
    assert levels == {"easy", "medium", "hard", "extra"}
