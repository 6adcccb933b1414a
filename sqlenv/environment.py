"""`SQLEnvironment`: the episode loop (gymnasium-like `reset` / `step` / `state`).

An episode is one question about one SQLite database. The agent sees the question and the table names and
acts with DESCRIBE, SAMPLE, QUERY and ANSWER under a step budget. `step()` never raises: every bad action
becomes an error observation. SQL safety lives in `sqlenv.sandbox`, reward constants in `sqlenv.rewards`,
answer checking in `sqlenv.scoring.verifier`, and the episode record in `sqlenv.transcript`.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable

from sqlenv.data.dataset_dir import load_questions
from sqlenv.data.datasets import resolve_dataset
from sqlenv.scoring.execution import ExecutionNotScored, execution_match, gold_result
from sqlenv.kept_results import KEPT_RESULTS, Kept
from sqlenv.rewards import GoldProfile, RewardConfig, progress_score
from sqlenv.sandbox.result_text import clean_for_display as _clean_for_display
from sqlenv.sandbox.result_text import cut_text
from sqlenv.sandbox.sandbox import Sandbox, SandboxError, SandboxSettings
from sqlenv.sandbox.sql_checks import SeenQueries, sql_too_long, table_name_too_long
from sqlenv.transcript import make_step, make_transcript
from sqlenv.types import (ACTION_TYPES, EpisodeState, Question, RewardBreakdown, RewardLayers, SQLAction,
                          SQLObservation)
from sqlenv.scoring.verifier import MAX_ANSWER_CHARS, verify_answer

_ARGUMENT_HELP = {
    "DESCRIBE": "DESCRIBE needs a table name, e.g. DESCRIBE {table}.",
    "SAMPLE": "SAMPLE needs a table name, e.g. SAMPLE {table}.",
    "QUERY": "QUERY needs one SELECT statement, e.g. QUERY SELECT count(*) FROM {table}.",
    "ANSWER": "ANSWER needs the answer value, e.g. ANSWER 42.",
}
# Gold profiles, shared by all environments of the process (they are read-only once built) so 32 parallel
# environments run each gold query once, not 32 times. Keyed by the database file's identity and the limits.
_GOLD_CACHE_SIZE = 4096
_GOLD_CACHE: OrderedDict[tuple, GoldProfile | None] = OrderedDict()
_GOLD_LOCK = threading.Lock()
# Longest action type looked at: longer text is no action type, and is never copied or kept.
_MAX_ACTION_TYPE_CHARS = 32


class SQLEnvironment:
    """The SQL-exploration environment.

    Args:
        questions_path: a `questions_<split>.json` file (or an iterable of `Question`s / dicts).
        db_dir: folder holding `<db_id>/<db_id>.sqlite` files.
        step_budget: steps per episode (default 15); running out ends the episode with terminal reward 0.
        reward_config: reward constants (default `RewardConfig()`).
        sandbox: sandbox limits (`SandboxSettings`, default `SandboxSettings()`).
        seed: seeds the question sampler used by `reset()` without a seed.
    """

    def __init__(self, questions_path: str | Path | Iterable, db_dir: str | Path, step_budget: int = 15,
                 reward_config: RewardConfig | None = None, sandbox: SandboxSettings | None = None,
                 seed: int | None = None):
        if isinstance(questions_path, (str, Path)):
            self.questions_path: Path | None = Path(questions_path)
            self.questions: list[Question] = load_questions(questions_path)
        else:
            self.questions_path = None
            self.questions = [q if isinstance(q, Question) else Question.from_dict(q) for q in questions_path]
        if not self.questions:
            raise ValueError(f"no questions in {questions_path}")
        if int(step_budget) < 1:
            raise ValueError(f"step_budget must be at least 1, got {step_budget}")
        self.db_dir = Path(db_dir)
        self.step_budget = int(step_budget)
        self.reward_config = reward_config or RewardConfig()
        self.sandbox_settings = sandbox if isinstance(sandbox, SandboxSettings) else SandboxSettings()
        self.sandbox = sandbox if isinstance(sandbox, Sandbox) else Sandbox(self.db_dir, self.sandbox_settings)
        if isinstance(sandbox, Sandbox):
            self.sandbox_settings = sandbox.settings
        settings = self.sandbox_settings
        # The door: one length limit per action type, checked before any work, cache or record sees the argument.
        self._argument_limits = {"DESCRIBE": settings.max_name_chars, "SAMPLE": settings.max_name_chars,
                                 "QUERY": settings.max_sql_chars, "ANSWER": MAX_ANSWER_CHARS}
        self._by_id = {q.question_id: i for i, q in enumerate(self.questions)}
        self.dataset = None  # the DatasetInfo when built by from_dataset
        self._rng = random.Random(seed)
        # Episode ids need only be unique, not secret: drawn without a system call per reset, and apart from
        # the question sampler so they never shift the seeded question sequence.
        self._episode_ids = random.Random()

        self.question: Question | None = None
        self.state = EpisodeState(step_budget=self.step_budget)
        self.reward_breakdown = RewardBreakdown()
        self.last_observation: SQLObservation | None = None
        self._clear_episode()

    # ------------------------------------------------------------------------------------------ factory
    @classmethod
    def from_dataset(cls, name_or_path: str | Path = "builtin", split: str = "train", data_root=None,
                     **kwargs) -> "SQLEnvironment":
        """An environment over a prepared dataset: "builtin", a name prepared under `data/`, a path, or a
        `DatasetInfo` already resolved."""
        info = resolve_dataset(name_or_path, data_root=data_root)
        env = cls(info.questions_path(split), info.db_dir, **kwargs)
        env.dataset = info
        return env

    # ------------------------------------------------------------------------------------------ episode
    def _clear_episode(self) -> None:
        self._seen_actions: set = set()  # (kind, normal form) of the DESCRIBE / SAMPLE / ANSWER arguments
        self._seen_queries = SeenQueries(self.sandbox_settings.max_sql_chars)  # QUERY texts (their normal forms)
        self._seen_results: set = set()
        self._described: list[str] = []
        self._sampled: set[str] = set()
        self._columns: dict[str, str] = {}
        self._schema_text = ""  # schema_info, extended on each new DESCRIBE (built once, read every step)
        self._history: list[str] = []
        self._steps: list[dict] = []
        self._best_progress = 0.0
        self._answer: str | None = None
        self._correct = False
        self._outcome = "unfinished"
        # The last successful QUERY's result (a handle: the process bounds what all environments keep, and may
        # drop it) and SQL: EX is scored on them by the step that ends the episode.
        self._kept: Kept | None = None
        self._last_sql: str | None = None
        self._execution_match: bool | None = None
        self._execution_note: str | None = None  # why a finished episode's EX is unknown
        self._tables: list[str] = []
        self._gold: GoldProfile | None = None
        self._seed: int | None = None

    def reset(self, seed: int | None = None, question_id: str | None = None, *, step_budget: int | None = None,
              episode_id: str | None = None) -> SQLObservation:
        """Start an episode: on `question_id`, or a question drawn with `seed` (same seed → same question).

        Args:
            seed: seeds the question draw (and the sampler of later seedless resets); None continues the sampler.
            question_id: play this question (an unknown id raises `ValueError`).
            step_budget: steps allowed in this episode only (default None: `self.step_budget`); below 1 raises
                `ValueError`.
            episode_id: this episode's `state.episode_id` (default None: a fresh random id).
        """
        budget = self.step_budget if step_budget is None else step_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"step_budget must be an integer of at least 1, got {step_budget!r}")
        if episode_id is not None and not isinstance(episode_id, str):
            raise ValueError(f"episode_id must be a string, got {type(episode_id).__name__}")
        if question_id is not None:
            if question_id not in self._by_id:
                some = ", ".join(list(self._by_id)[:5])
                raise ValueError(f"unknown question_id {question_id!r} (e.g. {some}; {len(self._by_id)} in all)")
            index = self._by_id[question_id]
            if seed is not None:
                self._rng = random.Random(seed)
        else:
            if seed is not None:
                self._rng = random.Random(seed)
            index = self._rng.randrange(len(self.questions))
        question = self.questions[index]
        try:
            tables = self.sandbox.table_names(question.database_name)
        except SandboxError as err:
            raise ValueError(f"question {question.question_id}: {err}") from None

        self._clear_episode()
        self._seed = seed
        self.question = question
        self._tables = tables
        self._schema_text = "Tables: " + ", ".join(tables)
        self._gold = self._gold_profile(question)
        if self._gold is not None:  # EX's own gold result (official rules), so the episode's end only looks it up
            gold_result(self.sandbox, question.database_name, question.gold_sql)
        if episode_id is None:
            episode_id = f"{self._episode_ids.getrandbits(48):012x}"
        self.state = EpisodeState(episode_id=episode_id, step_count=0, question_id=question.question_id, done=False,
                                  step_budget=budget)
        self.reward_breakdown = RewardBreakdown()
        self.last_observation = self._observation(result="", error="", reward=RewardLayers())
        return self.last_observation

    def _gold_profile(self, question: Question) -> GoldProfile | None:
        """Summary of the gold result for progress scoring: the gold SQL run through the sandbox (once per
        question and database file in this process; the profile is shared read-only)."""
        settings = self.sandbox_settings
        try:
            identity = self.sandbox.database(question.database_name).identity
        except SandboxError:
            return None
        key = (identity, question.gold_sql, settings.max_scoring_rows, settings.max_result_bytes,
               self.reward_config.max_numbers)
        with _GOLD_LOCK:
            if key in _GOLD_CACHE:
                _GOLD_CACHE.move_to_end(key)
                return _GOLD_CACHE[key]
        try:
            result = self.sandbox.execute(question.database_name, question.gold_sql)
            profile = GoldProfile.from_rows(result.rows, result.n_rows, self.reward_config.max_numbers)
            profile.columns = list(result.columns)  # EX keeps its own gold result (`sqlenv.scoring.execution`)
        except SandboxError:
            profile = None  # no progress signal for this question, the episode still works
        with _GOLD_LOCK:
            _GOLD_CACHE[key] = profile
            while len(_GOLD_CACHE) > _GOLD_CACHE_SIZE:
                _GOLD_CACHE.popitem(last=False)
        return profile

    # --------------------------------------------------------------------------------------------- step
    def step(self, action: SQLAction | Any) -> SQLObservation:
        """Apply one action and return the observation. Never raises.

        The step that ends the episode (an ANSWER, or the budget's last step) also scores its execution accuracy
        (`execution_match`), within what is left of the step's time limit: the step's work, its query and EX's
        together, ends within `timeout_s` (plus the sandbox's bound on uninterruptible work)."""
        try:
            return self._step(action)
        except Exception as err:  # a bug must not kill a training run: report it as an error observation
            return self._fail(f"Internal error while running the action: {type(err).__name__}: "
                              f"{_clean_for_display(str(err), 200)}")

    def _fail(self, message: str) -> SQLObservation:
        """An error observation that changes nothing (no episode, or the episode is over)."""
        base = self.last_observation
        return SQLObservation.no_episode(message) if base is None else base.refusal(message)

    def _step(self, action: Any) -> SQLObservation:
        if self.question is None:
            return self._fail("No episode is running: call reset() first.")
        if self.state.done:
            return self._fail("The episode is over: call reset() to start a new one.")

        deadline = time.monotonic() + self.sandbox_settings.timeout_s  # the step's time, EX included
        action_type, argument = unpack_action(action)
        kind = action_type.strip().upper() if len(action_type) <= _MAX_ACTION_TYPE_CHARS else ""
        cfg = self.reward_config
        self.state.step_count += 1

        result, error, new_info, progress, terminal = "", "", False, 0.0, 0.0
        terminated = truncated = False  # Gymnasium's two ends: ANSWER terminates, the budget truncates
        summary = ""
        # The door: an argument over its action's limit is refused before it is stripped, parsed, cached or
        # stored (a refused 15 MB QUERY used to stay in the process's caches, a 15 MB table name in this episode).
        limit = self._argument_limits.get(kind)
        at_door = limit is not None and len(argument) > limit
        if at_door:
            arg, repeat = "", False
            error = self._too_long(kind, len(argument), limit)
        else:
            arg = argument.strip() if kind in ACTION_TYPES else ""  # an unknown type's argument is never read
            if kind == "QUERY":
                repeat = self._seen_queries.add(arg)
            else:
                repeat_key = (kind, self._normalize_argument(kind, arg))
                repeat = repeat_key in self._seen_actions
                self._seen_actions.add(repeat_key)

        if error:
            pass
        elif kind not in ACTION_TYPES:
            error = (f"Unknown action type {_clean_for_display(action_type, 40)!r}. "
                     f"Use one of: {', '.join(ACTION_TYPES)}.")
        elif not arg:
            error = _ARGUMENT_HELP[kind].format(table=self._tables[0] if self._tables else "t")
        elif kind in ("DESCRIBE", "SAMPLE"):
            try:
                info = self.sandbox.find_table(self.question.database_name, arg)
                if kind == "DESCRIBE":
                    result = self.sandbox.describe(self.question.database_name, info.name)
                    new_info = info.name not in self._described
                    if new_info:
                        self._described.append(info.name)
                        self._columns[info.name] = ", ".join(
                            " ".join([c, t or "ANY"] + (["PK"] if pk else [])
                                     + ([f"-> {info.foreign_keys[c]}"] if c in info.foreign_keys else []))
                            for c, t, pk in info.columns)
                        self._schema_text += f"\n{info.name}({self._columns[info.name]})"
                    summary = f"{len(info.columns)} columns"
                else:
                    result = self.sandbox.sample(self.question.database_name, info.name)
                    new_info = info.name not in self._sampled
                    self._sampled.add(info.name)
                    summary = "sampled"
            except SandboxError as err:
                error = str(err)
        elif kind == "QUERY":
            try:
                res = self.sandbox.execute(self.question.database_name, arg)
                result = self.sandbox.render(res)
                key = (res.n_rows, result)  # the result as the agent sees it (hashing text is cheap)
                new_info = key not in self._seen_results
                self._seen_results.add(key)
                if self._gold is not None:
                    score = progress_score(res.rows, res.n_rows, self._gold, cfg)
                    before = self._best_progress
                    if score > before:  # shaping rewards only a new best (it is 0 otherwise)
                        self._best_progress = score
                        progress = cfg.shaping(before, score)
                self._kept = None  # the previous result is freed before the new one is counted
                self._kept = KEPT_RESULTS.keep(res, self.sandbox_settings.max_kept_result_bytes)
                self._last_sql = arg
                summary = f"{res.n_rows} row{'s' if res.n_rows != 1 else ''}"
            except SandboxError as err:
                error = str(err)
        else:  # ANSWER
            q = self.question
            self._answer = _utf8(argument)
            # The gold SQL's ORDER BY is parsed only when a table is answered, never at reset (the GRPO dataset
            # resets every train question once).
            self._correct = verify_answer(argument, q.gold_answer, q.answer_type, gold_sql=q.gold_sql,
                                          columns=self._gold.columns if self._gold is not None else None)
            terminal = cfg.correct_answer if self._correct else 0.0
            self._outcome = "correct" if self._correct else "wrong_answer"
            self.state.done = terminated = True
            result = "Answer submitted: correct." if self._correct else "Answer submitted: incorrect."
            summary = "correct" if self._correct else "incorrect"

        ok = not error
        operational, progress = cfg.clip_dense(cfg.operational(ok=ok, new_info=new_info, repeat=repeat), progress)
        if not self.state.done and self.state.step_count >= self.state.step_budget:
            self.state.done = truncated = True
            self._outcome = "budget_exhausted"
            result = (result + "\n" if result else "") + "Step budget exhausted: the episode is over."
        layers = RewardLayers(operational=operational, progress=progress, terminal=terminal)
        total = layers.total
        breakdown = self.reward_breakdown
        breakdown.operational += operational
        breakdown.progress += progress
        if self._correct and kind == "ANSWER":
            breakdown.correctness += 1.0

        limit = self.sandbox_settings.max_observation_chars
        error = cut_text(error, limit)
        result = cut_text(result, limit)
        known = kind in ACTION_TYPES
        if at_door:  # an excerpt, whatever the argument's size
            shown_arg, shown_kind = _clean_for_display(argument, 60), kind
        elif known:
            head = arg[:60]
            if head.isprintable():
                shown_arg = head if len(arg) <= 60 else head[:59] + "…"
            else:
                shown_arg = _clean_for_display(arg, 60)
            shown_kind = kind
        else:
            shown_arg = _clean_for_display(argument, 30)
            shown_kind = _clean_for_display(action_type, 20) or "''"
        step_count, done = self.state.step_count, self.state.done
        self._history.append(f"{step_count}. {shown_kind} {shown_arg} -> {'error' if error else summary or 'ok'}")
        obs = self._observation(result=result, error=error, reward=layers, terminated=terminated,
                                truncated=truncated)
        stored_arg = _clean_for_display(argument, 10_000) if len(argument) > 10_000 else _utf8(argument)
        layer_dict = {"operational": operational, "progress": progress, "terminal": terminal, "total": total}
        self._steps.append(make_step(step_count, shown_kind, stored_arg, result, error, total, layer_dict,
                                     obs.budget_remaining, done, terminated=terminated, truncated=truncated))
        self.last_observation = obs
        if done:
            try:
                self._execution_match = self._score_execution(deadline)
            except ExecutionNotScored as err:  # the step's own work left EX's query too little time: unknown
                self._execution_match, self._execution_note = None, str(err)
        return obs

    def _score_execution(self, deadline: float) -> bool:
        """The episode's EX (`sqlenv.scoring.execution`), scored once by the step that ends it, on that step's thread
        and within its `deadline`: the official text of the last QUERY (DISTINCT dropped) is another query than the one
        the step ran, and may be slow. It starts only with its whole time limit left (else `ExecutionNotScored`);
        stopped at the deadline, it counts as failed, as in `execution_match`. A gold that failed at reset (no
        profile) scores every prediction wrong without running anything."""
        q, kept = self.question, self._kept
        self._kept = None  # scored: the result is no longer needed
        result = kept.result if kept is not None else None  # None when dropped: EX runs the query again
        return self._gold is not None and execution_match(self.sandbox, q.database_name, self._last_sql, q.gold_sql,
                                                          result, deadline=deadline)

    def _normalize_argument(self, kind: str, arg: str) -> str:
        """A DESCRIBE, SAMPLE or ANSWER argument as kept in the episode's seen actions (for the repeat penalty; a
        QUERY's: `SeenQueries`): bounded, because the door has bounded `arg` by its action type's limit."""
        if kind in ("DESCRIBE", "SAMPLE"):
            return arg.strip().strip(";").strip().strip('"`[]\'').strip().lower()
        return " ".join(arg.split()).lower()[:10_000]

    def _too_long(self, kind: str, length: int, limit: int) -> str:
        """The error observation of an argument refused at the door: what the limit is and what to send."""
        if kind == "QUERY":
            return sql_too_long(length, limit)
        if kind in ("DESCRIBE", "SAMPLE"):
            return table_name_too_long(length, limit)
        return (f"Answer too long ({length} characters, limit {limit}): answer with the values only (a number, "
                "a name, a list or a table of rows).")

    # ------------------------------------------------------------------------------------- observations
    @property
    def schema_info(self) -> str:
        """Table names, plus the columns of every DESCRIBEd table (compact, one line per table)."""
        return self._schema_text

    def _observation(self, result: str, error: str, reward: RewardLayers, terminated: bool = False,
                     truncated: bool = False) -> SQLObservation:
        assert self.question is not None
        return SQLObservation(
            question=self.question.question_text,
            schema_info=self._schema_text,
            result=result,
            error=error,
            step_count=self.state.step_count,
            budget_remaining=max(0, self.state.step_budget - self.state.step_count),
            action_history=list(self._history),
            done=self.state.done,
            reward=reward.total,
            reward_layers=reward,
            terminated=terminated,
            truncated=truncated,
        )

    @property
    def tables(self) -> list[str]:
        """Table names of the current episode's database."""
        return list(self._tables)

    @property
    def outcome(self) -> str:
        """How the episode stands: "unfinished", "correct", "wrong_answer" or "budget_exhausted"."""
        return self._outcome

    @property
    def execution_match(self) -> bool | None:
        """The episode's execution accuracy (`sqlenv.scoring.execution`): whether its last successful QUERY matches the
        gold query under test-suite-sql-eval's `eval_exec_match` (the official Spider EX). None until the episode is
        over (it would tell the agent whether its query is the gold one), or when the step that ended the episode left
        too little time to score it (`execution_note` says so); scored once, by that step: reading it runs nothing, so
        any thread may (a server's event loop builds `state` from it)."""
        if not self.state.done or self.question is None:
            return None
        return self._execution_match

    @property
    def execution_note(self) -> str | None:
        """Why a finished episode's `execution_match` is None (the step that ended it left EX's query too little
        time), or None."""
        if not self.state.done or self.question is None:
            return None
        return self._execution_note

    @property
    def best_progress(self) -> float:
        """Best progress score reached by a QUERY in this episode (0..1)."""
        return self._best_progress

    # --------------------------------------------------------------------------------------- transcript
    def transcript(self, policy: str | None = None) -> dict[str, Any]:
        """The current episode in the shared transcript format (see `sqlenv.transcript`); its `execution_match` is
        None until the episode is over, then the value its last step scored (nothing runs here)."""
        return make_transcript(self.question, policy=policy, seed=self._seed, steps=self._steps, answer=self._answer,
                               correct=self._correct, outcome=self._outcome, reward_breakdown=self.reward_breakdown,
                               execution_match=self.execution_match, execution_note=self.execution_note)

    def close(self) -> None:
        """Close the database connections and let go of the kept result."""
        self._kept = None
        self.sandbox.close()

    def __enter__(self) -> "SQLEnvironment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _utf8(text: str) -> str:
    """`text` with lone surrogates replaced, so transcripts always encode as UTF-8."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def unpack_action(action: Any) -> tuple[str, str]:
    """(action_type, argument) as strings from an SQLAction, a dict or a 2-tuple; anything else → ("", "")."""
    if isinstance(action, SQLAction) or (hasattr(action, "action_type") and hasattr(action, "argument")):
        action_type, argument = action.action_type, action.argument
    elif isinstance(action, dict):
        action_type, argument = action.get("action_type", ""), action.get("argument", "")
    elif isinstance(action, (tuple, list)) and len(action) == 2:
        action_type, argument = action
    else:
        return "", ""
    action_type = "" if action_type is None else str(action_type)
    argument = "" if argument is None else str(argument)
    return action_type, argument
