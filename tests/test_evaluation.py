"""`evaluate()`: episodes, seeds, transcripts, failure handling — on the real built-in dataset."""

from __future__ import annotations

import json

import pytest

from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import EvaluationResult, evaluate, play_episode
from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy
from sqlenv.types import SQLAction

TRANSCRIPT_KEYS = {
    "question_id", "question", "database", "difficulty", "answer_type", "gold_sql", "gold_answer", "policy",
    "seed", "steps", "answer", "correct", "outcome", "total_reward", "reward_breakdown", "n_steps",
}
STEP_KEYS = {"step", "action_type", "argument", "observation", "error", "reward", "layers", "budget_remaining", "done"}


@pytest.fixture(scope="module")
def builtin(tmp_path_factory):
    from sqlenv.data.builtin import build_builtin

    return build_builtin(tmp_path_factory.mktemp("data") / "builtin", seed=0)


@pytest.fixture()
def env(builtin):
    return SQLEnvironment(builtin.questions_path("eval"), builtin.db_dir, step_budget=15)


def test_oracle_result_and_transcripts(env):
    seen = []
    result = evaluate(env, OraclePolicy(), n_episodes=12, seed=100, progress_callback=lambda d, t, tr: seen.append((d, t, tr)))
    assert isinstance(result, EvaluationResult)
    assert result.n_episodes == 12 and result.policy == "oracle" and result.seed == 100
    assert result.success_rate == 1.0
    assert result.avg_reward == pytest.approx(sum(ep["total_reward"] for ep in result.episodes) / 12)
    assert result.avg_steps == pytest.approx(sum(ep["n_steps"] for ep in result.episodes) / 12)
    assert [d for d, _, _ in seen] == list(range(1, 13)) and all(t == 12 for _, t, _ in seen)
    assert [tr for _, _, tr in seen] == result.episodes
    for i, ep in enumerate(result.episodes):
        assert TRANSCRIPT_KEYS <= set(ep)
        assert ep["policy"] == "oracle" and ep["seed"] == 100 + i
        assert ep["outcome"] == "correct" and ep["correct"] is True
        assert ep["n_steps"] == len(ep["steps"]) >= 2
        assert all(STEP_KEYS <= set(step) for step in ep["steps"])
        assert [s["action_type"] for s in ep["steps"]][-2:] == ["QUERY", "ANSWER"]
    # Serialisable as one JSON object, with and without the episodes.
    data = json.loads(json.dumps(result.to_dict()))
    assert data["n_episodes"] == 12 and data["success_rate"] == 1.0 and len(data["episodes"]) == 12
    assert "episodes" not in result.to_dict(include_episodes=False)
    assert data["outcomes"] == {"correct": 12}


def test_same_seed_same_questions_whatever_the_policy(builtin):
    def ids(policy, seed):
        e = SQLEnvironment(builtin.questions_path("eval"), builtin.db_dir)
        return [ep["question_id"] for ep in evaluate(e, policy, 8, seed=seed).episodes]

    oracle_ids = ids(OraclePolicy(), 7)
    assert oracle_ids == ids(RandomPolicy(seed=3), 7)
    assert oracle_ids != ids(OraclePolicy(), 8)  # and the seed matters


def test_evaluation_is_reproducible(builtin):
    def run():
        e = SQLEnvironment(builtin.questions_path("eval"), builtin.db_dir)
        res = evaluate(e, RandomPolicy(seed=5), 6, seed=0)
        return [[(s["action_type"], s["argument"], s["reward"]) for s in ep["steps"]] for ep in res.episodes]

    assert run() == run()


class _FlakyPolicy:
    """Raises on the second action of every odd episode; otherwise plays the oracle."""

    name = "flaky"

    def __init__(self):
        self.oracle = OraclePolicy()
        self.episode = -1

    def reset(self, env, observation):
        self.episode += 1
        self.calls = 0
        self.oracle.reset(env, observation)

    def act(self, env, observation):
        self.calls += 1
        if self.episode % 2 == 1 and self.calls == 2:
            raise RuntimeError(f"boom in episode {self.episode}")
        return self.oracle.act(env, observation)


def test_raising_episode_is_recorded_failed_and_run_goes_on(env):
    result = evaluate(env, _FlakyPolicy(), n_episodes=6, seed=0)
    assert result.n_episodes == 6
    outcomes = [ep["outcome"] for ep in result.episodes]
    assert outcomes == ["correct", "error"] * 3
    assert result.success_rate == pytest.approx(0.5)
    assert result.n_errors == 3
    failed = result.episodes[1]
    assert failed["correct"] is False and "boom in episode 1" in failed["error"]
    assert failed["policy"] == "flaky" and failed["seed"] == 1
    assert failed["question_id"] and failed["n_steps"] == len(failed["steps"]) == 1  # what was played is kept
    json.dumps(result.to_dict())


def test_policy_returning_garbage_is_an_error_episode(env):
    class Bad:
        name = "bad"

        def reset(self, env, observation):
            pass

        def act(self, env, observation):
            return "DESCRIBE x"  # not an SQLAction

    result = evaluate(env, Bad(), n_episodes=2, seed=0)
    assert [ep["outcome"] for ep in result.episodes] == ["error", "error"]
    assert "SQLAction" in result.episodes[0]["error"]


def test_reset_failure_is_an_error_episode(tmp_path, builtin):
    class BrokenEnv(SQLEnvironment):
        def reset(self, seed=None, question_id=None):
            if seed == 1:
                raise OSError("database vanished")
            return super().reset(seed=seed, question_id=question_id)

    e = BrokenEnv(builtin.questions_path("eval"), builtin.db_dir)
    result = evaluate(e, OraclePolicy(), n_episodes=3, seed=0)
    assert [ep["outcome"] for ep in result.episodes] == ["correct", "error", "correct"]
    assert "database vanished" in result.episodes[1]["error"]


def test_zero_episodes_and_negative(env):
    empty = evaluate(env, OraclePolicy(), n_episodes=0, seed=0)
    assert (empty.success_rate, empty.avg_reward, empty.avg_steps, empty.episodes) == (0.0, 0.0, 0.0, [])
    with pytest.raises(ValueError):
        evaluate(env, OraclePolicy(), n_episodes=-1, seed=0)


def test_play_episode_by_question_id(env):
    qid = env.questions[3].question_id
    ep = play_episode(env, OraclePolicy(), question_id=qid)
    assert ep["question_id"] == qid and ep["correct"] and ep["policy"] == "oracle"


def test_wrong_answers_count_as_failures(env):
    class Wrong:
        name = "wrong"

        def reset(self, env, observation):
            pass

        def act(self, env, observation):
            return SQLAction("ANSWER", "definitely not the answer 98765")

    result = evaluate(env, Wrong(), n_episodes=4, seed=0)
    assert result.success_rate == 0.0 and result.avg_steps == 1.0
    assert {ep["outcome"] for ep in result.episodes} == {"wrong_answer"}


def test_explore_rate_counts_episodes_that_looked_at_the_data_before_answering(env):
    from sqlenv.evaluation.policies import GuessPolicy

    class FailThenAnswer:
        """Babble parsed as a query (it fails), then an answer: that is no look at the data."""

        name = "babble"

        def reset(self, env, observation):
            self.steps = [SQLAction("QUERY", "blah blah"), SQLAction("ANSWER", "1")]

        def act(self, env, observation):
            return self.steps.pop(0)

    assert evaluate(env, OraclePolicy(describe=False), n_episodes=6, seed=0).explore_rate == 1.0
    assert evaluate(env, GuessPolicy(), n_episodes=6, seed=0).explore_rate == 0.0
    babble = evaluate(env, FailThenAnswer(), n_episodes=4, seed=0)
    assert babble.episodes[0]["steps"][0]["error"] and babble.explore_rate == 0.0
    assert babble.to_dict()["explore_rate"] == 0.0
