"""`Environment`: the one interface of a SQLEnv environment, in-process or on a server.

`sqlenv.environment.SQLEnvironment` (in-process) and `sqlenv.server.remote.RemoteSQLEnvironment` (one session on
a SQLEnv server) implement it; `sqlenv.checker.check_env` verifies an implementation plays by it. The adapters
around an environment — the OpenEnv server's (`sqlenv.server.environment`), TRL's
(`training.environment.trl_env`), the evaluation loop — use only what is written here, so any of them runs on
either environment, and none reaches into an environment's private state:

    def play(env: Environment, policy) -> dict:               # e.g. a sqlenv.evaluation.policies.OraclePolicy
        obs = env.reset(seed=3, step_budget=10, episode_id="run-7/ep-1")
        policy.reset(env, obs)
        while not obs.done:                                    # obs.terminated: ANSWER; obs.truncated: budget
            obs = env.step(policy.act(env, obs))
        return env.transcript(policy=policy.name)

The read-only members (`state`, `question`, `last_observation`, `outcome`, `reward_breakdown`, `reward_config`)
describe the current episode; an implementation may hold them as plain attributes. `typing.Protocol` makes the
check structural: an environment need not inherit from this class, only have its members (`isinstance(env,
Environment)` checks that every member exists, not their signatures; `check_env` checks what they do).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from sqlenv.rewards import RewardConfig
from sqlenv.types import EpisodeState, Question, RewardBreakdown, SQLObservation

__all__ = ["Environment"]


@runtime_checkable
class Environment(Protocol):
    """A SQLEnv environment: one episode at a time, `reset` to start one, `step` to act in it."""

    @property
    def state(self) -> EpisodeState:
        """The current episode's bookkeeping: id, question id, steps taken, its step budget, whether it is over."""
        ...

    @property
    def question(self) -> Question | None:
        """The current question (None before the first reset, or when a remote environment lacks its record)."""
        ...

    @property
    def last_observation(self) -> SQLObservation | None:
        """The observation `reset` or the last `step` returned (None before the first reset)."""
        ...

    @property
    def outcome(self) -> str:
        """How the episode stands: one of `sqlenv.transcript.OUTCOMES` ("unfinished" while it runs)."""
        ...

    @property
    def reward_breakdown(self) -> RewardBreakdown:
        """The episode's reward so far, by layer."""
        ...

    @property
    def reward_config(self) -> RewardConfig:
        """The reward constants the episode is scored with (a remote environment's are the server's)."""
        ...

    def reset(self, seed: int | None = None, question_id: str | None = None, *, step_budget: int | None = None,
              episode_id: str | None = None) -> SQLObservation:
        """Start an episode and return its first observation.

        Args:
            seed: draws the question (same seed, same question); None draws from the environment's own sampler.
            question_id: play this question instead of drawing one. An unknown id raises `ValueError`.
            step_budget: steps allowed in this episode only (default None: the environment's budget); below 1
                raises `ValueError`.
            episode_id: the id this episode is known by in `state` (and, on a server, in every observation's
                metadata); default None: a fresh random one. For a caller that names episodes itself (OpenEnv's
                `reset(episode_id=...)`).
        """
        ...

    def step(self, action: Any) -> SQLObservation:
        """Apply one action (a `sqlenv.types.SQLAction`, a dict or a 2-tuple). Never raises: a bad action, a step
        with no episode running or after the end, is an error observation."""
        ...

    def transcript(self, policy: str | None = None) -> dict[str, Any]:
        """The current episode in the shared transcript format (`sqlenv.transcript`), `policy` recorded in it."""
        ...

    def close(self) -> None:
        """Release what the environment holds (database connections, a server session). Safe to call twice."""
        ...
