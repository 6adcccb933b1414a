"""The plain data types of an episode: actions, observations, state, reward breakdown, question records.

Everything here is a dataclass of plain Python values so it serialises to JSON without help and can be
shared by the environment, the training adapters and the dashboard.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ACTION_TYPES = ("DESCRIBE", "SAMPLE", "QUERY", "ANSWER")
ANSWER_TYPES = ("integer", "float", "string", "list", "table")
DIFFICULTIES = ("easy", "medium", "hard", "extra")


@dataclass
class SQLAction:
    """One agent action. Any strings are accepted here; `SQLEnvironment.step` validates them.

    Args:
        action_type: DESCRIBE, SAMPLE, QUERY or ANSWER (case-insensitive).
        argument: a table name (DESCRIBE, SAMPLE), one SQL statement (QUERY) or the answer text (ANSWER).
    """

    action_type: str
    argument: str = ""


@dataclass(slots=True)
class RewardLayers:
    """A step's reward split by layer. `total` is what the step earned after clipping the dense part."""

    operational: float = 0.0
    progress: float = 0.0
    terminal: float = 0.0

    @property
    def total(self) -> float:
        return self.operational + self.progress + self.terminal

    def to_dict(self) -> dict[str, float]:
        # Spelled out: dataclasses.asdict deep-copies field by field, ~10x slower, and this runs every step.
        return {"operational": self.operational, "progress": self.progress, "terminal": self.terminal,
                "total": self.total}


@dataclass(slots=True)
class RewardBreakdown:
    """An episode's reward so far: sums of the operational and progress layers, and correctness 0/1."""

    operational: float = 0.0
    progress: float = 0.0
    correctness: float = 0.0

    @property
    def total(self) -> float:
        return self.operational + self.progress + self.correctness

    def to_dict(self) -> dict[str, float]:
        return {"operational": self.operational, "progress": self.progress, "correctness": self.correctness,
                "total": self.total}


@dataclass(slots=True)  # created every step: slots make that and attribute reads cheaper
class SQLObservation:
    """What the agent sees after `reset()` or `step()`.

    `schema_info` holds the table names from the start and gains the columns of every DESCRIBEd table.
    `result` is the text output of the last action, `error` its error message ("" when it ran).
    `reward` is this step's reward (0 at reset) and `reward_layers` its split by layer.

    How an episode ends follows Gymnasium: `terminated` when it reached an end of the task itself (ANSWER),
    `truncated` when it was cut short from outside (the step budget ran out, the connection to a server was
    lost, or no episode is running). A value estimate bootstraps from a truncated episode's last state, never
    from a terminated one. `done` is kept as their union (`terminated or truncated`), for code that only
    needs to know the episode is over.
    """

    question: str
    schema_info: str
    result: str = ""
    error: str = ""
    step_count: int = 0
    budget_remaining: int = 0
    action_history: list[str] = field(default_factory=list)
    done: bool = False
    reward: float = 0.0
    reward_layers: RewardLayers = field(default_factory=RewardLayers)
    terminated: bool = False
    truncated: bool = False

    def refusal(self, message: str) -> "SQLObservation":
        """This observation again with `error=message` and reward 0: what a step that cannot run returns (the
        episode is over, the server refused it). Nothing of the episode changes."""
        return SQLObservation(question=self.question, schema_info=self.schema_info, result="", error=message,
                              step_count=self.step_count, budget_remaining=self.budget_remaining,
                              action_history=list(self.action_history), done=self.done, reward=0.0,
                              reward_layers=RewardLayers(), terminated=self.terminated, truncated=self.truncated)

    @classmethod
    def no_episode(cls, message: str) -> "SQLObservation":
        """The observation of a step taken with no episode behind it: `message` as the error, over (`truncated`:
        nothing ended the task, there is just nothing to continue)."""
        return cls(question="", schema_info="", error=message, budget_remaining=0, done=True, truncated=True)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["reward_layers"] = self.reward_layers.to_dict()
        return data


@dataclass(slots=True)
class EpisodeState:
    """Bookkeeping of the current episode (gymnasium-style `env.state`). `step_budget` is this episode's budget
    (the environment's default until a reset asks for another)."""

    episode_id: str = ""
    step_count: int = 0
    question_id: str | None = None
    done: bool = False
    step_budget: int = 0


@dataclass
class Question:
    """One question record, as stored in `questions_<split>.json`.

    `gold_answer` is the gold SQL's result in the shape its `answer_type` names: a number for integer/float,
    a string for string, a list of scalars for list, a list of rows (lists) for table.
    """

    question_id: str
    question_text: str
    database_name: str
    gold_sql: str
    gold_answer: Any
    answer_type: str
    difficulty: str
    tables_involved: list[str]
    split: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Question":
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: data[k] for k in names})
