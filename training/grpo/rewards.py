"""The three GRPO reward functions, one per SQLEnv reward layer, logged separately by TRL.

Each is a TRL reward callable `f(prompts, completions, **kwargs) -> list[float]`, one value per completion in
the order TRL passes them, and reads the episode outcome from wherever the rollout left it:

- environment path (`environment_factory=SQLEnvTRL`): `kwargs["environments"]`, the per-rollout instances;
- batched rollout path (`training.grpo.rollout.BatchedRollout`): the fields the rollout returned, forwarded by TRL as
  `kwargs["correctness"]`, `kwargs["progress"]`, `kwargs["operational"]` (lists, one value per completion).

TRL logs each as `rewards/<function name>/mean` and sums them with `GRPOConfig.reward_weights`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["reward_correctness", "reward_progress", "reward_operational", "REWARD_FUNCS", "REWARD_FIELDS"]

#: The rollout_func fields the reward functions read, by function.
REWARD_FIELDS = ("correctness", "progress", "operational")


def _progress_scale() -> float:
    from sqlenv.rewards import RewardConfig

    return RewardConfig().progress_scale


def _from_kwargs(field: str, n: int, kwargs: dict[str, Any]) -> list[float]:
    environments = kwargs.get("environments")
    if environments is not None:
        values = []
        for env in environments:
            breakdown = env.breakdown
            values.append(float(getattr(breakdown, field)))
        return values
    if field in kwargs and kwargs[field] is not None:
        values = [float(v) for v in kwargs[field]]
        if len(values) != n:
            raise ValueError(f"rollout field {field!r} has {len(values)} values for {n} completions")
        return values
    raise KeyError(
        f"no episode outcome for reward {field!r}: train with environment_factory=SQLEnvTRL, or return the "
        f"field {field!r} from rollout_func"
    )


def reward_correctness(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """1.0 when the episode ended with a correct ANSWER, else 0.0 (layer 3)."""
    return _from_kwargs("correctness", len(completions), kwargs)


def reward_progress(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """The episode's progress shaping, normalised to [0, 1]: the best query result's binned closeness to the
    gold result (layer 2 summed, divided by the environment's progress scale)."""
    scale = _progress_scale()
    if "environments" in kwargs and kwargs["environments"] is not None:
        scale = _env_progress_scale(kwargs["environments"], scale)
    return [min(1.0, max(0.0, v / scale)) for v in _from_kwargs("progress", len(completions), kwargs)]


def reward_operational(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """Sum of the episode's layer-1 signals: executed without error, new information, repeats, step cost;
    plus the adapter's charges: tool calls after the episode ended, and the step cost of the unused budget
    when the model stopped before answering (see `SQLEnvTRL.unfinished_penalty`).

    On the batched rollout path it also logs the tool-health metrics TRL logs itself on the environment path
    (`tools/call_frequency`: calls per episode, `tools/failure_frequency`: failed calls per call), from the rollout's
    `tool_calls` / `tool_failures` fields, and the sampled completions' mean token entropy
    (`health/sampled_entropy`, from its `sampled_entropy` field), through TRL's `log_metric`."""
    _log_tool_health(kwargs)
    return _from_kwargs("operational", len(completions), kwargs)


def _log_tool_health(kwargs: dict[str, Any]) -> None:
    log_metric, calls, failures = kwargs.get("log_metric"), kwargs.get("tool_calls"), kwargs.get("tool_failures")
    if log_metric is None or not calls or failures is None:
        return
    entropy = (kwargs.get("sampled_entropy") or [None])[0]
    if entropy is not None:
        log_metric("health/sampled_entropy", float(entropy))
    total = sum(calls)
    log_metric("tools/call_frequency", total / len(calls))
    log_metric("tools/failure_frequency", sum(failures) / total if total else 0.0)


def _env_progress_scale(environments: list, default: float) -> float:
    for env in environments:
        inner = getattr(env, "environment", None)
        if inner is not None:
            return float(inner.reward_config.progress_scale)
    return default


REWARD_FUNCS = [reward_correctness, reward_progress, reward_operational]
