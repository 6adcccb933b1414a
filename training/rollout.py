"""The batched rollout path of GRPOTrainer: `BatchedRollout`, TRL's `rollout_func` for SQLEnv.

`config.rollout="rollout_func"` trains through it instead of TRL's `environment_factory` tool loop: every episode of a
generation batch is played at once (`training.episodes.play_batched`: one batched generation per turn for all live
episodes), several times faster than TRL's loop on small models. It returns what GRPOTrainer trains on —
`prompt_ids`, `completion_ids`, `logprobs` (None: TRL recomputes them), `env_mask` (1 on model tokens, 0 on tool
results) — plus the per-completion fields the reward functions read (`correctness`, `progress`, `operational`) and
the tool counts `reward_operational` logs through TRL's `log_metric` (TRL logs them itself on the other path).

    rollout = BatchedRollout(plan.episodes("train"), max_turn_tokens=64)
    trainer = GRPOTrainer(..., train_dataset=rollout_rows(plan.episodes("train")), rollout_func=rollout)

The instance holds what the path needs — its episode source, a pool of environments, the index from prompt to
question, the renderer — so nothing lives in module globals and two trainers never share state.
"""

from __future__ import annotations

import copy
import re
import threading
from typing import Any

from sqlenv.types import SQLAction, SQLObservation
from training.chat import ChatRenderer
from training.episodes import Episode, play_batched
from training.prompts import initial_messages

__all__ = ["BatchedRollout", "QuestionIndex", "rollout_rows"]

_QUESTION_LINE = re.compile(r"^Question: (.*)$", re.M)
_TABLES_LINE = re.compile(r"^Tables: (.*)$", re.M)


class QuestionIndex:
    """Finds the question a rollout prompt asks (`rollout_func` receives only the prompts): by its question text,
    and by its table list when two databases share a question text.

    Args:
        questions: the questions the prompts were made from (`EpisodeSource.questions`).
        table_names: `table_names(database_name) -> list[str]` (an environment's `sandbox.table_names`); None
            when no database is at hand (episodes on a server): a text two databases share then takes the first.
    """

    def __init__(self, questions: list, table_names: Any):
        self._by_text: dict[str, list[Any]] = {}
        for q in questions:
            self._by_text.setdefault(q.question_text.strip(), []).append(q)
        self._table_names = table_names
        self._tables: dict[str, str] = {}

    def lookup(self, user_text: str) -> str | None:
        m = _QUESTION_LINE.search(user_text or "")
        if not m:
            return None
        candidates = self._by_text.get(m.group(1).strip(), [])
        databases = {q.database_name for q in candidates}
        if len(databases) > 1 and self._table_names is not None:
            tables = _TABLES_LINE.search(user_text)
            for q in candidates:
                if q.database_name not in self._tables:
                    try:
                        self._tables[q.database_name] = ", ".join(self._table_names(q.database_name))
                    except Exception:  # noqa: BLE001 - a broken database just doesn't match
                        self._tables[q.database_name] = ""
                if tables and self._tables[q.database_name] == tables.group(1).strip():
                    return q.question_id
        return candidates[0].question_id if candidates else None


class BatchedRollout:
    """GRPOTrainer's `rollout_func` over one episode source: `rollout(prompts, trainer) -> dict of lists`.

    Args:
        source: the `training.plan.EpisodeSource` the prompts were made from (`rollout_rows(source)`).
        max_turn_tokens: most tokens one assistant turn may generate (default 256); the episode's whole budget is
            the trainer's `max_completion_length`.
        renderer: the `ChatRenderer` to play with; default: built from the trainer on the first call (same template,
            template kwargs and end-of-turn ids as GRPOTrainer).
    """

    def __init__(self, source: Any, *, max_turn_tokens: int = 256, renderer: ChatRenderer | None = None):
        self.source = source
        self.max_turn_tokens = max_turn_tokens
        self.renderer = renderer
        self._pool: list[Any] = []
        self._lock = threading.Lock()
        self._index: QuestionIndex | None = None

    def environments(self, n: int) -> list[Any]:
        """The first `n` environments of the pool (one `SQLEnvTRL` per episode of a batch), created as needed."""
        from training.trl_env import SQLEnvTRL

        with self._lock:
            while len(self._pool) < n:
                self._pool.append(SQLEnvTRL(self.source))
            return self._pool[:n]

    def _question_index(self, env: Any) -> QuestionIndex:
        if self._index is None:
            sandbox = getattr(env.environment, "sandbox", None)  # a server session has no local sandbox
            self._index = QuestionIndex(self.source.questions, sandbox.table_names if sandbox is not None else None)
        return self._index

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        """Play one episode per prompt, batched, and return the training record (see the module docstring).

        Each prompt is `[system, user]` where the user turn is the episode's first observation (`rollout_rows`); the
        question is found from its text.
        """
        from trl.models import unwrap_model_for_generation

        if self.renderer is None:
            self.renderer = ChatRenderer.from_trainer(trainer)
        renderer = self.renderer
        envs = self.environments(len(prompts))
        index = self._question_index(envs[0])
        episodes = []
        for prompt, env in zip(prompts, envs):
            user = next((m.get("content", "") for m in reversed(prompt) if m.get("role") == "user"), "")
            question_id = index.lookup(user)
            if question_id is None:
                raise ValueError(f"rollout_func: no question of {self.source} matches the prompt {user[:120]!r}")
            env.reset(question_id=question_id)
            messages = copy.deepcopy(list(prompt))

            def step(action: SQLAction, env: Any = env) -> tuple[str, SQLObservation, bool]:
                text = env._act(action.action_type, action.argument)
                return text, env.observation, env.done

            episodes.append(Episode(messages=messages, prompt_ids=renderer.prompt_ids(messages), step=step,
                                    observation=env.observation))
        max_turns = trainer.max_tool_calling_iterations if trainer.max_tool_calling_iterations < 10**6 else 64
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            play_batched(model, renderer, episodes, max_turn_tokens=self.max_turn_tokens,
                         max_completion_tokens=trainer.max_completion_length, max_turns=max_turns,
                         generation_config=trainer.generation_config)
        breakdowns = [env.breakdown for env in envs]
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": None,
            "env_mask": [e.env_mask for e in episodes],
            "correctness": [b.correctness for b in breakdowns],
            "progress": [b.progress for b in breakdowns],
            "operational": [b.operational for b in breakdowns],
            # Tool health, logged by `reward_operational` through TRL's `log_metric` (TRL cannot see these calls).
            "tool_calls": [len(e.actions) for e in episodes],
            "tool_failures": [sum(1 for m in e.messages if m.get("role") == "tool"
                                  and str(m.get("content", "")).startswith("Error:")) for e in episodes],
        }


def rollout_rows(source: Any):
    """The GRPO dataset of the batched path: `[system, user(first observation)]` prompts, one per question.

    Args:
        source: a `training.plan.EpisodeSource` (its questions, databases and step budget).
    """
    from datasets import Dataset

    env = source.environment()
    try:
        prompts, ids = [], []
        for q in env.questions:
            prompts.append(initial_messages(env.reset(question_id=q.question_id)))
            ids.append(q.question_id)
    finally:
        env.close()
    return Dataset.from_dict({"prompt": prompts, "question_id": ids})
