"""`check_env(env)`: a gymnasium-style environment checker for `SQLEnvironment` (and look-alikes).

It plays a few short episodes and raises `EnvCheckError` naming the first broken promise: reset returns a
well-formed observation, every action type works, bad actions become error observations (never exceptions)
and use a step, the budget ends the episode, a step after the end changes nothing, and a seed makes reset
deterministic.
"""

from __future__ import annotations

from typing import Any

from sqlenv.types import ACTION_TYPES, SQLAction, SQLObservation


class EnvCheckError(AssertionError):
    """An environment breaks the SQLEnv contract."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise EnvCheckError(message)


def _check_observation(obs: Any, where: str) -> None:
    _require(isinstance(obs, SQLObservation), f"{where}: expected SQLObservation, got {type(obs).__name__}")
    for name, kind in (("question", str), ("schema_info", str), ("result", str), ("error", str),
                       ("step_count", int), ("budget_remaining", int), ("action_history", list),
                       ("done", bool), ("reward", float)):
        value = getattr(obs, name, None)
        if kind is float and isinstance(value, int):
            value = float(value)
        _require(isinstance(value, kind), f"{where}: observation.{name} should be {kind.__name__}, got {value!r}")
    _require(obs.budget_remaining >= 0, f"{where}: negative budget_remaining")
    obs.to_dict()  # must serialise


def _first_table(env: Any, obs: SQLObservation) -> str:
    tables = getattr(env, "tables", None)
    if tables:
        return tables[0]
    line = obs.schema_info.splitlines()[0] if obs.schema_info else ""
    return line.split(":", 1)[-1].split(",")[0].strip()


def check_env(env: Any, seed: int = 0) -> list[str]:
    """Check `env` against the SQLEnv contract; raise `EnvCheckError` on the first failure.

    Returns the list of checks that passed (handy for printing). The env is left after a finished episode.
    """
    passed: list[str] = []

    # 1. reset returns a fresh observation with the question and table names.
    obs = env.reset(seed=seed)
    _check_observation(obs, "reset()")
    _require(bool(obs.question), "reset(): empty question")
    _require(obs.step_count == 0 and not obs.done and obs.reward == 0.0, "reset(): not a fresh episode")
    _require(obs.budget_remaining > 0, "reset(): no step budget")
    table = _first_table(env, obs)
    _require(bool(table) and table in obs.schema_info, "reset(): schema_info does not list the tables")
    passed.append("reset returns a fresh observation")

    # 2. determinism: the same seed gives the same question and observation.
    again = env.reset(seed=seed)
    _require(again.question == obs.question and again.schema_info == obs.schema_info,
             "reset(seed=...) is not deterministic")
    passed.append("reset(seed) is deterministic")

    # 3. every action type runs and counts a step.
    budget = obs.budget_remaining
    actions = [SQLAction("DESCRIBE", table), SQLAction("sample", table),
               SQLAction("QUERY", f'SELECT count(*) FROM "{table}"')]
    for i, action in enumerate(actions, 1):
        o = env.step(action)
        _check_observation(o, f"step({action.action_type})")
        _require(o.error == "", f"step({action.action_type} {action.argument}) failed: {o.error}")
        _require(o.step_count == i and o.budget_remaining == budget - i, f"step({action.action_type}): step not counted")
        _require(bool(o.result), f"step({action.action_type}): empty result")
    described = env.last_observation.schema_info if hasattr(env, "last_observation") else ""
    _require(len(described.splitlines()) > 1, "DESCRIBE did not add columns to schema_info")
    passed.append("DESCRIBE, SAMPLE, QUERY run and count steps")

    # 4. bad actions are error observations that use a step, never exceptions.
    bad = [SQLAction("FLY", "away"), SQLAction("QUERY", ""), SQLAction("QUERY", "DROP TABLE x"),
           SQLAction("QUERY", "SELECT 1; SELECT 2"), SQLAction("DESCRIBE", "no_such_table_xyz"),
           SQLAction("QUERY", "SELECT \x00"), SQLAction("QUERY", "x" * 100_000)]
    steps = env.last_observation.step_count
    for action in bad:
        try:
            o = env.step(action)
        except Exception as err:  # the promise is: never raises
            raise EnvCheckError(f"step({action.action_type} {action.argument[:30]!r}) raised {err!r}") from err
        _check_observation(o, f"bad step({action.action_type})")
        if o.done:
            break
        steps += 1
        _require(o.error != "", f"bad action {action.action_type} {action.argument[:30]!r} gave no error")
        _require(o.step_count == steps, "a bad action did not use a step")
    passed.append("bad actions give error observations and use a step")

    # 5. ANSWER ends the episode; a step afterwards is an error and changes nothing.
    if not env.last_observation.done:
        o = env.step(SQLAction("ANSWER", "42"))
        _check_observation(o, "step(ANSWER)")
        _require(o.done, "ANSWER did not end the episode")
    final = env.last_observation
    after = env.step(SQLAction("QUERY", "SELECT 1"))
    _require(after.error != "" and after.reward == 0.0, "a step after the end should be an error with reward 0")
    _require(after.step_count == final.step_count and env.last_observation is final,
             "a step after the end changed the episode")
    passed.append("ANSWER ends the episode; later steps change nothing")

    # 6. the budget ends an episode that never answers.
    obs = env.reset(seed=seed + 1)
    for _ in range(obs.budget_remaining):
        o = env.step(SQLAction("QUERY", "SELECT 1"))
    _require(o.done and o.budget_remaining == 0, "running out of budget did not end the episode")
    passed.append("the step budget ends the episode")

    # 7. reward breakdown and transcript are exposed.
    breakdown = getattr(env, "reward_breakdown", None)
    _require(breakdown is not None and hasattr(breakdown, "to_dict"), "env.reward_breakdown missing")
    transcript = env.transcript()
    from sqlenv.transcript import validate_transcript

    try:
        validate_transcript(transcript)
    except ValueError as err:
        raise EnvCheckError(f"transcript(): {err}") from None
    _require(transcript["outcome"] == "budget_exhausted", "transcript outcome should be budget_exhausted")
    _require(abs(transcript["total_reward"] - sum(s["reward"] for s in transcript["steps"])) < 1e-6,
             "transcript total_reward is not the sum of its step rewards")
    passed.append("reward breakdown and transcript are consistent")
    _require(all(t in ACTION_TYPES for t in ("DESCRIBE", "SAMPLE", "QUERY", "ANSWER")), "action types changed")
    return passed
