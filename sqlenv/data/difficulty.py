"""Spider's hardness levels (easy / medium / hard / extra) computed from a sqlglot parse.

The rules are those of Spider 1.0's official `evaluation.py` (`Evaluator.eval_hardness`), applied to the
outermost SELECT (the left-most one of a set operation), exactly as Spider applies them to its own parse:

* component 1: WHERE, GROUP BY, ORDER BY, LIMIT present (1 each); one per joined table beyond the first;
  one per OR and one per LIKE among the FROM/WHERE/HAVING conditions;
* component 2: nested queries — subqueries used as condition values, plus an INTERSECT/UNION/EXCEPT;
* others: more than one aggregate; more than one SELECT column; more than one WHERE condition; more than
  one GROUP BY column.

Two quirks of the official code are kept on purpose so our labels match Spider's: a negated condition
(`NOT IN`, `NOT LIKE`, ...) in WHERE counts as an aggregate (it tests the condition's `not` flag where it
means the aggregate id), and in HAVING every AND/OR connector counts as one aggregate while the HAVING
aggregates themselves do not. Subqueries in FROM are neither joins nor nested queries (as in Spider).
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

HARDNESS_LEVELS = ("easy", "medium", "hard", "extra")


class HardnessError(ValueError):
    """The SQL could not be parsed as one SELECT statement."""


def _conditions(node: exp.Expression | None) -> tuple[list[exp.Expression], int]:
    """Split a boolean expression into Spider's condition units; return (units, number of ORs)."""
    units: list[exp.Expression] = []
    ors = 0
    stack = [node] if node is not None else []
    while stack:
        cur = stack.pop()
        while isinstance(cur, exp.Paren):
            cur = cur.this
        if isinstance(cur, exp.And):
            stack.extend([cur.expression, cur.this])
        elif isinstance(cur, exp.Or):
            ors += 1
            stack.extend([cur.expression, cur.this])
        else:
            units.append(cur)
    return units, ors


def _unwrap_not(cond: exp.Expression) -> tuple[bool, exp.Expression]:
    negated = False
    while isinstance(cond, exp.Not):
        negated = not negated
        cond = cond.this
        while isinstance(cond, exp.Paren):
            cond = cond.this
    if cond.args.get("negate"):  # sqlglot spells some NOT LIKE / NOT IN forms as a flag
        negated = True
    return negated, cond


def _is_like(cond: exp.Expression) -> bool:
    return isinstance(cond, (exp.Like, exp.ILike))


def _nested_in(cond: exp.Expression) -> int:
    """Subqueries used as a condition's values (`x IN (SELECT ..)`, `x > (SELECT ..)`)."""
    count = 0
    for key in ("this", "expression", "query", "low", "high"):
        value = cond.args.get(key)
        while isinstance(value, exp.Paren):
            value = value.this
        if isinstance(value, (exp.Subquery, exp.Select, exp.SetOperation)):
            count += 1
    if isinstance(cond, exp.Exists):
        count += 1
    return count


def _has_agg(node: exp.Expression) -> bool:
    """True when the expression holds an aggregate outside any subquery."""
    for sub in node.walk(bfs=True, prune=lambda n: isinstance(n, (exp.Subquery, exp.Select)) and n is not node):
        if isinstance(sub, exp.AggFunc):
            return True
    return False


def _agg_count(node: exp.Expression) -> int:
    count = 0
    for sub in node.walk(bfs=True, prune=lambda n: isinstance(n, (exp.Subquery, exp.Select)) and n is not node):
        if isinstance(sub, exp.AggFunc):
            count += 1
    return count


def _first_select(tree: exp.Expression) -> tuple[exp.Select, int]:
    """The left-most SELECT and the number of set operations directly hanging off it (0 or 1)."""
    set_ops = 0
    node = tree
    while isinstance(node, exp.Subquery):
        node = node.this
    if isinstance(node, exp.SetOperation):
        set_ops = 1
        while isinstance(node, (exp.SetOperation, exp.Subquery)):
            node = node.this
    if not isinstance(node, exp.Select):
        raise HardnessError(f"not a SELECT statement: {type(node).__name__}")
    return node, set_ops


def hardness_components(sql: str) -> dict[str, int]:
    """Spider's three counts (`component1`, `component2`, `others`) for one SQL query."""
    try:
        trees = [t for t in sqlglot.parse(sql, read="sqlite") if t is not None]
    except sqlglot.errors.ParseError as err:
        raise HardnessError(f"cannot parse SQL: {str(err).splitlines()[0]}") from None
    if len(trees) != 1:
        raise HardnessError(f"expected one SQL statement, got {len(trees)}")
    tree = trees[0]
    if isinstance(tree, exp.With) or tree.args.get("with_") or tree.args.get("with"):
        pass  # CTEs are not in Spider's grammar; score the main query
    select, set_ops = _first_select(tree)

    where = select.args.get("where")
    having = select.args.get("having")
    group = select.args.get("group")
    order = select.args.get("order")
    limit = select.args.get("limit")
    joins = select.args.get("joins") or []

    where_units, where_ors = _conditions(where.this if where else None)
    having_units, having_ors = _conditions(having.this if having else None)
    join_units: list[exp.Expression] = []
    join_ors = 0
    for join in joins:
        units, ors = _conditions(join.args.get("on"))
        join_units += units
        join_ors += ors

    # component 1
    comp1 = 0
    comp1 += 1 if where_units else 0
    comp1 += 1 if group else 0
    comp1 += 1 if order else 0
    comp1 += 1 if limit else 0
    comp1 += len(joins)
    comp1 += where_ors + having_ors + join_ors
    comp1 += sum(1 for c in join_units + where_units + having_units if _is_like(_unwrap_not(c)[1]))

    # component 2
    comp2 = set_ops
    comp2 += sum(_nested_in(_unwrap_not(c)[1]) for c in join_units + where_units + having_units)

    # others
    aggs = sum(1 for e in select.expressions if _has_agg(e.unalias() if isinstance(e, exp.Alias) else e))
    aggs += sum(1 for c in where_units if _unwrap_not(c)[0])  # Spider's quirk: the NOT flag read as an agg
    group_exprs = group.expressions if group else []
    aggs += sum(1 for g in group_exprs if _has_agg(g))
    if order:
        aggs += sum(_agg_count(o.this) for o in order.expressions)
    # Spider's quirk: counts the AND/OR connectors of HAVING (and negated HAVING conditions)
    aggs += max(len(having_units) - 1, 0) + sum(1 for c in having_units if _unwrap_not(c)[0])
    others = 0
    others += 1 if aggs > 1 else 0
    others += 1 if len(select.expressions) > 1 else 0
    others += 1 if len(where_units) > 1 else 0
    others += 1 if len(group_exprs) > 1 else 0
    return {"component1": comp1, "component2": comp2, "others": others}


def spider_hardness(sql: str) -> str:
    """Spider's hardness level of `sql`: "easy", "medium", "hard" or "extra".

    Raises `HardnessError` (a ValueError) when the SQL does not parse as one SELECT statement.
    """
    c = hardness_components(sql)
    c1, c2, o = c["component1"], c["component2"], c["others"]
    if c1 <= 1 and o == 0 and c2 == 0:
        return "easy"
    if (o <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and o < 2 and c2 == 0):
        return "medium"
    if (o > 2 and c1 <= 2 and c2 == 0) or (2 < c1 <= 3 and o <= 2 and c2 == 0) or (c1 <= 1 and o == 0 and c2 <= 1):
        return "hard"
    return "extra"
