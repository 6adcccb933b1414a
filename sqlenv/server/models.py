"""The wire types of the SQLEnv server: OpenEnv `Action` / `Observation` / `State` models.

They mirror the plain dataclasses of `sqlenv.types` (which the environment itself uses and which carry no
dependency) and convert to and from them, so the same episode reads the same in-process and over the wire.

An action on the wire is `{"action_type": "QUERY", "argument": "SELECT count(*) FROM singer"}`. Any strings
are accepted, as in-process: an unknown action type or a bad argument comes back as an observation with
`error` set (and costs its step), never as a protocol error. A value that is not a string is a protocol
error (OpenEnv's `VALIDATION_ERROR`), and the session goes on.

Every observation's `metadata` carries the reward split: `reward_layers` (this step: operational, progress,
terminal, total) and `reward_breakdown` (the episode so far: operational, progress, correctness, total),
plus `episode_id`, `question_id` and `outcome`; the observation of `reset` also carries `step_budget` and
`reward_config` (the server's reward constants).
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from sqlenv import types as core

__all__ = ["SQLAction", "SQLObservation", "EpisodeState"]


class SQLAction(Action):
    """One agent action (OpenEnv wire type of `sqlenv.types.SQLAction`)."""

    action_type: str = Field(description="DESCRIBE, SAMPLE, QUERY or ANSWER (case-insensitive)",
                             examples=["QUERY"])
    argument: str = Field(default="", description="a table name (DESCRIBE, SAMPLE), one SELECT statement (QUERY) "
                                                  "or the answer (ANSWER)", examples=["SELECT count(*) FROM singer"])

    @classmethod
    def from_core(cls, action: Any) -> "SQLAction":
        """From a `sqlenv.types.SQLAction` (or anything with `action_type` and `argument`)."""
        return cls(action_type=str(action.action_type), argument="" if action.argument is None else str(action.argument))

    def to_core(self) -> core.SQLAction:
        return core.SQLAction(self.action_type, self.argument)


class SQLObservation(Observation):
    """What the agent sees after `reset` or `step` (OpenEnv wire type of `sqlenv.types.SQLObservation`).

    `done` and `reward` (this step's total) are OpenEnv's own fields; the split of the reward is in `metadata`.
    `terminated` and `truncated` say how a finished episode ended, as in Gymnasium (`done` is their union).
    """

    question: str = Field(default="", description="the question to answer")
    schema_info: str = Field(default="", description="table names, plus the columns of every DESCRIBEd table")
    result: str = Field(default="", description="text output of the last action")
    error: str = Field(default="", description="error message of the last action ('' when it ran)")
    step_count: int = Field(default=0, description="steps taken in this episode")
    budget_remaining: int = Field(default=0, description="steps left before the episode ends")
    action_history: list[str] = Field(default_factory=list, description="one line per step taken")
    terminated: bool = Field(default=False, description="the episode ended on its own terms (ANSWER)")
    truncated: bool = Field(default=False, description="the episode was cut short (the step budget ran out)")

    @classmethod
    def from_core(cls, obs: core.SQLObservation, metadata: dict[str, Any] | None = None) -> "SQLObservation":
        # The environment's own values, already of these types: built without validation (every step).
        return cls.model_construct(question=obs.question, schema_info=obs.schema_info, result=obs.result,
                                   error=obs.error, step_count=obs.step_count, budget_remaining=obs.budget_remaining,
                                   action_history=list(obs.action_history), done=obs.done, reward=obs.reward,
                                   terminated=obs.terminated, truncated=obs.truncated, metadata=dict(metadata or {}))

    def to_core(self) -> core.SQLObservation:
        """The `sqlenv.types.SQLObservation`, its `reward_layers` read back from `metadata`."""
        layers = self.metadata.get("reward_layers") or {}
        return core.SQLObservation(
            question=self.question, schema_info=self.schema_info, result=self.result, error=self.error,
            step_count=self.step_count, budget_remaining=self.budget_remaining,
            action_history=list(self.action_history), done=bool(self.done),
            reward=float(self.reward or 0.0),
            reward_layers=core.RewardLayers(operational=float(layers.get("operational", 0.0)),
                                            progress=float(layers.get("progress", 0.0)),
                                            terminal=float(layers.get("terminal", 0.0))),
            terminated=bool(self.terminated), truncated=bool(self.truncated))


class EpisodeState(State):
    """The session's episode (OpenEnv wire type of `sqlenv.types.EpisodeState`, with the episode record).

    `transcript` is the episode in the shared transcript format (`sqlenv.transcript`); its `gold_sql` and
    `gold_answer` are withheld (None) until the episode is over, so a client cannot read the answer mid-episode.
    A transcript too big for one reply (`MAX_STATE_TRANSCRIPT_CHARS` in `sqlenv.server.environment`) is left out
    (None) and `transcript_omitted` says so; `RemoteSQLEnvironment.transcript()` then uses its own record.
    """

    question_id: str | None = Field(default=None, description="the question being played")
    done: bool = Field(default=False, description="whether the episode is over")
    step_budget: int = Field(default=0, description="steps allowed in this episode")
    outcome: str = Field(default="unfinished", description="correct, wrong_answer, budget_exhausted or unfinished")
    reward_breakdown: dict[str, float] = Field(default_factory=dict, description="the episode's reward by layer")
    transcript: dict[str, Any] | None = Field(default=None, description="the episode record (gold withheld "
                                                                        "until done)")
    transcript_omitted: str = Field(default="", description="why `transcript` is None although an episode "
                                                            "was played ('' otherwise)")
