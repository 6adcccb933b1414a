"""`SQLEnvClient`: the typed OpenEnv client of a SQLEnv server (one WebSocket session per client).

    from sqlenv.server.client import SQLEnvClient
    from sqlenv.server.models import SQLAction

    with SQLEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(question_id="builtin-music-0")
        result = env.step(SQLAction(action_type="DESCRIBE", argument="singer"))
        print(result.observation.result, result.reward, result.observation.metadata["reward_breakdown"])

    async with SQLEnvClient(base_url="http://127.0.0.1:8000") as env:  # or async, many sessions in one loop
        result = await env.reset(seed=3)

It is OpenEnv's `EnvClient` with SQLEnv's types: errors the server reports (a bad `reset` argument, a
malformed message) raise `RuntimeError("Server error: ...")`, a dropped connection raises the `websockets`
exception, and the next call connects again (a new session: the server forgets a session when its socket
closes). `sqlenv.server.remote.RemoteSQLEnvironment` builds `SQLEnvironment`'s interface on top of it.
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from sqlenv.server.models import EpisodeState, SQLAction, SQLObservation

__all__ = ["SQLEnvClient"]


class SQLEnvClient(EnvClient[SQLAction, SQLObservation, EpisodeState]):
    """Typed client of a SQLEnv server. Takes `EnvClient`'s arguments (`base_url`, timeouts, headers)."""

    def _step_payload(self, action: Any) -> dict[str, Any]:
        # A wire SQLAction, a sqlenv.types.SQLAction or anything with action_type and argument.
        if not isinstance(action, SQLAction):
            action = SQLAction.from_core(action)
        return action.model_dump(exclude_defaults=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SQLObservation]:
        fields = dict(payload.get("observation") or {})
        fields["reward"] = payload.get("reward")
        fields["done"] = bool(payload.get("done", False))
        observation = SQLObservation.model_validate(fields)
        return StepResult(observation=observation, reward=observation.reward, done=observation.done,
                          metadata=observation.metadata)

    def _parse_state(self, payload: dict[str, Any]) -> EpisodeState:
        return EpisodeState.model_validate(payload)
