"""Policies that play `SQLEnvironment` episodes: a seeded random agent, a gold-reading oracle, the two mistakes an
untrained agent makes (answering without looking; querying with a wrong filter or column), and the oracle that
fixes a broken query from its error.

A policy is anything with a `name` attribute and two methods (the `Policy` protocol):

- `reset(env, observation)` is called once after `env.reset()`, with the first observation;
- `act(env, observation) -> SQLAction` is called until the episode is done.

The trained-model policy in `training/generation/model_policy.py` implements the same protocol, so `sqlenv.evaluate`
plays all of them the same way. The random policy is the floor a learner must beat (≈0% success, under 0.3
reward); the oracle is the ceiling and the calibration check of the reward layers (≈1.1–1.3 per episode).

`GuessPolicy` and `WrongQueryPolicy` are the imperfect teacher's mistakes (`MISTAKES`): the SFT warm-start mixes
a share of their episodes into the oracle's (`training.warm_start`), so the warm-started model samples careless as well
as careful behaviour and GRPO, rewarded by the verifier, has something to learn: that exploring before
answering pays. `QueryFixPolicy` (`query_fix`) shows the use of the environment's feedback instead: a query that
fails, its error, and the fixed query (its broken turn is left out of the warm start's loss).
"""

from __future__ import annotations

import random
import re
import string
from typing import Any, Callable, Protocol, runtime_checkable

from sqlenv.types import SQLAction, SQLObservation

__all__ = ["Policy", "RandomPolicy", "OraclePolicy", "GuessPolicy", "WrongQueryPolicy", "QueryFixPolicy", "MISTAKES",
           "table_names", "guess_from_question", "corrupt_sql"]


@runtime_checkable
class Policy(Protocol):
    """What `evaluate` needs from an agent."""

    name: str

    def reset(self, env: Any, observation: SQLObservation) -> None:
        """Start a new episode; `observation` is what `env.reset()` returned."""

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        """Choose the next action from the latest observation."""


# A table name as the schema text shows it: a bare identifier, optionally quoted.
_IDENT = r'"?([A-Za-z_][A-Za-z0-9_]*)"?'


def table_names(observation: SQLObservation | None, env: Any = None) -> list[str]:
    """The table names the agent may use, read from the observation's schema text.

    Falls back to the current question's `tables_involved` when the schema text cannot be parsed, so a
    format change in the environment degrades the random baseline instead of crashing it.
    """
    names: list[str] = []
    text = observation.schema_info if observation is not None else ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        # "Tables: a, b, c" (one line) or one table per line ("- a", "a", "a (3 columns)", "Table a:").
        if ":" in stripped and stripped.split(":", 1)[0].strip().lower() in {"tables", "table names", "available tables"}:
            for part in stripped.split(":", 1)[1].split(","):
                m = re.match(_IDENT, part.strip())
                if m:
                    names.append(m.group(1))
            continue
        if line[:1].isspace():  # indented lines are columns of a described table
            continue
        m = re.match(r"^(?:[-*•]\s*)?(?:table\s+)?" + _IDENT + r"\s*(?:[:(].*)?$", stripped, re.IGNORECASE)
        if m and m.group(1).lower() not in {"tables", "schema", "columns"}:
            names.append(m.group(1))
    seen: dict[str, str] = {}
    for name in names:
        seen.setdefault(name.lower(), name)
    if not seen and env is not None and getattr(env, "question", None) is not None:
        for name in env.question.tables_involved:
            seen.setdefault(name.lower(), name)
    return list(seen.values())


def _column_names(observation: SQLObservation, table: str) -> list[str]:
    """Columns of `table` if the agent has DESCRIBEd it (parsed loosely from the schema text)."""
    columns: list[str] = []
    inside = False
    for line in observation.schema_info.splitlines():
        if not line.strip():
            continue
        if not line[:1].isspace():
            head = re.match(r"^(?:[-*•]\s*)?(?:table\s+)?" + _IDENT, line.strip(), re.IGNORECASE)
            inside = bool(head) and head.group(1).lower() == table.lower()
            # "t(a, b, c)" on one line
            if inside and "(" in line:
                inner = line.split("(", 1)[1].rsplit(")", 1)[0]
                for part in inner.split(","):
                    m = re.match(r"\s*" + _IDENT, part)
                    if m and not m.group(1).isdigit():
                        columns.append(m.group(1))
            continue
        if inside:
            m = re.match(r"\s*(?:[-*•]\s*)?" + _IDENT, line)
            if m:
                columns.append(m.group(1))
    return columns


class RandomPolicy:
    """A seeded agent that acts at random: the baseline a learner must beat.

    Each step it picks an action type uniformly-ish (answering becomes likelier as the budget runs down),
    a random table from the observation, and for QUERY one of a few simple SELECTs (row limit, count, a
    random column once the table is described). Answers are random numbers or words, so success is ≈0%.

    Args:
        seed: seeds the policy's own random stream (independent of the environment's seed), so an
            evaluation is reproducible end to end. Default 0.
        answer_probability: chance of answering on any step before the last one. Default 0.1, which makes
            episodes last a handful of steps like a real agent's.
    """

    def __init__(self, seed: int = 0, answer_probability: float = 0.1):
        self.seed = seed
        self.answer_probability = answer_probability
        self.name = "random"
        self._rng = random.Random(seed)

    def reset(self, env: Any, observation: SQLObservation) -> None:
        self._tables = table_names(observation, env)

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        rng = self._rng
        tables = table_names(observation, env) or self._tables or ["t"]
        if observation.budget_remaining <= 1 or rng.random() < self.answer_probability:
            return SQLAction("ANSWER", self._random_answer())
        kind = rng.choice(("DESCRIBE", "SAMPLE", "QUERY", "QUERY"))
        table = rng.choice(tables)
        if kind != "QUERY":
            return SQLAction(kind, table)
        columns = _column_names(observation, table)
        templates = [
            f"SELECT * FROM {table} LIMIT {rng.randint(1, 10)}",
            f"SELECT count(*) FROM {table}",
        ]
        if columns:
            col = rng.choice(columns)
            templates += [
                f"SELECT {col} FROM {table} LIMIT {rng.randint(1, 10)}",
                f"SELECT DISTINCT {col} FROM {table}",
                f"SELECT max({col}) FROM {table}",
            ]
        return SQLAction("QUERY", rng.choice(templates))

    def _random_answer(self) -> str:
        rng = self._rng
        roll = rng.random()
        if roll < 0.4:
            return str(rng.randint(0, 10_000))
        if roll < 0.6:
            return f"{rng.uniform(0, 10_000):.2f}"
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9)))
        return word if roll < 0.9 else f"{word}, {rng.randint(0, 1000)}"


class OraclePolicy:
    """Reads the gold answer: DESCRIBE each table involved, QUERY the gold SQL, ANSWER the formatted gold.

    It is the ceiling of every metric and the calibration check of the rewards (an oracle episode totals
    about 1.1–1.3). It also produces the trajectories the SFT warm-start imitates. It needs `env.question`
    (and `env.sandbox` for `tidy_sql`).

    Args:
        describe: DESCRIBE the tables involved before querying (as a careful analyst would). Default True.
        tidy_sql: query with the gold SQL in one spelling (`sqlenv.evaluation.teacher_sql.tidy_sql`), when it returns
            the gold query's rows; else the gold text as written. Default False: the dataset's own text.
        sample_values: SAMPLE each table whose column the gold SQL compares with a string, after the DESCRIBEs and
            before the query, to see how the data spells such values (`teacher_sql.filtered_tables`). Default False.
    """

    def __init__(self, describe: bool = True, tidy_sql: bool = False, sample_values: bool = False):
        self.describe = describe
        self.tidy_sql = tidy_sql
        self.sample_values = sample_values
        self.name = "oracle"
        self._plan: list[SQLAction] = []

    def query(self, env: Any) -> str:
        """The SQL this oracle queries with: the gold, tidied when asked and when it returns the same rows."""
        gold = env.question.gold_sql
        if not self.tidy_sql:
            return gold
        from sqlenv.evaluation.teacher_sql import tidy_sql

        tidy = tidy_sql(gold)
        if tidy == gold:
            return gold
        database = env.question.database_name
        try:
            same = env.sandbox.execute(database, tidy).rows == env.sandbox.execute(database, gold).rows
        except Exception:  # noqa: BLE001 - a tidied query that fails is not used
            same = False
        return tidy if same else gold

    def reset(self, env: Any, observation: SQLObservation) -> None:
        from sqlenv.scoring.verifier import format_answer  # lazily: the verifier is only needed to play

        question = env.question
        answer = SQLAction("ANSWER", format_answer(question.gold_answer, question.answer_type))
        query = SQLAction("QUERY", self.query(env))
        looks: list[SQLAction] = []
        seen: set[str] = set()
        if self.describe:
            for table in question.tables_involved:
                if table.lower() not in seen:
                    seen.add(table.lower())
                    looks.append(SQLAction("DESCRIBE", table))
        if self.sample_values:
            from sqlenv.evaluation.teacher_sql import filtered_tables

            involved = {t.lower(): t for t in question.tables_involved}
            for table in filtered_tables(question.gold_sql):
                if table.lower() in involved:
                    looks.append(SQLAction("SAMPLE", involved[table.lower()]))
        # Always leave room for the query and the answer, however many tables the question touches.
        room = max(observation.budget_remaining - 2, 0)
        self._plan = looks[:room] + [query, answer]
        if observation.budget_remaining < 2:
            self._plan = [answer]

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        if not self._plan:  # reset() not called or plan spent: answering is always the safe move
            self.reset(env, observation)
            return self._plan.pop()
        return self._plan.pop(0)


# ------------------------------------------------------------------------------------------------ mistakes
# Values a question mentions: quoted text, numbers, and runs of capitalised words (names) after its first word.
_QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
_FUNCTION = re.compile(r"\b([A-Za-z_]\w*)\(")
_NAME = re.compile(r"(?<!^)(?<![.?!] )\b([A-Z][\w'-]*(?: [A-Z][\w'-]*)*)")


def guess_from_question(question: str, rng: random.Random) -> str:
    """An answer made up without looking at the data: a value the question mentions (a number, a quoted or
    capitalised name), else "1". What an agent that skips exploring answers; almost always wrong."""
    text = question.strip()
    candidates = [a or b for a, b in _QUOTED.findall(text)]
    candidates += _NUMBER.findall(text)
    candidates += [m.group(1) for m in _NAME.finditer(text) if m.start() > 0]
    return rng.choice(candidates) if candidates else "1"


class GuessPolicy:
    """Answers at once, without looking at the database: `guess_from_question`.

    Args:
        seed: seeds the choice among the values the question mentions. Default 0.
    """

    def __init__(self, seed: int = 0):
        self.name = "guess"
        self._rng = random.Random(seed)

    def reset(self, env: Any, observation: SQLObservation) -> None:
        pass

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        return SQLAction("ANSWER", guess_from_question(observation.question, self._rng))


def corrupt_sql(sql: str, rng: random.Random, columns: Any = None) -> str | None:
    """`sql` with one plausible mistake, or None when none applies (or it does not parse).

    The mistakes: drop one WHERE condition, flip a comparison (`>` and `<`), flip an ORDER BY direction, or
    (with `columns(table) -> [column names]`) select another column of the same table.
    """
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return None
    if not isinstance(tree, exp.Select):
        return None
    flips = {exp.GT: exp.LT, exp.LT: exp.GT, exp.GTE: exp.LTE, exp.LTE: exp.GTE}
    edits: list[Callable[[], None]] = []
    where = tree.args.get("where")
    if where is not None:
        conditions = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]

        def drop_condition(index: int) -> None:
            rest = [c for i, c in enumerate(conditions) if i != index]
            tree.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)

        edits += [lambda i=i: drop_condition(i) for i in range(len(conditions))]
        for node in where.find_all(*flips):
            edits.append(lambda n=node: n.replace(flips[type(n)](this=n.this, expression=n.expression)))
    for node in tree.find_all(exp.Ordered):
        edits.append(lambda n=node: n.set("desc", not n.args.get("desc")))
    if columns is not None:
        tables = [t.name for t in tree.find_all(exp.Table)]
        for select in tree.selects:
            column = select if isinstance(select, exp.Column) else None
            if column is None:
                continue
            table = column.table or (tables[0] if len(tables) == 1 else "")
            others = [c for c in (columns(table) if table else []) if c.lower() != column.name.lower()]
            if others:
                edits.append(lambda c=column, o=others: c.set("this", exp.to_identifier(rng.choice(o))))
    if not edits:
        return None
    rng.choice(edits)()
    # sqlglot upper-cases function names; keep the original's spelling so only the mistake differs.
    spelling = {name.lower(): name for name in _FUNCTION.findall(sql)}
    return _FUNCTION.sub(lambda m: spelling.get(m.group(1).lower(), m.group(1)) + "(", tree.sql(dialect="sqlite"))


class WrongQueryPolicy:
    """Queries with a wrong filter or column (`corrupt_sql` of the gold SQL) and answers from that result.

    The answer is the query's result shaped like the question's answer type (first value, first column or the
    rows) and formatted as the oracle formats answers, so the episode looks careful but answers wrongly. When
    no mistake applies to the gold SQL (`SELECT count(*) FROM t`) or the wrong query fails, it guesses instead.
    It needs `env.question` and `env.sandbox`, like the oracle.

    Args:
        seed: seeds the choice of mistake. Default 0.
    """

    def __init__(self, seed: int = 0):
        self.name = "wrong_query"
        self._rng = random.Random(seed)
        self._plan: list[SQLAction] = []

    def reset(self, env: Any, observation: SQLObservation) -> None:
        from sqlenv.scoring.verifier import format_answer

        question = env.question
        database = question.database_name

        def columns(table: str) -> list[str]:
            try:
                return [name for name, _, _ in env.sandbox.find_table(database, table).columns]
            except Exception:  # noqa: BLE001 - an unknown table just offers no other column
                return []

        sql = corrupt_sql(question.gold_sql, self._rng, columns)
        rows = None
        if sql is not None:
            try:
                rows = env.sandbox.execute(database, sql).rows
            except Exception:  # noqa: BLE001 - a wrong query that fails falls back to a guess
                rows = None
        if sql is None or rows is None or observation.budget_remaining < 2:
            self._plan = [SQLAction("ANSWER", guess_from_question(observation.question, self._rng))]
            return
        kind = (question.answer_type or "string").lower()
        if not rows:
            value: Any = []
        elif kind in ("integer", "float", "string"):
            value = rows[0][0]
        elif kind == "list":
            value = [row[0] for row in rows]
        else:
            value = [list(row) for row in rows]
        self._plan = [SQLAction("QUERY", sql), SQLAction("ANSWER", format_answer(value, kind))]

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        if not self._plan:
            return SQLAction("ANSWER", guess_from_question(observation.question, self._rng))
        return self._plan.pop(0)


class QueryFixPolicy(OraclePolicy):
    """The oracle's episode with one broken query first: a column taken from the wrong place (`teacher_sql.
    broken_queries`), SQLite's `no such column` error, then the right query and the right answer. What it shows is
    the step a careful analyst takes after an error: read it and fix the query.

    The broken query is the teacher's deliberate mistake, not a move to copy: `mistake_turns` names its turn, and the
    warm start leaves it out of the loss (the model learns the fix from the error, not to make the error). When no
    broken query applies, or the budget has no room for one, the episode is the oracle's. It needs `env.question` and
    `env.sandbox`. Other arguments as `OraclePolicy`'s.

    Args:
        seed: seeds the choice among the broken queries. Default 0.
    """

    def __init__(self, seed: int = 0, describe: bool = True, tidy_sql: bool = False, sample_values: bool = False):
        super().__init__(describe=describe, tidy_sql=tidy_sql, sample_values=sample_values)
        self.name = "query_fix"
        self._rng = random.Random(seed)
        self.mistake_turns: set[int] = set()

    def reset(self, env: Any, observation: SQLObservation) -> None:
        from sqlenv.evaluation.teacher_sql import broken_queries

        super().reset(env, observation)
        self.mistake_turns = set()
        at = next((i for i, a in enumerate(self._plan) if a.action_type == "QUERY"), None)
        if at is None or observation.budget_remaining < len(self._plan) + 1:
            return
        database = env.question.database_name
        sandbox = env.sandbox

        def columns(table: str) -> list[str]:
            try:
                return [name for name, _, _ in sandbox.find_table(database, table).columns]
            except Exception:  # noqa: BLE001 - an unknown table has no columns to offer
                return []

        candidates = broken_queries(self._plan[at].argument, columns, sandbox.table_names(database))
        self._rng.shuffle(candidates)
        for sql in candidates:
            try:
                sandbox.execute(database, sql)
            except Exception:  # noqa: BLE001 - it fails, as a broken query should: this is the one
                self._plan.insert(at, SQLAction("QUERY", sql))
                self.mistake_turns = {at}
                return


#: The imperfect teacher's mistakes by name (see `training.warm_start`).
MISTAKES = {"guess": GuessPolicy, "wrong_query": WrongQueryPolicy, "query_fix": QueryFixPolicy}
