"""`RemoteSQLEnvironment`: the `sqlenv.protocol.Environment` interface, played on a SQLEnv server.

    env = RemoteSQLEnvironment("http://127.0.0.1:8000", questions=load_questions(path), step_budget=10)
    obs = env.reset(question_id="builtin-music-0")      # sqlenv.types.SQLObservation, as in-process
    obs = env.step(SQLAction("QUERY", "SELECT count(*) FROM singer"))
    env.reward_breakdown, env.transcript(), env.close()

Code written against the `Environment` protocol (the TRL adapter, `sqlenv.evaluation.evaluate`, the policies) runs on it
unchanged: same observations, same rewards, same transcripts, because the server runs the same
`SQLEnvironment`. Each instance holds one WebSocket session (one episode at a time).

Faults keep `SQLEnvironment`'s contract. `reset` raises `ValueError` for a bad question id or seed (as
in-process) and keeps trying for `reconnect_timeout_s` when the server is unreachable (restarting), then
raises `ConnectionError`. `step` never raises: a message the server refuses becomes an error observation, and
a connection lost mid-episode (the server restarted or dropped the session) ends the episode with an error
observation (`done` and `truncated`, outcome "error"); the next `reset` connects again.

`questions` (this process's copy of the served questions, optional) supplies `question` (the oracle reads
it) and the gold fields of the transcript of an unfinished episode, which the server withholds until the
episode is over.
"""

from __future__ import annotations

import re
import time
from typing import Any, Iterable

from websockets.exceptions import WebSocketException

from sqlenv.environment import unpack_action
from sqlenv.rewards import RewardConfig
from sqlenv.server.client import SQLEnvClient
from sqlenv.server.models import SQLAction as WireAction
from sqlenv.transcript import make_step, make_transcript
from sqlenv.types import ACTION_TYPES, EpisodeState, Question, RewardBreakdown, RewardLayers, SQLObservation

__all__ = ["RemoteSQLEnvironment", "ServerError"]

_SERVER_ERROR = re.compile(r"^Server error: (.*) \(code: ([A-Z_]+)\)$", re.S)
# What a lost connection raises through OpenEnv's client: refused/failed connects, a socket closed under a
# request, a reply that never came.
_CONNECTION_ERRORS = (ConnectionError, OSError, WebSocketException, TimeoutError)


class ServerError(RuntimeError):
    """An error the server reported for a request (its message and OpenEnv's error code)."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(f"{message} ({code})" if code else message)
        self.message, self.code = message, code


def _server_error(err: RuntimeError) -> ServerError | None:
    """The server's message and code from OpenEnv's "Server error: ... (code: ...)" (None: not one)."""
    m = _SERVER_ERROR.match(str(err))
    return ServerError(m.group(1), m.group(2)) if m else None


class RemoteSQLEnvironment:
    """`SQLEnvironment` on a server: one session, one episode at a time. Close it when done (or use `with`).

    Args:
        base_url: the server, `http://host:port` (or `ws://...`).
        questions: the served questions, when this process has them (default none): `question` and the gold
            fields of unfinished transcripts come from them.
        step_budget: steps per episode, sent with every reset (default: the server's budget).
        reconnect_timeout_s: how long `reset` keeps trying an unreachable server, e.g. one restarting
            (default 30.0).
        connect_timeout_s: timeout of one connection attempt (default 10.0).
        message_timeout_s: longest wait for one reply (default 60.0; the sandbox stops a query after 5 s).
    """

    def __init__(self, base_url: str, questions: Iterable[Question] | None = None, step_budget: int | None = None,
                 *, reconnect_timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 message_timeout_s: float = 60.0):
        if step_budget is not None and int(step_budget) < 1:
            raise ValueError(f"step_budget must be at least 1, got {step_budget}")
        self.base_url = base_url
        self.questions: list[Question] = list(questions or [])
        self._by_id = {q.question_id: q for q in self.questions}
        self.step_budget = step_budget
        self.reconnect_timeout_s = float(reconnect_timeout_s)
        self._client = SQLEnvClient(base_url=base_url, connect_timeout_s=connect_timeout_s,
                                    message_timeout_s=message_timeout_s).sync()
        self.reward_config = RewardConfig()  # replaced by the server's at the first reset
        self.reward_breakdown = RewardBreakdown()
        self.state = EpisodeState(step_budget=int(step_budget or 0))
        self._episode_budget = 0  # the budget the server gave the current episode
        self.last_observation: SQLObservation | None = None
        self._question_id: str | None = None
        self._seed: int | None = None
        self._lost: str | None = None  # why the episode was lost, when it was
        self._outcome = "unfinished"
        self._steps: list[dict[str, Any]] = []  # this side's record, for the transcript of a lost episode
        self._closed = False

    # ------------------------------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None, question_id: str | None = None, *, step_budget: int | None = None,
              episode_id: str | None = None) -> SQLObservation:
        """Start an episode on the server: on `question_id`, or on a question drawn with `seed`.

        Args:
            seed: seeds the server's question draw.
            question_id: play this question (one the server does not serve raises `ValueError`).
            step_budget: steps allowed in this episode only (default None: `self.step_budget`, else the server's).
            episode_id: this episode's id on the server and in `state` (default None: the server draws one).
        """
        if self._closed:
            raise RuntimeError("this RemoteSQLEnvironment is closed")
        kwargs: dict[str, Any] = {}
        if seed is not None:
            kwargs["seed"] = seed
        if question_id is not None:
            kwargs["question_id"] = question_id
        budget = self.step_budget if step_budget is None else step_budget
        if budget is not None:
            kwargs["step_budget"] = int(budget)
        if episode_id is not None:
            kwargs["episode_id"] = episode_id
        deadline = time.monotonic() + self.reconnect_timeout_s
        pause = 0.1
        while True:
            try:
                result = self._client.reset(**kwargs)
                break
            except RuntimeError as err:
                reported = _server_error(err)
                if reported is None:
                    raise
                if reported.code == "EXECUTION_ERROR":  # the environment refused the arguments
                    raise ValueError(reported.message) from None
                raise reported from None
            except _CONNECTION_ERRORS as err:
                if time.monotonic() + pause > deadline:
                    raise ConnectionError(f"SQLEnv server at {self.base_url} unreachable for "
                                          f"{self.reconnect_timeout_s:g} s: {type(err).__name__}: {err}") from None
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
        meta = result.observation.metadata
        self.reward_config = RewardConfig(**meta.get("reward_config", {}))
        self._episode_budget = int(meta.get("step_budget") or 0)
        if self.step_budget is None and step_budget is None:  # later resets ask for the server's budget by name
            self.step_budget = self._episode_budget or None
        self._question_id = meta.get("question_id")
        self._seed = seed
        self._lost = None
        self._steps = []
        return self._accept(result.observation)

    def step(self, action: Any) -> SQLObservation:
        """Apply one action on the server and return the observation. Never raises."""
        if self._lost is not None or self.last_observation is None:
            return self._fail("No episode is running: call reset() first." if self._lost is None else
                              "The episode is over (the connection to the server was lost): call reset().")
        if self.last_observation.done:
            return self._fail("The episode is over: call reset() to start a new one.")
        action_type, argument = unpack_action(action)
        wire = WireAction(action_type=action_type, argument=argument)
        try:
            result = self._client.step(wire)
        except RuntimeError as err:
            reported = _server_error(err)
            if reported is None:
                raise
            return self._fail(f"The server refused the action: {reported.message}")
        except _CONNECTION_ERRORS as err:
            return self._lose(f"{type(err).__name__}: {err}", action_type, argument)
        if result.observation.metadata.get("episode_id") != self.state.episode_id:
            # A reply from a session without this episode: the connection dropped and OpenEnv's client opened a
            # new one (the server restarted, or it closed the old session).
            return self._lose("the server no longer has this episode (it restarted or closed the session)",
                              action_type, argument)
        obs = self._accept(result.observation)
        self._steps.append(self._step_record(action_type, argument, obs))
        return obs

    def _accept(self, wire) -> SQLObservation:
        meta = wire.metadata
        obs = wire.to_core()
        rb = meta.get("reward_breakdown") or {}
        self.reward_breakdown = RewardBreakdown(operational=float(rb.get("operational", 0.0)),
                                                progress=float(rb.get("progress", 0.0)),
                                                correctness=float(rb.get("correctness", 0.0)))
        self.state = EpisodeState(episode_id=meta.get("episode_id") or "", step_count=obs.step_count,
                                  question_id=meta.get("question_id"), done=obs.done, step_budget=self._episode_budget)
        self._outcome = meta.get("outcome", "unfinished")
        self.last_observation = obs
        return obs

    def _fail(self, message: str) -> SQLObservation:
        """An error observation that changes nothing (as `SQLEnvironment` answers a step it cannot take)."""
        base = self.last_observation
        return SQLObservation.no_episode(message) if base is None else base.refusal(message)

    def _lose(self, reason: str, action_type: str, argument: str) -> SQLObservation:
        """End the episode on this side: the server's copy is gone."""
        self._lost = reason
        self._outcome = "error"
        base = self.last_observation
        message = (f"Lost the connection to the SQLEnv server mid-episode ({reason}): the episode is over; "
                   "reset() starts a new one.")
        obs = SQLObservation(question=base.question, schema_info=base.schema_info, result="", error=message,
                             step_count=base.step_count + 1, budget_remaining=max(0, base.budget_remaining - 1),
                             action_history=list(base.action_history), done=True, reward=0.0,
                             reward_layers=RewardLayers(), truncated=True)  # cut short from outside
        self.state.done = True
        self.last_observation = obs
        self._steps.append(self._step_record(action_type, argument, obs))
        return obs

    @staticmethod
    def _step_record(action_type: str, argument: str, obs: SQLObservation) -> dict[str, Any]:
        kind = action_type.strip().upper()
        layers = obs.reward_layers.to_dict()
        return make_step(obs.step_count, kind if kind in ACTION_TYPES else action_type[:20], argument[:10_000],
                         obs.result, obs.error, obs.reward, layers, obs.budget_remaining, obs.done,
                         terminated=obs.terminated, truncated=obs.truncated)

    # ------------------------------------------------------------------------------------- read access
    @property
    def question(self) -> Question | None:
        """The current question, from `questions` (None when this process does not have it)."""
        return self._by_id.get(self._question_id) if self._question_id else None

    @property
    def outcome(self) -> str:
        return self._outcome

    def transcript(self, policy: str | None = None) -> dict[str, Any]:
        """The episode in the shared transcript format: the server's record (gold fields from `questions` while
        the episode runs), or this side's record of an episode whose connection was lost."""
        record = None
        if self._lost is None and self._question_id is not None:
            try:
                record = self._client.state().transcript
            except (RuntimeError, *_CONNECTION_ERRORS):
                record = None
        if record is None:
            record = self._local_transcript()
        question = self.question
        if question is not None and record.get("gold_sql") is None:
            record["gold_sql"], record["gold_answer"] = question.gold_sql, question.gold_answer
        record["policy"] = policy
        return record

    def _local_transcript(self) -> dict[str, Any]:
        answer = next((s["argument"] for s in reversed(self._steps) if s["action_type"] == "ANSWER"), None)
        record = make_transcript(self.question, policy=None, seed=self._seed, steps=self._steps, answer=answer,
                                 correct=self.reward_breakdown.correctness > 0, outcome=self.outcome,
                                 reward_breakdown=self.reward_breakdown)
        record["question_id"] = self._question_id  # known even when this process lacks the question
        if self._lost is not None:
            record["error"] = self._lost
        return record

    # ------------------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the session (the server closes its environment)."""
        if not self._closed:
            self._closed = True
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing a connection that is already gone
                pass

    def __enter__(self) -> "RemoteSQLEnvironment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
