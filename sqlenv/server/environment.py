"""`SQLEnvServerEnvironment`: one `SQLEnvironment` behind OpenEnv's `Environment` interface.

The OpenEnv server (`sqlenv.server.app`) builds one instance per WebSocket session (and a short-lived one per
stateless HTTP call), so every session has its own episode and its own read-only database connections: a
slow query in one session never holds up another. What instances share is resolved once per server in a
`ServerConfig`: the questions, the database folder, the limits. The gold-result summaries are shared by the
whole process already (`sqlenv.environment`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

import sqlenv
from sqlenv import protocol
from sqlenv.environment import SQLEnvironment
from sqlenv.rewards import RewardConfig
from sqlenv.sandbox.sandbox import Sandbox, SandboxSettings
from sqlenv.server.models import EpisodeState, SQLAction, SQLObservation
from sqlenv.types import Question

__all__ = ["ServerConfig", "SessionCounter", "PythonSlots", "PYTHON_SLOTS_ENV",
           "SQLEnvServerEnvironment", "ResetArgumentError", "SessionClosedError",
           "MAX_STEP_BUDGET", "MAX_ID_CHARS", "MAX_STATE_TRANSCRIPT_CHARS", "step_activity", "SESSION_THREAD_NICE",
           "lower_session_thread"]

#: The largest step budget a client may ask for in `reset(step_budget=...)`.
MAX_STEP_BUDGET = 1000
#: The longest `question_id` or `episode_id` a reset accepts (ids are short names; a longer one is refused
#: without being read or sent back).
MAX_ID_CHARS = 255
#: The most text (characters of the steps' arguments, observations and errors, and the answer) the transcript in
#: a `state` reply carries; past it the reply leaves the transcript out. OpenEnv builds `state` replies on the
#: server's event loop, where every session's messages wait their turn: a 1,000-step episode of 10 KB arguments
#: once made 10 MB replies costing ~50 ms of it each. The bound leaves room for a 100-step episode at the
#: longest arguments and observations the environment keeps, or a 1 MB answer (an honest 15-step episode holds
#: ~40,000), and costs a few ms.
MAX_STATE_TRANSCRIPT_CHARS = 2_000_000
#: How much of a client's bad value an error message quotes.
_SHOWN_CHARS = 40


class ResetArgumentError(ValueError):
    """A `reset` argument the server refuses (a bad seed, question id, episode id or budget).

    A `ValueError`, as in-process; over HTTP `/reset` it is answered 422 with the message (`sqlenv.server.app`),
    over the WebSocket it is OpenEnv's `EXECUTION_ERROR` with the message."""


class SessionClosedError(RuntimeError):
    """The session's environment was closed (its connection ended or it sat idle too long): it plays no more."""


def _shown(value: Any) -> str:
    """A client's value as an error message quotes it: at most `_SHOWN_CHARS` characters of it, so a 1 MB value
    is not sent back (nor its repr built)."""
    if isinstance(value, str):
        head = repr(value[:_SHOWN_CHARS])
        return head if len(value) <= _SHOWN_CHARS else f"{head}… ({len(value):,} characters)"
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)  # a JSON integer has at most 4,300 digits (Python's own limit)
        return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}… ({len(text):,} digits)"
    return f"a {type(value).__name__}"  # a list or an object: its type says enough


#: How far below the event loop's a session's thread runs (Linux nice, added to the process's own; 19 at most).
#: The loop relays every session's messages and answers `/health`; a session's statements are up to 5 s of a
#: core each, and a few hostile sessions' statements take both cores: at equal priority the loop waited its
#: turn among them (0.2-0.4 s of every second in the soak). Below it, they take what the loop leaves.
SESSION_THREAD_NICE = 10

_LOWERED = threading.local()


def lower_session_thread() -> None:
    """Run the calling thread `SESSION_THREAD_NICE` below the process's priority, once per thread: the thread a
    session's environment is built, reset and stepped on (OpenEnv's executor threads). Never a thread running an
    event loop (OpenEnv builds the environment of an HTTP `/reset` or `/step` on the loop itself) nor the main
    thread (where `serve` runs the loop, and a test or a script builds environments in-process), and only on
    Linux, where a thread's priority is its own (elsewhere the call would name another process)."""
    if getattr(_LOWERED, "done", False) or threading.current_thread() is threading.main_thread():
        return
    try:
        asyncio.get_running_loop()
        return  # an event loop's thread
    except RuntimeError:
        pass
    _LOWERED.done = True
    if sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + SESSION_THREAD_NICE))
    except OSError:  # not allowed here: the thread keeps its priority
        pass


#: The environment variable `serve` reads the number of Python slots from (`PythonSlots`; unset: no bound).
PYTHON_SLOTS_ENV = "SQLENV_PYTHON_SLOTS"


class PythonSlots:
    """How many sessions' threads may run a reset's or step's Python work at once, process-wide (None: no bound,
    the default; the count of threads in that work is kept either way, for the bench's loop probe).

    Every session steps on a thread of its own, and Python runs one thread at a time (the interpreter lock): the
    server's event loop, which answers `/health` and relays every session's messages, lets go of the lock at
    every system call and must win it back from every thread that wants it. A bound keeps those threads few. A
    thread holds a slot while its step runs Python (parsing, pricing, formatting, scoring) and gives it back
    while the sandbox runs a statement or opens a database, where SQLite works without the lock: a 5 s hostile
    query holds no slot, so it never holds up another session's step (`tests/test_server_slots.py`). Off by
    default: in the soak two slots left `/health` as slow as none (3.2 s against 3.5 s; the wait was in the
    accept queue, docs/EXPERIMENTS.md section 12).

    Re-entrant per thread (a step that opens a database inside a statement's call gives its slot back once)."""

    def __init__(self, slots: int | None = None):
        if slots is not None and int(slots) < 1:
            raise ValueError(f"Python slots must be at least 1, got {slots}")
        self.slots = None if slots is None else int(slots)
        self._free = None if self.slots is None else threading.BoundedSemaphore(self.slots)
        self._mine = threading.local()
        self._count_lock = threading.Lock()
        self.held_now = 0

    @contextlib.contextmanager
    def held(self):
        """Hold a slot for the block (wait for one first), unless this thread holds one already."""
        if getattr(self._mine, "held", False):
            yield
            return
        self._take()
        try:
            yield
        finally:
            self._give()

    @contextlib.contextmanager
    def released(self):
        """Give this thread's slot back for the block (SQLite's work), and take one again after it."""
        if not getattr(self._mine, "held", False):
            yield
            return
        self._give()
        try:
            yield
        finally:
            self._take()

    def _take(self) -> None:
        if self._free is not None:
            self._free.acquire()
        self._mine.held = True
        with self._count_lock:
            self.held_now += 1

    def _give(self) -> None:
        with self._count_lock:
            self.held_now -= 1
        self._mine.held = False
        if self._free is not None:
            self._free.release()


class _SlotSandbox(Sandbox):
    """The sandbox of a server session: its statements and database openings run without the session's Python
    slot (`PythonSlots.released`). The methods that run a statement or open a database are the public ones;
    what they do is `Sandbox`'s."""

    def __init__(self, db_dir: Path, settings: SandboxSettings, slots: PythonSlots):
        super().__init__(db_dir, settings)
        self._slots = slots

    def database(self, name: str):
        with self._slots.released():
            return super().database(name)

    def execute(self, *args: Any, **kwargs: Any):
        with self._slots.released():
            return super().execute(*args, **kwargs)

    def row_count(self, db_name: str, table: str) -> int:
        with self._slots.released():
            return super().row_count(db_name, table)

    def sample(self, db_name: str, table: str) -> str:
        with self._slots.released():
            return super().sample(db_name, table)


class _StepActivity:
    """How many resets and steps the process's environments are running right now (read by the bench's loop
    probe, `sqlenv.server.loop_probe`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0

    def __enter__(self) -> None:
        with self._lock:
            self.running += 1

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self.running -= 1


_ACTIVITY = _StepActivity()


_SLOTS_IN_USE: list[PythonSlots] = []  # the slots of the servers in this process (one, but for tests)


def step_activity() -> tuple[int, int]:
    """(resets and steps running now, those of them holding a Python slot)."""
    return _ACTIVITY.running, sum(slots.held_now for slots in _SLOTS_IN_USE)


class SessionCounter:
    """How many environments the server holds open right now (a leak shows as a count that never drops)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0

    def opened(self) -> None:
        with self._lock:
            self._open += 1

    def closed(self) -> None:
        with self._lock:
            self._open -= 1

    @property
    def open(self) -> int:
        return self._open


@dataclass
class ServerConfig:
    """What every session of one server plays, resolved once when the server starts.

    Args:
        questions: the questions served (one split of a prepared dataset).
        db_dir: the folder of `<db_id>/<db_id>.sqlite` files.
        dataset: the dataset's name, shown in `/metadata` (default "").
        split: the split served, shown in `/metadata` (default "").
        step_budget: steps per episode when `reset` does not ask for another budget (default 15).
        reward_config: reward constants (default `RewardConfig()`); sent to clients at each reset.
        sandbox: sandbox limits (default `SandboxSettings()`).
        sessions: the open-environment counter the app reports at `/sessions`.
        python_slots: how many sessions may run a reset's or step's Python work at once (a `PythonSlots`, or
            a number; default no bound).

    `question_ids` (derived) is the set of the served questions' ids, so a reset checks an id without a scan.
    """

    questions: list[Question]
    db_dir: Path
    dataset: str = ""
    split: str = ""
    step_budget: int = 15
    reward_config: RewardConfig = field(default_factory=RewardConfig)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    sessions: SessionCounter = field(default_factory=SessionCounter)
    python_slots: PythonSlots = field(default_factory=PythonSlots)
    question_ids: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.questions:
            raise ValueError("ServerConfig needs at least one question")
        if not 1 <= int(self.step_budget) <= MAX_STEP_BUDGET:
            raise ValueError(f"step_budget must be between 1 and {MAX_STEP_BUDGET}, got {self.step_budget}")
        self.question_ids = frozenset(q.question_id for q in self.questions)
        if isinstance(self.python_slots, int):
            self.python_slots = PythonSlots(self.python_slots)

    @classmethod
    def from_dataset(cls, name_or_path: str | Path = "builtin", split: str = "train", data_root=None,
                     **kwargs: Any) -> "ServerConfig":
        """The config serving one split of a prepared dataset ("builtin", a name under `data/`, or a path)."""
        from sqlenv.data.datasets import load_questions, resolve_dataset

        info = resolve_dataset(name_or_path, data_root=data_root)
        questions = load_questions(info.questions_path(split))
        return cls(questions=questions, db_dir=info.db_dir, dataset=info.name, split=split, **kwargs)


class SQLEnvServerEnvironment(Environment[SQLAction, SQLObservation, EpisodeState]):
    """A `SQLEnvironment` as an OpenEnv environment (one per session; build it with `functools.partial`).

    `reset` takes OpenEnv's `seed` and `episode_id`, plus `question_id` (play this question) and `step_budget`
    (1..1000, default the server's). A bad value raises `ResetArgumentError` (a `ValueError`), which the server
    sends back as an error message quoting at most a short prefix of the value; `step` never raises for an
    action (bad actions are error observations, as in-process).

    Once closed (the server closes a session's environment when its connection ends or goes idle) the
    instance refuses `reset`, `step` and `state` with `SessionClosedError`: a connection that outlived its
    session cannot go on playing outside the session limit.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: ServerConfig):
        lower_session_thread()
        super().__init__()
        self.config = config
        # Used only through the `sqlenv.protocol.Environment` interface.
        self._slots = config.python_slots
        if self._slots not in _SLOTS_IN_USE:
            _SLOTS_IN_USE.append(self._slots)
        self._env: protocol.Environment = SQLEnvironment(
            config.questions, config.db_dir, step_budget=config.step_budget, reward_config=config.reward_config,
            sandbox=_SlotSandbox(config.db_dir, config.sandbox, self._slots))
        self._reward_config = asdict(config.reward_config)  # sent with every reset
        self._closed = False
        config.sessions.opened()

    # ---------------------------------------------------------------------------------------- episode
    def reset(self, seed: int | None = None, episode_id: str | None = None, question_id: str | None = None,
              step_budget: int | None = None, **kwargs: Any) -> SQLObservation:
        """Start an episode on `question_id`, or on a question drawn with `seed` (same seed, same question)."""
        lower_session_thread()
        self._check_open()
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ResetArgumentError(f"seed must be an integer, got {type(seed).__name__}")
        if question_id is not None:
            if not isinstance(question_id, str):
                raise ResetArgumentError(f"question_id must be a string, got {type(question_id).__name__}")
            if len(question_id) > MAX_ID_CHARS:
                raise ResetArgumentError(f"question_id must be at most {MAX_ID_CHARS} characters, got "
                                         f"{len(question_id):,}")
            if question_id not in self.config.question_ids:
                some = ", ".join(q.question_id for q in self.config.questions[:5])
                raise ResetArgumentError(f"unknown question_id {_shown(question_id)} (e.g. {some}; "
                                         f"{len(self.config.questions)} in all)")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > MAX_ID_CHARS):
            raise ResetArgumentError(f"episode_id must be a string of at most {MAX_ID_CHARS} characters")
        budget = self.config.step_budget if step_budget is None else step_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_STEP_BUDGET:
            raise ResetArgumentError(f"step_budget must be an integer from 1 to {MAX_STEP_BUDGET}, "
                                     f"got {_shown(step_budget)}")
        with _ACTIVITY, self._slots.held():
            obs = self._env.reset(seed=seed, question_id=question_id, step_budget=budget, episode_id=episode_id)
            meta = self._metadata(obs)
            meta["step_budget"] = budget
            meta["reward_config"] = dict(self._reward_config)
            return SQLObservation.from_core(obs, meta)

    def step(self, action: SQLAction, timeout_s: float | None = None, **kwargs: Any) -> SQLObservation:
        """Apply one action (the sandbox's own time limit bounds it; `timeout_s` is not used)."""
        lower_session_thread()
        self._check_open()
        with _ACTIVITY, self._slots.held():
            obs = self._env.step(action.to_core() if isinstance(action, SQLAction) else action)
            return SQLObservation.from_core(obs, self._metadata(obs))

    def _metadata(self, obs) -> dict[str, Any]:
        env = self._env
        return {"episode_id": env.state.episode_id or None, "question_id": env.state.question_id,
                "outcome": env.outcome, "reward_layers": obs.reward_layers.to_dict(),
                "reward_breakdown": env.reward_breakdown.to_dict()}

    @property
    def state(self) -> EpisodeState:
        """The episode and its transcript (gold withheld until done); a transcript holding more than
        `MAX_STATE_TRANSCRIPT_CHARS` characters of text (steps and answer) is left out, and `transcript_omitted`
        says why.

        OpenEnv reads this property and serializes it on the server's event loop, so what it costs is bounded
        here: building the transcript is cheap, its JSON is not."""
        self._check_open()
        env = self._env
        transcript, omitted = None, ""
        if env.question is not None:
            transcript = env.transcript()
            if not env.state.done:  # the answer stays on the server until the episode is over
                transcript["gold_sql"] = transcript["gold_answer"] = None
            size = _text_chars(transcript)
            if size > MAX_STATE_TRANSCRIPT_CHARS:
                transcript = None
                omitted = (f"the episode's transcript holds {size:,} characters of text, more than the "
                           f"{MAX_STATE_TRANSCRIPT_CHARS:,} a state reply carries; every step's observation "
                           "was sent with its reply")
        return EpisodeState(episode_id=env.state.episode_id or None, step_count=env.state.step_count,
                            question_id=env.state.question_id, done=env.state.done, step_budget=env.state.step_budget,
                            outcome=env.outcome, reward_breakdown=env.reward_breakdown.to_dict(),
                            transcript=transcript, transcript_omitted=omitted)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("This session is closed (its connection ended or it was idle past the "
                                     "server's session timeout): connect again for a new session.")

    def get_metadata(self) -> EnvironmentMetadata:
        served = f"{self.config.dataset or 'a dataset'}, split {self.config.split or '?'}"
        return EnvironmentMetadata(
            name="sqlenv",
            description=("Answer a question about a SQLite database like an analyst: DESCRIBE and SAMPLE tables, "
                         f"QUERY with one read-only SELECT, then ANSWER. Serving {served} "
                         f"({len(self.config.questions)} questions)."),
            version=sqlenv.__version__,
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()
            self.config.sessions.closed()


def _text_chars(transcript: dict[str, Any]) -> int:
    """Characters of text in a transcript's steps and answer: what its JSON's size grows with."""
    total = len(transcript.get("answer") or "")
    for step in transcript.get("steps") or ():
        for value in step.values():
            if isinstance(value, str):
                total += len(value)
    return total
