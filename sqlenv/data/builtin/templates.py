"""Question templates: each maps one question shape to one SQL shape, with several paraphrases.

Templates are generic over the schema roles (see `schemas.py`), so every database gets the same question
shapes — which is what lets a small model learn the mapping and carry it to a database it never saw.
The literal values a question mentions appear verbatim in its SQL ("with genre Jazz" → `genre = 'Jazz'`).
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from typing import Callable, Iterator

from sqlenv.data.builtin.schemas import Col, Database, Table


@dataclass
class Candidate:
    template: str  # template id
    group: str  # template id + the tables/columns it was instantiated on (the unit the split stratifies)
    key: str  # group + parameter values: one question instance
    sql: str
    texts: list[str]  # paraphrases; the builder picks one
    tie_sql: str | None = None  # ORDER BY .. LIMIT k: the sort keys of the first k+1 rows, to reject ties
    limit: int = 0
    meta: dict = field(default_factory=dict)


AGG_WORDS = {"max": "maximum", "min": "minimum", "avg": "average", "sum": "total"}


def plural(word: str) -> str:
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    return word + "s"


def q(value: object) -> str:
    """SQL literal for a value, spelled exactly as the question spells it."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def agg_sql(agg: str, expr: str) -> str:
    # Averages are rounded so answers stay short; the verifier allows 1% anyway.
    return f"ROUND(AVG({expr}), 2)" if agg == "avg" else f"{agg.upper()}({expr})"


#: How many parameter values each template group samples, as a multiple of the template's base count (5 when
#: a template names none). Many instances per SQL shape, with values that differ, are what make a small model
#: copy the value from the question instead of recalling one it saw with that shape (measured with the tiny
#: model, 4000 SFT steps: x1 gives 71% train / 31% eval greedy success, x4 gives 64% / 52%, and 66% / 58%
#: with the copy-friendly tokenizer of `training/models/tokenizer.py`).
VALUES_SCALE = 4


class Ctx:
    """A built database plus the seeded rng templates sample parameters with."""

    def __init__(self, db: Database, conn: sqlite3.Connection, rng: random.Random, cap: int = 5,
                 scale: int = VALUES_SCALE):
        self.db, self.conn, self.rng, self.cap, self.scale = db, conn, rng, cap, scale

    def values(self, table: str, col: str) -> list:
        rows = self.conn.execute(f"SELECT DISTINCT {col} FROM {table} WHERE {col} IS NOT NULL ORDER BY {col}")
        return [r[0] for r in rows]

    def pick(self, items: list, k: int | None = None) -> list:
        """A seeded sample of `scale` x `k` (default `cap`) of `items` (all of them when there are fewer)."""
        k = (self.cap if k is None else k) * self.scale
        items = list(items)
        self.rng.shuffle(items)
        return items[:k]

    def thresholds(self, table: str, col: Col, k: int = 3) -> list:
        """Values near the top and bottom of a numeric column (rounded like the column).

        A few fixed percentiles, not any number in range: the tiny model copies a multi-digit number from the
        question less reliably than a word (each such token is rare). Measured after 4000 SFT steps: 57.5% and
        62% eval success (two runs) with percentiles, 48.5% with thresholds drawn uniformly in range.
        """
        vals = sorted(v for v in (r[0] for r in self.conn.execute(f"SELECT {col.name} FROM {table}")) if v is not None)
        out = []
        for frac in (0.1, 0.2, 0.3, 0.7, 0.8, 0.9):
            v = vals[int(frac * (len(vals) - 1))]
            out.append(round(v, 1) if col.sqltype == "REAL" else int(v))
        return self.pick(sorted(set(out)), k)

    def pname(self, t: Table) -> str:
        return t.name_col.words


def _order_tie_sql(select_key: str, rest: str, limit: int) -> str:
    return f"SELECT {select_key} {rest} LIMIT {limit + 1}"


# ---- single-table templates -------------------------------------------------------------------------


def single_table(ctx: Ctx) -> Iterator[Candidate]:
    rng = ctx.rng
    for t in ctx.db.tables:
        P, N = t.plural, t.noun
        cats, nums, name = t.col("cat"), t.col("num"), t.name_col
        g = f"{t.name}"

        yield Candidate("count_all", f"count_all:{g}", f"count_all:{g}", f"SELECT count(*) FROM {t.name}", [
            f"How many {P} are there?", f"Count the {P}.", f"What is the total number of {P}?",
            f"How many {P} are in the database?"])

        for c in cats:
            vals = ctx.values(t.name, c.name)
            for v in ctx.pick(vals):
                yield Candidate("count_cat", f"count_cat:{g}.{c.name}", f"count_cat:{g}.{c.name}={v}",
                                f"SELECT count(*) FROM {t.name} WHERE {c.name} = {q(v)}", [
                    f"How many {P} have {c.words} {v}?", f"Count the {P} whose {c.words} is {v}.",
                    f"What is the number of {P} with {c.words} {v}?", f"How many {P} with {c.words} {v} are there?"])
            if name:
                for v in ctx.pick(vals):
                    nm = ctx.pname(t)
                    yield Candidate("names_cat", f"names_cat:{g}.{c.name}", f"names_cat:{g}.{c.name}={v}",
                                    f"SELECT {name.name} FROM {t.name} WHERE {c.name} = {q(v)}", [
                        f"List the {plural(nm)} of the {P} with {c.words} {v}.",
                        f"Which {P} have {c.words} {v}? Give their {plural(nm)}.",
                        f"Show the {plural(nm)} of {P} whose {c.words} is {v}.",
                        f"What are the {plural(nm)} of the {P} with {c.words} {v}?"])
            yield Candidate("count_per_cat", f"count_per_cat:{g}.{c.name}", f"count_per_cat:{g}.{c.name}",
                            f"SELECT {c.name}, count(*) FROM {t.name} GROUP BY {c.name}", [
                f"How many {P} are there for each {c.words}?", f"Count the {P} per {c.words}.",
                f"For each {c.words}, give the number of {P}.", f"Show each {c.words} with its number of {P}."])
            yield Candidate("count_distinct", f"count_distinct:{g}.{c.name}", f"count_distinct:{g}.{c.name}",
                            f"SELECT count(DISTINCT {c.name}) FROM {t.name}", [
                f"How many different {c.words} values do the {P} have?",
                f"Count the distinct {c.words} values among {P}.",
                f"How many distinct {c.words} values appear in the {t.name} table?"])
            for most in (True, False):
                word = "most" if most else "fewest"
                yield Candidate(f"{word}_cat", f"{word}_cat:{g}.{c.name}", f"{word}_cat:{g}.{c.name}",
                                f"SELECT {c.name} FROM {t.name} GROUP BY {c.name} ORDER BY count(*) {'DESC' if most else 'ASC'} LIMIT 1", [
                    f"Which {c.words} has the {word} {P}?",
                    f"What is the {'most' if most else 'least'} common {c.words} among {P}?",
                    f"Which {c.words} is shared by the {'largest' if most else 'smallest'} number of {P}?"],
                    tie_sql=f"SELECT count(*) FROM {t.name} GROUP BY {c.name} ORDER BY count(*) {'DESC' if most else 'ASC'} LIMIT 2",
                    limit=1)
            for k in ctx.pick([2, 3, 5, 8, 10, 15], 3):
                yield Candidate("cat_having", f"cat_having:{g}.{c.name}", f"cat_having:{g}.{c.name}>{k}",
                                f"SELECT {c.name} FROM {t.name} GROUP BY {c.name} HAVING count(*) > {k}", [
                    f"Which {c.words} values have more than {k} {P}?",
                    f"List the {c.words} values with more than {k} {P}.",
                    f"Show every {c.words} that has over {k} {P}."])
            if len(vals) >= 2:
                pairs = [(a, b) for a in vals for b in vals if a < b]
                for a, b in ctx.pick(pairs, 3):
                    yield Candidate("count_or", f"count_or:{g}.{c.name}", f"count_or:{g}.{c.name}={a}|{b}",
                                    f"SELECT count(*) FROM {t.name} WHERE {c.name} = {q(a)} OR {c.name} = {q(b)}", [
                        f"How many {P} have {c.words} {a} or {b}?",
                        f"Count the {P} whose {c.words} is either {a} or {b}.",
                        f"What is the number of {P} with {c.words} {a} or {c.words} {b}?"])

        for n in nums:
            for agg in ctx.pick(["max", "min", "avg", "sum"] if n.sqltype == "INTEGER" else ["max", "min", "avg"], 3):
                w = AGG_WORDS[agg]
                yield Candidate("agg", f"agg:{g}.{n.name}", f"agg:{g}.{n.name}:{agg}",
                                f"SELECT {agg_sql(agg, n.name)} FROM {t.name}", [
                    f"What is the {w} {n.words} of all {P}?", f"Find the {w} {n.words} among {P}.",
                    f"Across all {P}, what is the {w} {n.words}?"])
            for c in cats:
                agg = rng.choice(["max", "min", "avg"])  # one per column pair: instances differ by value
                w = AGG_WORDS[agg]
                for v in ctx.pick(ctx.values(t.name, c.name), 3):
                    yield Candidate("agg_cat", f"agg_cat:{g}.{n.name}.{c.name}", f"agg_cat:{g}.{n.name}.{c.name}={v}:{agg}",
                                    f"SELECT {agg_sql(agg, n.name)} FROM {t.name} WHERE {c.name} = {q(v)}", [
                        f"What is the {w} {n.words} of {P} with {c.words} {v}?",
                        f"Among {P} with {c.words} {v}, what is the {w} {n.words}?",
                        f"Find the {w} {n.words} for {P} whose {c.words} is {v}."])
                yield Candidate("avg_per_cat", f"avg_per_cat:{g}.{n.name}.{c.name}", f"avg_per_cat:{g}.{n.name}.{c.name}",
                                f"SELECT {c.name}, ROUND(AVG({n.name}), 2) FROM {t.name} GROUP BY {c.name}", [
                    f"What is the average {n.words} for each {c.words}?",
                    f"For each {c.words}, show the average {n.words} of {P}.",
                    f"Give the average {n.words} of {P} per {c.words}."])
                for v in ctx.pick(ctx.values(t.name, c.name), 3):
                    for x in ctx.thresholds(t.name, n, 1):
                        yield Candidate("count_cat_num", f"count_cat_num:{g}.{c.name}.{n.name}",
                                        f"count_cat_num:{g}.{c.name}={v}.{n.name}>{x}",
                                        f"SELECT count(*) FROM {t.name} WHERE {c.name} = {q(v)} AND {n.name} > {x}", [
                            f"How many {P} have {c.words} {v} and {n.words} greater than {x}?",
                            f"Count the {P} with {c.words} {v} whose {n.words} is above {x}.",
                            f"What is the number of {P} with {c.words} {v} and {n.words} over {x}?"])
                if name:
                    for v in ctx.pick(ctx.values(t.name, c.name), 3):
                        nm = ctx.pname(t)
                        yield Candidate("names_cat_above_avg", f"names_cat_above_avg:{g}.{c.name}.{n.name}",
                                        f"names_cat_above_avg:{g}.{c.name}={v}.{n.name}",
                                        f"SELECT {name.name} FROM {t.name} WHERE {c.name} = {q(v)} AND {n.name} > (SELECT avg({n.name}) FROM {t.name})", [
                            f"List the {plural(nm)} of {P} with {c.words} {v} whose {n.words} is above average.",
                            f"Which {P} with {c.words} {v} have an above-average {n.words}? Give their {plural(nm)}.",
                            f"Show the {plural(nm)} of {P} with {c.words} {v} and {n.words} above the average."])
            for op, words in ((">", ("greater than", "above", "over")), ("<", ("less than", "below", "under"))):
                for x in ctx.thresholds(t.name, n, 3):
                    yield Candidate("count_num", f"count_num:{g}.{n.name}", f"count_num:{g}.{n.name}{op}{x}",
                                    f"SELECT count(*) FROM {t.name} WHERE {n.name} {op} {x}", [
                        f"How many {P} have {n.words} {words[0]} {x}?", f"Count the {P} whose {n.words} is {words[1]} {x}.",
                        f"What is the number of {P} with {n.words} {words[2]} {x}?"])
                if name:
                    nm = ctx.pname(t)
                    for x in ctx.thresholds(t.name, n, 3):
                        yield Candidate("names_num", f"names_num:{g}.{n.name}", f"names_num:{g}.{n.name}{op}{x}",
                                        f"SELECT {name.name} FROM {t.name} WHERE {n.name} {op} {x}", [
                            f"List the {plural(nm)} of {P} with {n.words} {words[0]} {x}.",
                            f"Which {P} have {n.words} {words[1]} {x}? Give their {plural(nm)}.",
                            f"Show the {plural(nm)} of the {P} whose {n.words} is {words[2]} {x}."])
            yield Candidate("count_above_avg", f"count_above_avg:{g}.{n.name}", f"count_above_avg:{g}.{n.name}",
                            f"SELECT count(*) FROM {t.name} WHERE {n.name} > (SELECT avg({n.name}) FROM {t.name})", [
                f"How many {P} have {n.words} above the average?",
                f"Count the {P} whose {n.words} is greater than the average {n.words}.",
                f"What is the number of {P} with an above-average {n.words}?"])
            yield Candidate("minmax", f"minmax:{g}.{n.name}", f"minmax:{g}.{n.name}",
                            f"SELECT min({n.name}), max({n.name}) FROM {t.name}", [
                f"What are the minimum and maximum {n.words} of {P}?",
                f"Give the lowest and highest {n.words} among {P}.",
                f"Show the minimum and maximum {n.words} across all {P}."])
            if name:
                nm = ctx.pname(t)
                for desc in (True, False):
                    hi, big = ("highest", "largest") if desc else ("lowest", "smallest")
                    order = "DESC" if desc else "ASC"
                    rest = f"FROM {t.name} ORDER BY {n.name} {order}"
                    yield Candidate("argmax" if desc else "argmin", f"arg{order}:{g}.{n.name}", f"arg{order}:{g}.{n.name}",
                                    f"SELECT {name.name} {rest} LIMIT 1", [
                        f"Which {N} has the {hi} {n.words}?", f"Give the {nm} of the {N} with the {big} {n.words}.",
                        f"What is the {nm} of the {N} with the {hi} {n.words}?"],
                        tie_sql=_order_tie_sql(n.name, rest, 1), limit=1)
                    for k in ctx.pick([2, 3, 4, 5], 2):
                        yield Candidate("topk", f"top{order}:{g}.{n.name}", f"top{order}:{g}.{n.name}:{k}",
                                        f"SELECT {name.name} {rest} LIMIT {k}", [
                            f"List the {plural(nm)} of the {k} {P} with the {hi} {n.words}.",
                            f"Which {k} {P} have the {big} {n.words}?",
                            f"Show the {k} {P} with the {hi} {n.words}."],
                            tie_sql=_order_tie_sql(n.name, rest, k), limit=k)
                for a in cats + nums:
                    for X in ctx.pick(ctx.values(t.name, name.name), 3):
                        yield Candidate("lookup", f"lookup:{g}", f"lookup:{g}:{X}.{a.name}",
                                        f"SELECT {a.name} FROM {t.name} WHERE {name.name} = {q(X)}", [
                            f"What is the {a.words} of the {N} {X}?", f"Give the {a.words} of {N} {X}.",
                            f"Which {a.words} does the {N} {X} have?", f"Tell me the {a.words} of {N} {X}."])


# ---- joins over one foreign key ---------------------------------------------------------------------


def relations(ctx: Ctx) -> Iterator[Candidate]:
    db = ctx.db
    for r in db.rels:
        C, Pt = db.table(r.child), db.table(r.parent)
        pname = Pt.name_col
        if pname is None:
            continue
        ambiguous = sum(1 for o in db.rels if o.child == r.child and o.parent == r.parent) > 1
        CP, PN, PP = C.plural, Pt.noun, Pt.plural
        CPv = f"{CP} {r.verb} it" if ambiguous else CP  # "flights departing from it" vs "albums"
        CPv_them = f"{CP} {r.verb} them" if ambiguous else CP
        on = f"{C.name} JOIN {Pt.name} ON {C.name}.{r.fk} = {Pt.name}.{Pt.pk.name}"
        g = f"{r.child}.{r.fk}"
        parents = ctx.values(Pt.name, pname.name)
        pn = pname.name

        for X in ctx.pick(parents):
            yield Candidate("join_count", f"join_count:{g}", f"join_count:{g}={X}",
                            f"SELECT count(*) FROM {on} WHERE {Pt.name}.{pn} = {q(X)}", [
                f"How many {CP} are {r.verb} {PN} {X}?", f"Count the {CP} {r.verb} {PN} {X}.",
                f"What is the number of {CP} {r.verb} the {PN} {X}?"])
        cname = C.name_col
        if cname:
            cn = cname.name
            cw = plural(cname.words)
            for X in ctx.pick(parents):
                yield Candidate("join_names", f"join_names:{g}", f"join_names:{g}={X}",
                                f"SELECT {C.name}.{cn} FROM {on} WHERE {Pt.name}.{pn} = {q(X)}", [
                    f"List the {cw} of {CP} {r.verb} {PN} {X}.",
                    f"Which {CP} are {r.verb} {PN} {X}? Give their {cw}.",
                    f"Show the {cw} of all {CP} {r.verb} {PN} {X}."])
            for Y in ctx.pick(ctx.values(C.name, cn), 4):
                yield Candidate("join_parent", f"join_parent:{g}", f"join_parent:{g}={Y}",
                                f"SELECT {Pt.name}.{pn} FROM {on} WHERE {C.name}.{cn} = {q(Y)}", [
                    f"Which {PN} is the {C.noun} {Y} {r.verb}?",
                    f"Name the {PN} that the {C.noun} {Y} is {r.verb}.",
                    f"The {C.noun} {Y} is {r.verb} which {PN}?"])
            for n in C.col("num"):
                for X in ctx.pick(parents, 4):
                    rest = f"FROM {on} WHERE {Pt.name}.{pn} = {q(X)} ORDER BY {C.name}.{n.name} DESC"
                    yield Candidate("join_argmax", f"join_argmax:{g}.{n.name}", f"join_argmax:{g}.{n.name}={X}",
                                    f"SELECT {C.name}.{cn} {rest} LIMIT 1", [
                        f"Which {C.noun} {r.verb} {PN} {X} has the highest {n.words}?",
                        f"Among the {CP} {r.verb} {PN} {X}, which one has the largest {n.words}?",
                        f"Give the {cname.words} of the {C.noun} {r.verb} {PN} {X} with the highest {n.words}."],
                        tie_sql=_order_tie_sql(f"{C.name}.{n.name}", rest, 1), limit=1)
                for X in ctx.pick(parents, 3):
                    yield Candidate("join_sorted", f"join_sorted:{g}.{n.name}", f"join_sorted:{g}.{n.name}={X}",
                                    f"SELECT {C.name}.{cn} FROM {on} WHERE {Pt.name}.{pn} = {q(X)} ORDER BY {C.name}.{n.name}", [
                        f"List the {cw} of {CP} {r.verb} {PN} {X}, sorted by {n.words}.",
                        f"Sort the {CP} {r.verb} {PN} {X} by {n.words} and give their {cw}.",
                        f"Show the {cw} of {CP} {r.verb} {PN} {X} in order of {n.words}."])
        for n in C.col("num"):
            agg = ctx.rng.choice(["max", "min", "avg", "sum"] if n.sqltype == "INTEGER" else ["max", "min", "avg"])
            w = AGG_WORDS[agg]
            for X in ctx.pick(parents, 3):
                yield Candidate("join_agg", f"join_agg:{g}.{n.name}", f"join_agg:{g}.{n.name}={X}:{agg}",
                                f"SELECT {agg_sql(agg, C.name + '.' + n.name)} FROM {on} WHERE {Pt.name}.{pn} = {q(X)}", [
                    f"What is the {w} {n.words} of {CP} {r.verb} {PN} {X}?",
                    f"Among {CP} {r.verb} {PN} {X}, what is the {w} {n.words}?",
                    f"Find the {w} {n.words} of the {CP} {r.verb} {PN} {X}."])
            for X in ctx.pick(parents, 3):
                for x in ctx.thresholds(C.name, n, 1):
                    yield Candidate("join_count_num", f"join_count_num:{g}.{n.name}", f"join_count_num:{g}.{n.name}={X}>{x}",
                                    f"SELECT count(*) FROM {on} WHERE {Pt.name}.{pn} = {q(X)} AND {C.name}.{n.name} > {x}", [
                        f"How many {CP} {r.verb} {PN} {X} have {n.words} greater than {x}?",
                        f"Count the {CP} {r.verb} {PN} {X} whose {n.words} is above {x}.",
                        f"What is the number of {CP} {r.verb} {PN} {X} with {n.words} over {x}?"])
        for pc in Pt.col("cat"):
            vals = ctx.values(Pt.name, pc.name)
            for v in ctx.pick(vals, 3):
                yield Candidate("nested_count", f"nested_count:{g}.{pc.name}", f"nested_count:{g}.{pc.name}={v}",
                                f"SELECT count(*) FROM {C.name} WHERE {r.fk} IN (SELECT {Pt.pk.name} FROM {Pt.name} WHERE {pc.name} = {q(v)})", [
                    f"How many {CP} are {r.verb} {PP} with {pc.words} {v}?",
                    f"Count the {CP} {r.verb} {PP} whose {pc.words} is {v}.",
                    f"What is the number of {CP} {r.verb} {PP} with {pc.words} {v}?"])
            yield Candidate("join_count_per_cat", f"join_count_per_cat:{g}.{pc.name}", f"join_count_per_cat:{g}.{pc.name}",
                            f"SELECT {Pt.name}.{pc.name}, count(*) FROM {on} GROUP BY {Pt.name}.{pc.name}", [
                f"For each {PN} {pc.words}, how many {CP} are there?",
                f"Count the {CP} per {PN} {pc.words}.",
                f"How many {CP} are {r.verb} {PP} of each {pc.words}?"])
            for v in ctx.pick(vals, 3):
                yield Candidate("join_group_where", f"join_group_where:{g}.{pc.name}", f"join_group_where:{g}.{pc.name}={v}",
                                f"SELECT {Pt.name}.{pn}, count(*) FROM {on} WHERE {Pt.name}.{pc.name} = {q(v)} GROUP BY {Pt.name}.{pn}", [
                    f"How many {CPv} does each {PN} with {pc.words} {v} have?",
                    f"For every {PN} whose {pc.words} is {v}, count its {CPv}.",
                    f"Show each {PN} with {pc.words} {v} and its number of {CPv}."])
        rest = f"FROM {on} GROUP BY {Pt.name}.{pn} ORDER BY count(*) DESC"
        yield Candidate("parent_most", f"parent_most:{g}", f"parent_most:{g}", f"SELECT {Pt.name}.{pn} {rest} LIMIT 1", [
            f"Which {PN} has the most {CPv}?", f"Name the {PN} with the highest number of {CPv}.",
            f"Find the {PN} that has the most {CPv}."],
            tie_sql=_order_tie_sql("count(*)", rest, 1), limit=1)
        for k in ctx.pick([1, 2, 3, 4, 5, 8, 10], 3):
            yield Candidate("parent_having", f"parent_having:{g}", f"parent_having:{g}>{k}",
                            f"SELECT {Pt.name}.{pn} FROM {on} GROUP BY {Pt.name}.{pn} HAVING count(*) > {k}", [
                f"Which {PP} have more than {k} {CPv_them}? List their {plural(pname.words)}.",
                f"List the {plural(pname.words)} of {PP} with more than {k} {CPv_them}.",
                f"Show the {PP} that have over {k} {CPv_them}."])
        yield Candidate("parent_none_count", f"parent_none_count:{g}", f"parent_none_count:{g}",
                        f"SELECT count(*) FROM {Pt.name} WHERE {Pt.pk.name} NOT IN (SELECT {r.fk} FROM {C.name})", [
            f"How many {PP} have no {CPv_them}?", f"Count the {PP} without any {CPv_them}.",
            f"What is the number of {PP} that have no {CPv_them}?"])
        yield Candidate("parent_none_names", f"parent_none_names:{g}", f"parent_none_names:{g}",
                        f"SELECT {pn} FROM {Pt.name} WHERE {Pt.pk.name} NOT IN (SELECT {r.fk} FROM {C.name})", [
            f"Which {PP} have no {CPv_them}? List their {plural(pname.words)}.",
            f"List the {plural(pname.words)} of {PP} without any {CPv_them}.",
            f"Show the {PP} that have no {CPv_them}."])


# ---- joins over two foreign keys --------------------------------------------------------------------


def paths(ctx: Ctx) -> Iterator[Candidate]:
    db = ctx.db
    for p in db.paths:
        C, M, Pt = db.table(p.child), db.table(p.mid), db.table(p.parent)
        on = (f"{C.name} JOIN {M.name} ON {C.name}.{p.fk} = {M.name}.{M.pk.name} "
              f"JOIN {Pt.name} ON {M.name}.{p.mid_fk} = {Pt.name}.{Pt.pk.name}")
        g = f"{p.child}.{p.parent}"
        pn = Pt.name_col.name
        parents = ctx.values(Pt.name, pn)
        for X in ctx.pick(parents):
            yield Candidate("path_count", f"path_count:{g}", f"path_count:{g}={X}",
                            f"SELECT count(*) FROM {on} WHERE {Pt.name}.{pn} = {q(X)}", [
                f"How many {C.plural} are {p.verb} {Pt.noun} {X}?", f"Count the {C.plural} {p.verb} {Pt.noun} {X}.",
                f"What is the number of {C.plural} {p.verb} the {Pt.noun} {X}?"])
        for n in C.col("num"):
            agg = ctx.rng.choice(["max", "min", "avg", "sum"])
            w = AGG_WORDS[agg]
            for X in ctx.pick(parents, 3):
                yield Candidate("path_agg", f"path_agg:{g}.{n.name}", f"path_agg:{g}.{n.name}={X}:{agg}",
                                f"SELECT {agg_sql(agg, C.name + '.' + n.name)} FROM {on} WHERE {Pt.name}.{pn} = {q(X)}", [
                    f"What is the {w} {n.words} of {C.plural} {p.verb} {Pt.noun} {X}?",
                    f"Among {C.plural} {p.verb} {Pt.noun} {X}, what is the {w} {n.words}?",
                    f"Find the {w} {n.words} of the {C.plural} {p.verb} {Pt.noun} {X}."])


TEMPLATE_FAMILIES: list[Callable[[Ctx], Iterator[Candidate]]] = [single_table, relations, paths]


def candidates(ctx: Ctx) -> list[Candidate]:
    out: list[Candidate] = []
    for family in TEMPLATE_FAMILIES:
        out.extend(family(ctx))
    return out
