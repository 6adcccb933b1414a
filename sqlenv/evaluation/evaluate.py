"""The "green agent": play a policy for N episodes on an environment and score it.

`evaluate(env, policy, n_episodes, seed)` plays episode i on `env.reset(seed=seed + i)`, so two policies
evaluated with the same seed face the same questions in the same order (the paired random-vs-trained
comparison relies on it). `evaluate(env, policy, seed=seed, question_ids=ids)` plays each listed question once,
in order (`all_questions(env)`: a whole split, as published benchmarks are scored). Every episode becomes one
transcript dict in the format of `sqlenv/transcript.py`, with the policy name and the episode's seed filled in.
An episode that raises (a broken policy, a bug) is recorded as failed with outcome "error" and its message, and
the run goes on.

Results report answer success and execution accuracy (EX: the official Spider rules, `sqlenv.scoring.execution`),
overall, per hardness and per database, each with its episode count and a 95% Wilson interval
(`sqlenv.evaluation.breakdown`). """

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sqlenv.evaluation.breakdown import breakdown, rate_cell
from sqlenv.types import SQLAction

__all__ = ["EvaluationResult", "evaluate", "all_questions"]

ProgressCallback = Callable[[int, int, dict], None]


@dataclass
class EvaluationResult:
    """Scores of one evaluation run.

    Attributes:
        success_rate: fraction of episodes answered correctly (errors count as failures).
        execution_accuracy (property): fraction of episodes whose last successful QUERY returned the gold result
            (None when no transcript records it).
        explore_rate (property): fraction of episodes that looked at the data before answering.
        avg_reward: mean total episode reward (all three layers).
        avg_steps: mean number of steps per episode.
        episodes: one transcript dict per episode, in play order.
        policy: the policy's name.
        seed: the first episode's seed (episode i used seed + i).
    """

    success_rate: float
    avg_reward: float
    avg_steps: float
    episodes: list[dict] = field(default_factory=list)
    policy: str | None = None
    seed: int | None = None

    @property
    def n_episodes(self) -> int:
        return len(self.episodes)

    @property
    def n_errors(self) -> int:
        return sum(1 for ep in self.episodes if ep.get("outcome") == "error")

    @property
    def explore_rate(self) -> float:
        """Fraction of episodes that looked at the data before answering: a DESCRIBE, SAMPLE or QUERY that ran
        without error came before the first ANSWER (babble parsed as a failing QUERY does not count)."""
        def looked(episode: dict) -> bool:
            for step in episode.get("steps", []):
                if step.get("action_type") == "ANSWER":
                    return False
                if not step.get("error"):
                    return True
            return False

        return sum(map(looked, self.episodes)) / len(self.episodes) if self.episodes else 0.0

    @property
    def execution_accuracy(self) -> float | None:
        """Fraction of episodes whose last successful QUERY matches the gold query under the official Spider rules
        (EX, `sqlenv.scoring.execution`), over the episodes that record it; None when none does (transcripts older than
        EX)."""
        return rate_cell(self.episodes)["execution_accuracy"]

    def breakdown(self) -> dict[str, Any]:
        """Success and EX overall, per hardness and per database, with counts and 95% intervals
        (`sqlenv.evaluation.breakdown.breakdown`)."""
        return breakdown(self.episodes)

    def outcomes(self) -> dict[str, int]:
        """How many episodes ended each way (correct, wrong_answer, budget_exhausted, ...)."""
        counts: dict[str, int] = {}
        for ep in self.episodes:
            counts[ep.get("outcome", "unknown")] = counts.get(ep.get("outcome", "unknown"), 0) + 1
        return counts

    def to_dict(self, include_episodes: bool = True) -> dict[str, Any]:
        cells = self.breakdown()
        data: dict[str, Any] = {
            "policy": self.policy,
            "seed": self.seed,
            "n_episodes": self.n_episodes,
            "success_rate": self.success_rate,
            "success_ci": cells["overall"]["success_ci"],
            "execution_accuracy": cells["overall"]["execution_accuracy"],
            "execution_ci": cells["overall"]["execution_ci"],
            "avg_reward": self.avg_reward,
            "avg_steps": self.avg_steps,
            "explore_rate": self.explore_rate,
            "n_errors": self.n_errors,
            "outcomes": self.outcomes(),
            "breakdown": cells,
        }
        if include_episodes:
            data["episodes"] = self.episodes
        return data

    @classmethod
    def from_episodes(cls, episodes: list[dict], policy: str | None = None, seed: int | None = None) -> "EvaluationResult":
        n = len(episodes)
        return cls(
            success_rate=sum(1 for ep in episodes if ep.get("correct")) / n if n else 0.0,
            avg_reward=sum(float(ep.get("total_reward", 0.0)) for ep in episodes) / n if n else 0.0,
            avg_steps=sum(int(ep.get("n_steps", 0)) for ep in episodes) / n if n else 0.0,
            episodes=episodes,
            policy=policy,
            seed=seed,
        )


def all_questions(env: Any) -> list[str]:
    """The ids of every question of `env`'s split, in file order: pass as `evaluate(..., question_ids=...)`."""
    return [q.question_id for q in env.questions]


def episode_plan(n_episodes: int | None, question_ids: Sequence[str] | None) -> tuple[int, list[str] | None]:
    """How many episodes an evaluation plays, and which questions (None: drawn by seed): `n_episodes`, defaulting to
    the number of `question_ids` and not exceeding it. Raises ValueError when neither is given or the count is bad."""
    if question_ids is not None:
        question_ids = list(question_ids)
        if n_episodes is None:
            n_episodes = len(question_ids)
        elif n_episodes > len(question_ids):
            raise ValueError(f"n_episodes={n_episodes} is more than the {len(question_ids)} question_ids given")
    if n_episodes is None:
        raise ValueError("give n_episodes, or question_ids to play")
    if n_episodes < 0:
        raise ValueError(f"n_episodes must be >= 0, got {n_episodes}")
    return n_episodes, question_ids


def evaluate(
    env: Any,
    policy: Any,
    n_episodes: int | None = None,
    seed: int = 0,
    progress_callback: ProgressCallback | None = None,
    *,
    question_ids: Sequence[str] | None = None,
) -> EvaluationResult:
    """Play `n_episodes` episodes of `policy` on `env` and score them.

    Args:
        env: a `SQLEnvironment` (anything with reset/step/transcript/question/state).
        policy: an object following `sqlenv.evaluation.policies.Policy` (`name`, `reset`, `act`).
        n_episodes: how many episodes to play; episode i is `env.reset(seed=seed + i)`. With `question_ids`
            it defaults to their number (and may not exceed it).
        seed: the first episode's seed. Same seed, same questions, whatever the policy.
        question_ids: play these questions, one episode each, in order: episode i is
            `env.reset(seed=seed + i, question_id=question_ids[i])` (the seed still drives a random policy).
            Default None: questions drawn by seed. `all_questions(env)` gives a whole split.
        progress_callback: called as `progress_callback(done, total, transcript)` after each episode,
            e.g. to drive a progress bar or stream transcripts to a UI.

    Returns:
        An `EvaluationResult`; its `episodes` are transcript dicts with `policy` and `seed` filled.
    """
    n_episodes, question_ids = episode_plan(n_episodes, question_ids)
    name = getattr(policy, "name", type(policy).__name__)
    episodes: list[dict] = []
    for i in range(n_episodes):
        episode_seed = seed + i
        question_id = question_ids[i] if question_ids is not None else None
        transcript = _play_episode(env, policy, episode_seed, question_id)
        transcript["policy"] = name
        transcript["seed"] = episode_seed
        episodes.append(transcript)
        if progress_callback is not None:
            progress_callback(i + 1, n_episodes, transcript)
    return EvaluationResult.from_episodes(episodes, policy=name, seed=seed)


def play_episode(env: Any, policy: Any, seed: int | None = None, question_id: str | None = None) -> dict:
    """Play one episode and return its transcript (policy and seed filled). Never raises."""
    transcript = _play_episode(env, policy, seed, question_id)
    transcript["policy"] = getattr(policy, "name", type(policy).__name__)
    transcript["seed"] = seed
    return transcript


def _play_episode(env: Any, policy: Any, seed: int | None, question_id: str | None = None) -> dict:
    started = False
    try:
        observation = env.reset(seed=seed, question_id=question_id) if question_id else env.reset(seed=seed)
        started = True
        policy.reset(env, observation)
        # The environment ends every episode within its budget; the cap only guards against a broken env.
        max_steps = max(int(getattr(observation, "budget_remaining", 0)), 0) + 5
        for _ in range(max_steps):
            if observation.done:
                break
            action = policy.act(env, observation)
            if not isinstance(action, SQLAction):
                raise TypeError(f"policy {getattr(policy, 'name', policy)!r} returned {type(action).__name__}, not SQLAction")
            observation = env.step(action)
        else:
            if not observation.done:
                raise RuntimeError(f"episode did not end within {max_steps} steps")
        return env.transcript()
    except Exception as exc:  # noqa: BLE001 - any failure is one failed episode, the run goes on
        return _error_transcript(env if started else None, exc)


def _error_transcript(env: Any, exc: BaseException) -> dict:
    """A transcript for an episode that raised: what was played so far, marked failed with the message."""
    message = f"{type(exc).__name__}: {exc}"
    transcript: dict[str, Any] = {}
    if env is not None:
        try:
            transcript = dict(env.transcript())
        except Exception:  # noqa: BLE001 - the environment itself may be what broke
            transcript = {}
        question = getattr(env, "question", None)
        if question is not None and not transcript:
            transcript = {
                "question_id": question.question_id,
                "question": question.question_text,
                "database": question.database_name,
                "difficulty": question.difficulty,
                "answer_type": question.answer_type,
                "gold_sql": question.gold_sql,
                "gold_answer": question.gold_answer,
            }
    defaults: dict[str, Any] = {
        "question_id": None,
        "question": None,
        "database": None,
        "difficulty": None,
        "answer_type": None,
        "gold_sql": None,
        "gold_answer": None,
        "steps": [],
        "answer": None,
        "reward_breakdown": {"operational": 0.0, "progress": 0.0, "correctness": 0.0, "total": 0.0},
        "total_reward": 0.0,
    }
    for key, value in defaults.items():
        transcript.setdefault(key, value)
    transcript["steps"] = list(transcript.get("steps") or [])
    transcript["n_steps"] = len(transcript["steps"])
    transcript["correct"] = False
    transcript["execution_match"] = False  # a failed episode fails both scores
    transcript["outcome"] = "error"
    transcript["error"] = message
    transcript["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
    return transcript
