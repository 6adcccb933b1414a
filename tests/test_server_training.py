"""A few real GRPO steps of the built-in tiny model against a real SQLEnv server on 127.0.0.1.

`TrainConfig(env_url=...)` (the run plan's episode source, also `SQLEnvTRL.configure(..., base_url=...)`) makes
every TRL environment instance hold one server session; the rewards and transcripts must be those of the same
actions played in-process.
"""

from __future__ import annotations

import copy
import os

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from training_helpers import small_train_config  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_cpu_thread")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def server(builtin):
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train"]) as proc:
        yield proc


def _replayed_in_process(builtin, transcript, step_budget):
    """The transcript of the same actions on the same question, played in-process."""
    from sqlenv.environment import SQLEnvironment
    from sqlenv.types import SQLAction

    with SQLEnvironment(builtin.questions_path("train"), builtin.db_dir, step_budget=step_budget) as env:
        env.reset(question_id=transcript["question_id"])
        for step in transcript["steps"]:
            env.step(SQLAction(step["action_type"], step["argument"]))
        return env.transcript()


def test_grpo_steps_against_the_server(tiny, tmp_path, server, builtin):
    from sqlenv.server.remote import RemoteSQLEnvironment
    from training.grpo import build_trainer
    from training.plan import RunPlan

    config = small_train_config(tmp_path, env_url=server.url)
    model, tokenizer = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    trainer = build_trainer(RunPlan.resolve(config), model, tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2 and all("rewards/reward_operational/mean" in h for h in logs)
    envs = trainer.environments
    assert all(isinstance(e.environment, RemoteSQLEnvironment) for e in envs)
    assert server.sessions()["open"] == len(envs)  # one session per TRL environment instance
    for env in envs:
        # The untrained model rarely emits a well-formed tool call on this path, so an episode may have no step;
        # its first observation and its (unfinished) charges still come from the server's episode.
        transcript = env.transcript
        assert transcript["question"] == env.observation.question and transcript["gold_sql"]
        assert transcript == _replayed_in_process(builtin, transcript, config.step_budget)
        assert env.environment.reward_config.step_cost == pytest.approx(-0.02)  # the server's, sent at reset
        env.environment.close()
    assert server.wait_sessions(0) == 0


def test_rollout_func_against_the_server(tiny, tmp_path, server, builtin):
    from sqlenv.server.remote import RemoteSQLEnvironment
    from training.grpo import build_trainer
    from training.plan import RunPlan

    config = small_train_config(tmp_path, env_url=server.url, rollout="rollout_func")
    model, tokenizer = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    trainer = build_trainer(RunPlan.resolve(config), model, tokenizer)
    prompts = [trainer.train_dataset[i]["prompt"] for i in (0, 0, 1)]
    rollout = trainer.rollout_func
    out = rollout(prompts, trainer)
    envs = rollout.environments(len(prompts))
    assert all(isinstance(e.environment, RemoteSQLEnvironment) for e in envs)
    for env, operational in zip(envs, out["operational"]):
        transcript = env.transcript
        assert transcript["steps"]  # this path plays the untrained model's text as QUERY actions
        assert transcript == _replayed_in_process(builtin, transcript, config.step_budget)
        assert operational == pytest.approx(env.breakdown.operational)
    trainer.train()
    assert len([h for h in trainer.state.log_history if "reward" in h]) == 2
    for env in rollout.environments(len(prompts)):
        env.environment.close()
