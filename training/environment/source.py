"""`EpisodeSource`: the questions an environment plays (one split's questions file, its databases, the step budget),
the small picklable part that every environment of a run is built from; its questions are parsed once and shared.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

__all__ = ["EpisodeSource"]


class EpisodeSource:
    """The questions an environment plays: one split's questions file, its databases and the step budget.

    Args:
        questions_path: a `questions_<split>.json` file.
        db_dir: the folder of `<db_id>/<db_id>.sqlite` files.
        step_budget: actions per episode (default 10).
        reward_config: a `sqlenv.RewardConfig` (default: the environment's defaults).
        sandbox: a `sqlenv.SandboxSettings` (default: the environment's defaults).
        base_url: play on a SQLEnv server at this URL (`python -m sqlenv serve`) instead of in-process (default
            None; needs the `server` extra). Each environment then holds one server session; the server owns the
            databases, rewards and sandbox, so `reward_config` and `sandbox` stay unset and `db_dir` may be None;
            the questions file still names the questions (and fills the gold fields of transcripts).
        held_out: question ids this source never plays (default none): a run's validation panel, held out of the
            train split so that GRPO and the warm start never see it (`training.validation`).

    Raises:
        ValueError / FileNotFoundError: a budget below 1, a missing questions file or database folder, rewards or
            a sandbox set for a server.
    """

    def __init__(self, questions_path: str | Path, db_dir: str | Path | None, step_budget: int = 10, *,
                 reward_config: Any = None, sandbox: Any = None, base_url: str | None = None,
                 held_out: Collection[str] = ()):
        if int(step_budget) < 1:
            raise ValueError(f"step_budget must be at least 1, got {step_budget}")
        if base_url is not None and (reward_config is not None or sandbox is not None):
            raise ValueError("with base_url the server sets the rewards and the sandbox: leave reward_config and "
                             "sandbox unset")
        self.questions_path = Path(questions_path)
        self.db_dir = None if db_dir is None else Path(db_dir)
        if not self.questions_path.is_file():
            raise FileNotFoundError(f"questions file not found: {self.questions_path}")
        if base_url is None and (self.db_dir is None or not self.db_dir.is_dir()):
            raise FileNotFoundError(f"database folder not found: {self.db_dir}")
        self.step_budget = int(step_budget)
        self.reward_config = reward_config
        self.sandbox = sandbox
        self.base_url = base_url
        self.held_out = frozenset(held_out)
        self._questions: list | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_dataset(cls, dataset: Any = "builtin", split: str = "train", step_budget: int = 10, *,
                     data_dir: str | Path | None = None, **kwargs: Any) -> "EpisodeSource":
        """The source of one split of a dataset (a name, a directory or a `DatasetInfo`; `data_dir`: where named
        datasets live, default `$SQLENV_DATA_DIR` or `data/`)."""
        from sqlenv.data.datasets import resolve_dataset

        info = resolve_dataset(dataset, data_root=data_dir)
        return cls(info.questions_path(split), info.db_dir, step_budget, **kwargs)

    @property
    def questions(self) -> list:
        """The split's questions less `held_out`, parsed on first use and shared by every environment of this
        source."""
        with self._lock:
            if self._questions is None:
                from sqlenv.data.datasets import load_questions

                questions = load_questions(self.questions_path)
                self._questions = [q for q in questions if q.question_id not in self.held_out] if self.held_out \
                    else questions
            return self._questions

    def environment(self):
        """A new `sqlenv.protocol.Environment` over these questions (the caller closes it): a `SQLEnvironment`, or
        a `RemoteSQLEnvironment` when the source plays on a server."""
        if self.base_url is not None:
            from sqlenv.server.remote import RemoteSQLEnvironment  # needs the sqlenv[server] extra

            return RemoteSQLEnvironment(self.base_url, questions=self.questions, step_budget=self.step_budget)
        from sqlenv.environment import SQLEnvironment

        return SQLEnvironment(self.questions, self.db_dir, step_budget=self.step_budget,
                              reward_config=self.reward_config, sandbox=self.sandbox)

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        if self.held_out:
            where += f", held_out=<{len(self.held_out)} questions>"
        return (f"EpisodeSource({str(self.questions_path)!r}, {str(self.db_dir)!r}, "
                f"step_budget={self.step_budget}{where})")
