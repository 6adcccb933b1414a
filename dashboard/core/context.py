"""What every tab shares: the training runner, the run cache, where data lives, who may train. Built once per app."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dashboard.access.owner import AccessPolicy, OwnerGate
from dashboard.core.run_data import RunCache
from dashboard.core.runner import TrainingRunner

# The Train tab's gr.Timer interval (seconds). Each tick is a long poll (`dashboard.train.live.LiveUpdates.poll`) that
# answers when the run has news or after LONG_POLL_SECONDS; ticks while one is waiting are skipped in the browser at no
# cost.
# So this bounds the gap between one answer and the next poll (part of the "logged -> plotted" latency), and
# LONG_POLL_SECONDS is how often an idle page updates its status bar's clock.
POLL_SECONDS = 0.5
LONG_POLL_SECONDS = 5.0


@dataclass
class AppContext:
    runner: TrainingRunner
    runs: RunCache
    data_root: Path | None = None
    default_config: Path | None = None  # the Train form's starting values (default configs/tiny_cpu.json)
    poll_seconds: float = POLL_SECONDS
    long_poll_seconds: float = LONG_POLL_SECONDS
    # Who may train (dashboard.access.owner); open unless the environment configures an owner.
    access: AccessPolicy = field(default_factory=AccessPolicy.from_env)
    hub_repo: str | None = None  # the Runs tab's default "push to the Hub" repo ($SQLENV_HUB_REPO)
    # The owner-only wiring of one built page; build_app sets it (tabs call ctx.owner.owner_event).
    owner: OwnerGate | None = None

    @classmethod
    def create(cls, runs_root: Path | None = None, data_root: Path | None = None,
               default_config: Path | None = None, access: AccessPolicy | None = None,
               hub_repo: str | None = None) -> "AppContext":
        """Args:
            runs_root: the runs folder (default `$SQLENV_RUNS_DIR` or `runs/`; the app passes its choice).
            data_root: the datasets folder (default `$SQLENV_DATA_DIR` or `data/`).
            default_config: a TrainConfig JSON whose values fill the Train form.
            access: who may train (default `AccessPolicy.from_env()`: the environment's owner, else open as
                for 127.0.0.1; the app passes the policy for the host it listens on).
            hub_repo: the repo the Runs tab offers to push to.
        """
        runner = TrainingRunner(runs_root)  # the app's one runner: every tab and visitor shares it
        return cls(runner=runner, runs=RunCache(runner.runs_root), data_root=data_root,
                   default_config=default_config, access=access or AccessPolicy.from_env(), hub_repo=hub_repo)
