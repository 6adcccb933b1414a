"""`SQLEnvTRL`: SQLEnv as a TRL `environment_factory` (GRPOTrainer's multi-turn tool loop).

Each instance plays one `training.environment.source.EpisodeSource` (a split's questions, its databases, the step
budget). TRL builds environments with no arguments, so hand it a factory that binds the source:

    source = EpisodeSource.from_dataset("builtin", split="train", step_budget=10)
    trainer = GRPOTrainer(model, reward_funcs=[reward_correctness, reward_progress, reward_operational],
                          train_dataset=train_rows(source), environment_factory=functools.partial(SQLEnvTRL, source),
                          args=...)

or, as documented before, set the source once and hand TRL the class: `SQLEnvTRL.configure(dataset="builtin",
split="train", step_budget=10)`, then `environment_factory=SQLEnvTRL`.

For every rollout TRL calls `reset(**row)` (the row carries `question_id`, so the `num_generations`
completions of a group play the same question), appends the returned text to the user turn, then runs the
model's tool calls — `describe`, `sample`, `query`, `answer` — as methods of the instance, showing their return
value as the tool result. TRL builds the tool schemas from the signatures and Google-style docstrings, and
every public method except `reset` becomes a tool: helpers here are private or properties on purpose.

The episode ends at ANSWER or when the step budget is spent; the tool result then says so, the model replies
without a tool call and TRL's loop stops (`max_tool_calling_iterations` is set to the step budget as a cap).
A call after the end runs nothing and costs `POST_EPISODE_PENALTY`; an episode the model abandons (a turn
without a tool call before ANSWER) is charged the step cost of its unused steps, so giving up never scores
better than trying. Rewards accumulate per instance and are read by the reward functions in
`training.grpo.rewards` through `kwargs["environments"]`.

Caps on this path are TRL's own loop's: a turn that reaches `max_turn_tokens` goes on only if it holds a complete
tool call, else the sample ends there without an end-of-turn token, and a tool result that would pass
`max_completion_length` ends the sample at the model's last turn. With `mask_truncated_completions` (on by default,
`training.grpo.grpo_args`) TRL leaves the first kind out of the loss (it spots them by their last token), not the
second. The batched path (`rollout="rollout_func"`) closes a capped turn and plays on, as evals do, and masks both
kinds (`training.generation.episodes.play_batched`). The compact prompt (`TrainConfig.prompt`) needs that path too:
TRL renders this class's tool schemas into every prompt.
"""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

from sqlenv.types import RewardBreakdown, SQLAction, SQLObservation
from sqlenv.agent.prompts import episode_over_message, first_user_message, format_tool_result

__all__ = ["SQLEnvTRL", "train_rows", "tool_methods", "tool_schemas", "POST_EPISODE_PENALTY"]

#: Operational reward of a tool call made after the episode ended (it runs nothing).
POST_EPISODE_PENALTY = -0.05


class SQLEnvTRL:
    """One SQLEnv episode at a time, driven by TRL's tool-calling loop.

    Args:
        source: the `training.environment.source.EpisodeSource` to play (questions file, databases, step budget).
            TRL builds environments with no arguments, so pass `functools.partial(SQLEnvTRL, source)` (what
            `training.grpo.build_trainer` does) as `environment_factory`. `None` (default) = the source set by
            `SQLEnvTRL.configure(...)`, for code that hands TRL the class itself.
    """

    _default_source: Any = None  # set by `configure()`; read only by instances built without a source
    _lock = threading.Lock()

    def __init__(self, source: Any = None) -> None:
        self._source = source
        self._env = None  # the SQLEnvironment, created on first use (TRL probes an instance at init)
        self._env_source: Any = None
        self._observation: SQLObservation | None = None
        self._penalty = 0.0
        self._post_episode_calls = 0
        self._tool_calls = 0

    # ------------------------------------------------------------------------------------ configuration
    @classmethod
    def configure(
        cls,
        questions_path: str | Path | None = None,
        db_dir: str | Path | None = None,
        step_budget: int = 10,
        *,
        dataset: str | Path | None = None,
        split: str = "train",
        reward_config: Any = None,
        sandbox: Any = None,
        base_url: str | None = None,
    ) -> None:
        """Choose the questions that instances built without a source play (`SQLEnvTRL()`, as TRL builds them when
        handed the class). It sets up an `EpisodeSource`; passing one to the constructor needs no configure().

        Args:
            questions_path: a `questions_<split>.json` file; with `db_dir`, instead of `dataset`.
            db_dir: the folder of `<db_id>/<db_id>.sqlite` files.
            step_budget: actions per episode (default 10).
            dataset: a dataset name (`"builtin"`, one prepared under `data/`) or a prepared directory.
            split: the split of `dataset` (default `"train"`).
            reward_config: a `sqlenv.RewardConfig` (default: the environment's defaults).
            sandbox: a `sqlenv.SandboxSettings` (default: the environment's defaults).
            base_url: play on a SQLEnv server at this URL (`python -m sqlenv serve`) instead of in-process
                (default None). Each instance holds one session; the server owns the databases, rewards and
                sandbox, so `db_dir`, `reward_config` and `sandbox` stay unset; the questions file still
                names the questions (and fills the gold fields of transcripts).
        """
        from training.environment.source import EpisodeSource

        if int(step_budget) < 1:
            raise ValueError(f"step_budget must be at least 1, got {step_budget}")
        if dataset is not None:
            source = EpisodeSource.from_dataset(dataset, split, step_budget, reward_config=reward_config,
                                                sandbox=sandbox, base_url=base_url)
        elif questions_path is None or (db_dir is None and base_url is None):
            raise ValueError("configure() needs a dataset, or both questions_path and db_dir")
        else:
            source = EpisodeSource(questions_path, db_dir, step_budget, reward_config=reward_config, sandbox=sandbox,
                                   base_url=base_url)
        with cls._lock:
            cls._default_source = source

    @classmethod
    def reset_configuration(cls) -> None:
        """Forget what `configure()` set (instances built without a source then refuse to start)."""
        with cls._lock:
            cls._default_source = None

    @classmethod
    def settings(cls) -> dict[str, Any]:
        """What `configure()` set: questions_path, db_dir, step_budget, reward_config, sandbox, base_url."""
        source = cls._default_source
        if source is None:
            raise RuntimeError("SQLEnvTRL.configure(...) must be called before episodes start, "
                               "or pass an EpisodeSource: SQLEnvTRL(source)")
        return {"questions_path": source.questions_path, "db_dir": source.db_dir, "step_budget": source.step_budget,
                "reward_config": source.reward_config, "sandbox": source.sandbox, "base_url": source.base_url}

    @property
    def source(self) -> Any:
        """The `EpisodeSource` this instance plays (its own, else the one `configure()` set)."""
        source = self._source if self._source is not None else type(self)._default_source
        if source is None:
            self.settings()  # raises, saying what to do
        return source

    def _environment(self):
        source = self.source
        if self._env is None or self._env_source is not source:  # configure() may have chosen other questions
            if self._env is not None:
                self._env.close()
            self._env, self._env_source = source.environment(), source
        return self._env

    # ------------------------------------------------------------------------------------------ episode
    def reset(self, **row: Any) -> str:
        """Start the episode of `row["question_id"]` (or a seeded draw with `row["seed"]`); clear all state.

        Returns the first observation (question, tables, budget), prefixed with a blank line when TRL will
        append it to a user turn that already has text.
        """
        env = self._environment()
        self._penalty = 0.0
        self._post_episode_calls = 0
        self._tool_calls = 0
        question_id = row.get("question_id")
        if question_id is not None:
            self._observation = env.reset(question_id=str(question_id))
        else:
            seed = row.get("seed")
            self._observation = env.reset(seed=None if seed is None else int(seed))
        text = first_user_message(self._observation)
        prompt = row.get("prompt")
        existing = prompt[-1].get("content") if isinstance(prompt, list) and prompt else None
        return f"\n\n{text}" if isinstance(existing, str) and existing.strip() else text

    def _act(self, action_type: str, argument: Any) -> str:
        if self._observation is None:
            return "Error: no episode is running."
        self._tool_calls += 1
        if self._observation.done:
            self._post_episode_calls += 1
            self._penalty += POST_EPISODE_PENALTY
            return episode_over_message()
        self._observation = self._environment().step(SQLAction(action_type, "" if argument is None else str(argument)))
        return format_tool_result(self._observation)

    # -------------------------------------------------------------------------------------------- tools
    def describe(self, table_name: str) -> str:
        """Show the columns of a table (types, keys) and its row count.

        Args:
            table_name: A table name.
        """
        return self._act("DESCRIBE", table_name)

    def sample(self, table_name: str) -> str:
        """Show the first rows of a table.

        Args:
            table_name: A table name.
        """
        return self._act("SAMPLE", table_name)

    def query(self, sql: str) -> str:
        """Run one read-only SQLite SELECT statement.

        Args:
            sql: The SELECT statement.
        """
        return self._act("QUERY", sql)

    def answer(self, value: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            value: The answer in the format of the system prompt.
        """
        return self._act("ANSWER", value)

    # ------------------------------------------------------------------------- rewards (read, not tools)
    @property
    def environment(self):
        """The underlying `sqlenv.protocol.Environment`: a `SQLEnvironment`, or a `RemoteSQLEnvironment` with
        `base_url` (opened on first use). This adapter uses nothing of it beyond the protocol."""
        return self._environment()

    @property
    def observation(self) -> SQLObservation | None:
        return self._observation

    @property
    def done(self) -> bool:
        return bool(self._observation is not None and self._observation.done)

    @property
    def unfinished_penalty(self) -> float:
        """Operational charge of an episode the model left unfinished (it stopped calling tools before ANSWER
        and before the budget ran out): the step cost of every unused step. Without it, saying nothing
        (reward 0) beats trying and failing (step costs), and GRPO learns to stop calling tools."""
        if self._env is None or self._observation is None or self._observation.done:
            return 0.0
        return self._env.reward_config.step_cost * self._observation.budget_remaining

    @property
    def breakdown(self) -> RewardBreakdown:
        """This episode's reward by layer, as GRPO scores it: the environment's breakdown, with the post-episode
        penalty and the unfinished-episode charge counted as operational."""
        if self._env is None or self._observation is None:
            return RewardBreakdown()
        rb = self._env.reward_breakdown
        return RewardBreakdown(
            operational=rb.operational + self._penalty + self.unfinished_penalty,
            progress=rb.progress,
            correctness=rb.correctness,
        )

    @property
    def post_episode_calls(self) -> int:
        return self._post_episode_calls

    @property
    def tool_calls(self) -> int:
        return self._tool_calls

    @property
    def reward(self) -> float:
        """This episode's total reward (all layers, plus penalties)."""
        return self.breakdown.total

    @property
    def transcript(self) -> dict[str, Any]:
        """The episode in the shared sqlenv transcript format."""
        return self._env.transcript() if self._env is not None else {}


def tool_methods(env: SQLEnvTRL | None = None) -> list[Any]:
    """The bound tool methods exactly as TRL collects them (public functions of the class but `reset` and
    `get_reward`, in `inspect.getmembers` order), so SFT, evals and the rollout path render the same tools."""
    env = env if env is not None else SQLEnvTRL()
    return [
        getattr(env, name)
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def tool_schemas() -> list[dict[str, Any]]:
    """JSON schemas of the tools, as the chat template renders them (same order as TRL)."""
    from transformers.utils import get_json_schema

    return [get_json_schema(method) for method in tool_methods()]


def train_rows(
    source: Any = None,
    *,
    dataset: str | Path | None = None,
    split: str = "train",
    system_prompt: str | None = None,
):
    """The GRPO train dataset: one row per question, `{"prompt": [system, user ""], "question_id": ...}`.

    Args:
        source: a `training.environment.source.EpisodeSource` (its questions), or the path of a
            `questions_<split>.json` file.
        dataset: instead, a dataset name, directory or `DatasetInfo`, with `split`.
        system_prompt: default `sqlenv.agent.prompts.SYSTEM_PROMPT`.

    The user turn is empty because `SQLEnvTRL.reset` supplies the episode's first observation.
    """
    from datasets import Dataset

    from sqlenv.data.datasets import load_questions
    from sqlenv.agent.prompts import SYSTEM_PROMPT

    if dataset is not None:
        from sqlenv.data.datasets import resolve_dataset

        source = resolve_dataset(dataset).questions_path(split)
    if source is None:
        raise ValueError("train_rows() needs an EpisodeSource, a questions file or a dataset")
    questions = source.questions if hasattr(source, "questions") else load_questions(source)
    prompt = [{"role": "system", "content": system_prompt or SYSTEM_PROMPT}, {"role": "user", "content": ""}]
    return Dataset.from_dict(
        {"prompt": [prompt] * len(questions), "question_id": [q.question_id for q in questions]}
    )
