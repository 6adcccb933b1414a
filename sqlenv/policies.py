"""Baseline policies that play `SQLEnvironment` episodes: a seeded random agent and a gold-reading oracle.

A policy is anything with a `name` attribute and two methods (the `Policy` protocol):

- `reset(env, observation)` is called once after `env.reset()`, with the first observation;
- `act(env, observation) -> SQLAction` is called until the episode is done.

The trained-model policy in `training/policy.py` implements the same protocol, so `sqlenv.evaluation.evaluate`
plays all of them the same way. The random policy is the floor a learner must beat (≈0% success, under 0.3
reward); the oracle is the ceiling and the calibration check of the reward layers (≈1.1–1.3 per episode).
"""

from __future__ import annotations

import random
import re
import string
from typing import Any, Protocol, runtime_checkable

from sqlenv.types import SQLAction, SQLObservation

__all__ = ["Policy", "RandomPolicy", "OraclePolicy", "table_names"]


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
    about 1.1–1.3). It also produces the trajectories the SFT warm-start imitates. It needs `env.question`.

    Args:
        describe: DESCRIBE the tables involved before querying (as a careful analyst would). Default True.
    """

    def __init__(self, describe: bool = True):
        self.describe = describe
        self.name = "oracle"
        self._plan: list[SQLAction] = []

    def reset(self, env: Any, observation: SQLObservation) -> None:
        from sqlenv.verifier import format_answer  # lazily: the verifier is only needed to play

        question = env.question
        answer = SQLAction("ANSWER", format_answer(question.gold_answer, question.answer_type))
        query = SQLAction("QUERY", question.gold_sql)
        describes: list[SQLAction] = []
        if self.describe:
            seen: set[str] = set()
            for table in question.tables_involved:
                if table.lower() not in seen:
                    seen.add(table.lower())
                    describes.append(SQLAction("DESCRIBE", table))
        # Always leave room for the query and the answer, however many tables the question touches.
        room = max(observation.budget_remaining - 2, 0)
        self._plan = describes[:room] + [query, answer]
        if observation.budget_remaining < 2:
            self._plan = [answer]

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        if not self._plan:  # reset() not called or plan spent: answering is always the safe move
            self.reset(env, observation)
            return self._plan.pop()
        return self._plan.pop(0)
