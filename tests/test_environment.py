"""SQLEnvironment: the episode contract, bad input, transcripts, the env checker and thread isolation."""

from __future__ import annotations

import json
import threading

import pytest

from sqlenv.checker import EnvCheckError, check_env
from sqlenv.environment import SQLEnvironment
from sqlenv.sandbox.sandbox import SandboxSettings
from sqlenv.transcript import render_transcript_text, validate_transcript
from sqlenv.types import EpisodeState, Question, RewardBreakdown, SQLAction, SQLObservation
from sqlenv.scoring.verifier import format_answer


def test_reset_shows_question_and_table_names_only(env):
    obs = env.reset(question_id="music_q5")
    assert isinstance(obs, SQLObservation)
    assert obs.question == "For each stadium, how many concerts were held there? Order by stadium name."
    assert obs.schema_info == "Tables: stadium, singer, concert"
    assert (obs.step_count, obs.budget_remaining, obs.done, obs.reward, obs.result, obs.error) == (0, 15, False, 0.0, "", "")
    assert isinstance(env.question, Question) and env.question.question_id == "music_q5"
    assert isinstance(env.state, EpisodeState) and env.state.question_id == "music_q5" and env.state.episode_id
    assert env.last_observation is obs and env.reward_breakdown.to_dict()["total"] == 0.0
    assert len(env.questions) == 10


def test_seeded_reset_is_deterministic(toy):
    a, b = SQLEnvironment(*toy), SQLEnvironment(*toy, seed=123)
    picks_a = [a.reset(seed=s).question for s in range(20)]
    picks_b = [b.reset(seed=s).question for s in range(20)]
    assert picks_a == picks_b and len(set(picks_a)) > 3
    c, d = SQLEnvironment(*toy, seed=7), SQLEnvironment(*toy, seed=7)
    assert [c.reset().question for _ in range(10)] == [d.reset().question for _ in range(10)]
    a.reset(seed=1)
    first_id = a.state.episode_id
    a.reset(seed=1)
    assert a.state.episode_id != first_id  # same question, new episode


def test_unknown_question_id_is_a_clear_error(env):
    with pytest.raises(ValueError, match="unknown question_id 'nope'"):
        env.reset(question_id="nope")


def test_describe_adds_columns_to_schema_info(env):
    env.reset(question_id="music_q5")
    obs = env.step(SQLAction("describe", "Stadium"))
    assert obs.error == "" and obs.result.splitlines()[-1] == "rows: 5"
    assert obs.schema_info.splitlines() == ["Tables: stadium, singer, concert",
                                            "stadium(stadium_id INTEGER PK, name TEXT, city TEXT, capacity INTEGER)"]
    obs = env.step(SQLAction("DESCRIBE", "concert"))
    assert obs.schema_info.splitlines()[2].startswith("concert(concert_id INTEGER PK, title TEXT")
    assert "stadium_id INTEGER -> stadium.stadium_id" in obs.schema_info
    assert obs.action_history == ["1. DESCRIBE Stadium -> 4 columns", "2. DESCRIBE concert -> 5 columns"]
    assert env.state.step_count == 2 and obs.budget_remaining == 13


def test_sample_and_query(env):
    env.reset(question_id="shop_q3")
    obs = env.step(SQLAction("SAMPLE", "PRODUCTS"))
    lines = obs.result.splitlines()
    assert lines[0] == "product_id | title | price | category" and len(lines) == 6
    obs = env.step(SQLAction("QUERY", "SELECT order_id, quantity FROM orders ORDER BY order_id"))
    lines = obs.result.splitlines()
    assert lines[0] == "order_id | quantity" and lines[1].startswith("1 | ") and len(lines) == 22
    assert lines[-1] == "(180 more rows)"
    obs = env.step(SQLAction("QUERY", "SELECT nosuchcolumn FROM orders"))
    assert obs.result == "" and obs.error == "SQL error: no such column: nosuchcolumn" and not obs.done


def test_a_table_answer_is_checked_in_order_only_when_the_gold_query_orders_its_result(env):
    """The gold SQL's top-level ORDER BY (parsed when a table is answered, never at reset) makes the rows' order
    count: the same rows in another order are wrong for music_q5 (ORDER BY), right for shop_q3 (none)."""
    by_id = {q.question_id: q for q in env.questions}
    for question_id, reversed_is_right in (("music_q5", False), ("shop_q3", True)):
        question = by_id[question_id]
        assert question.answer_type == "table" and ("ORDER BY" in question.gold_sql) != reversed_is_right
        assert len(question.gold_answer) > 1
        for rows, right in ((question.gold_answer, True), (question.gold_answer[::-1], reversed_is_right)):
            env.reset(question_id=question_id)
            assert env.step(SQLAction("ANSWER", format_answer(rows, "table"))).done
            assert env.reward_breakdown.correctness == (1.0 if right else 0.0), (question_id, rows)


@pytest.mark.parametrize("action,fragment", [
    (SQLAction("FLY", "away"), "Unknown action type 'FLY'"),
    (SQLAction("", ""), "Unknown action type ''"),
    (SQLAction("DESCRIBE", ""), "DESCRIBE needs a table name"),
    (SQLAction("SAMPLE", "   "), "SAMPLE needs a table name"),
    (SQLAction("QUERY", ""), "QUERY needs one SELECT statement"),
    (SQLAction("ANSWER", " \n"), "ANSWER needs the answer value"),
    (SQLAction("DESCRIBE", "singers"), "Unknown table 'singers'. Tables: stadium, singer, concert"),
    (SQLAction("QUERY", "DELETE FROM singer"), "read-only"),
    (SQLAction(None, None), "Unknown action type"),  # type: ignore[arg-type]
    ({"action_type": "QUERY"}, "QUERY needs"),
    ("QUERY SELECT 1", "Unknown action type"),
    (42, "Unknown action type"),
])
def test_bad_actions_are_error_observations_that_use_a_step(env, action, fragment):
    env.reset(question_id="music_q1")
    obs = env.step(action)
    assert fragment in obs.error and obs.result == ""
    assert obs.step_count == 1 and obs.budget_remaining == 14 and not obs.done
    assert obs.reward == pytest.approx(-0.02)
    assert env.transcript()["steps"][0]["error"] == obs.error


HOSTILE = [
    "", " ", "\x00", "SELECT \x00 1", "SELECT '\x00'", "x" * 1_000_000, "SELECT 1 " + "-- c\n" * 50_000,
    "SELECT '\ud800'", "SELECT '😀🧪' AS ü", "SELECT '\u202eevil'", "\ufeffSELECT 1", "/* */", "--",
    "(" * 10_000, "SELECT " + "(" * 3000 + "1" + ")" * 3000, "SELECT * FROM singer WHERE name = 'x' OR '1'='1'",
    "'; DROP TABLE singer; --", "SELECT 1 UNION " * 2000 + "SELECT 1", "\\", "ĲSELECT", "SELECT @@version",
    "SELECT * FROM sqlite_master", "SELECT sqlite_version()", "SELECT randomblob(1000000000)",
]


@pytest.mark.parametrize("argument", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("action_type", ["QUERY", "DESCRIBE", "SAMPLE", "ANSWER", "query\x00"])
def test_any_argument_gives_an_observation(toy, action_type, argument):
    env = SQLEnvironment(*toy, sandbox=SandboxSettings(max_observation_chars=500))
    env.reset(question_id="music_q1")
    obs = env.step(SQLAction(action_type, argument))
    assert isinstance(obs, SQLObservation) and obs.step_count == 1
    assert len(obs.result) <= 500 and len(obs.error) <= 500
    json.dumps(obs.to_dict())
    transcript = env.transcript()
    json.dumps(transcript)  # serialisable even with lone surrogates in the argument
    (lambda text: text.encode("utf-8"))(json.dumps(transcript, ensure_ascii=False))
    assert env.step(SQLAction("QUERY", "SELECT count(*) FROM singer")).result.endswith("30") or obs.done


def test_step_after_done_changes_nothing(env):
    env.reset(question_id="music_q1")
    done = env.step(SQLAction("ANSWER", "30"))
    assert done.done and done.reward == pytest.approx(1.0)
    before = (env.transcript(), env.reward_breakdown.to_dict(), env.state.step_count)
    again = env.step(SQLAction("QUERY", "SELECT 1"))
    assert "call reset()" in again.error and again.reward == 0.0 and again.done
    assert (again.terminated, again.truncated) == (done.terminated, done.truncated) == (True, False)
    assert again.step_count == done.step_count and again.action_history == done.action_history
    assert (env.transcript(), env.reward_breakdown.to_dict(), env.state.step_count) == before
    assert env.last_observation is done


def test_step_before_reset(toy):
    env = SQLEnvironment(*toy)
    obs = env.step(SQLAction("QUERY", "SELECT 1"))
    assert "call reset() first" in obs.error and obs.reward == 0.0
    assert obs.done and obs.truncated and not obs.terminated  # nothing ended the task: there is no episode
    assert env.last_observation is None


def test_budget(toy):
    env = SQLEnvironment(*toy, step_budget=4)
    obs = env.reset(question_id="shop_q1")
    assert obs.budget_remaining == 4
    for i in range(4):
        obs = env.step(SQLAction("QUERY", f"SELECT {i}"))
    assert obs.done and obs.budget_remaining == 0 and "budget exhausted" in obs.result
    assert obs.truncated and not obs.terminated  # Gymnasium: a time limit truncates
    transcript = env.transcript()
    assert transcript["outcome"] == "budget_exhausted"
    assert [(s["done"], s["terminated"], s["truncated"]) for s in transcript["steps"]] == \
        [(False, False, False)] * 3 + [(True, False, True)]
    # an ANSWER on the last step is still judged, and terminates rather than truncates
    env.reset(question_id="shop_q1")
    for i in range(3):
        assert not env.step(SQLAction("QUERY", f"SELECT {i}")).done
    obs = env.step(SQLAction("ANSWER", str(env.question.gold_answer)))
    assert obs.done and obs.terminated and not obs.truncated and env.transcript()["outcome"] == "correct"
    assert env.transcript()["steps"][-1]["terminated"] is True
    # a wrong answer terminates too
    env.reset(question_id="shop_q1")
    obs = env.step(SQLAction("ANSWER", "-1"))
    assert (obs.done, obs.terminated, obs.truncated) == (True, True, False)
    with pytest.raises(ValueError):
        SQLEnvironment(*toy, step_budget=0)


def test_transcript_format_and_text(env):
    env.reset(seed=3, question_id="music_q5")
    env.step(SQLAction("DESCRIBE", "stadium"))
    env.step(SQLAction("QUERY", env.question.gold_sql))
    env.step(SQLAction("ANSWER", format_answer(env.question.gold_answer, env.question.answer_type)))
    t = env.transcript(policy="oracle")
    validate_transcript(t)
    assert list(t) == ["question_id", "question", "database", "difficulty", "answer_type", "gold_sql", "gold_answer",
                       "policy", "seed", "steps", "answer", "correct", "outcome", "total_reward",
                       "reward_breakdown", "n_steps", "execution_match"]
    assert t["execution_match"] is True  # the oracle's last query is the gold query
    assert (t["policy"], t["seed"], t["outcome"], t["correct"], t["n_steps"]) == ("oracle", 3, "correct", True, 3)
    assert [s["action_type"] for s in t["steps"]] == ["DESCRIBE", "QUERY", "ANSWER"]
    step = t["steps"][1]
    assert list(step) == ["step", "action_type", "argument", "observation", "error", "reward", "layers",
                          "budget_remaining", "done", "terminated", "truncated"]
    assert step["layers"]["total"] == pytest.approx(step["reward"]) == pytest.approx(0.15)
    assert t["total_reward"] == pytest.approx(sum(s["reward"] for s in t["steps"]))
    assert t["reward_breakdown"]["correctness"] == 1.0
    assert json.loads(json.dumps(t)) == t
    text = render_transcript_text(t)
    assert "Step 2: QUERY SELECT T1.name" in text and "outcome: correct" in text and "Central Arena | 8" in text
    unfinished = env.reset(question_id="music_q1") and env.transcript()
    assert unfinished["outcome"] == "unfinished" and unfinished["steps"] == []


def test_check_env_passes_and_catches_a_broken_env(toy):
    env = SQLEnvironment(*toy)
    assert len(check_env(env)) == 9

    class Raising(SQLEnvironment):
        def step(self, action):
            if action.action_type == "FLY":
                raise RuntimeError("boom")
            return super().step(action)

    with pytest.raises(EnvCheckError, match="raised"):
        check_env(Raising(*toy))

    class Forgetful(SQLEnvironment):
        """Ignores the seed: each reset plays the next question (a random pick would repeat one by chance)."""
        calls = 0

        def reset(self, seed=None, question_id=None):
            Forgetful.calls += 1
            return super().reset(question_id=self.questions[Forgetful.calls % len(self.questions)].question_id)

    with pytest.raises(EnvCheckError, match="deterministic"):
        check_env(Forgetful(*toy))


def test_reset_step_budget_and_episode_id_apply_to_one_episode(toy):
    env = SQLEnvironment(*toy, step_budget=5)
    obs = env.reset(question_id="music_q1", step_budget=2, episode_id="run-7/episode-1")
    assert obs.budget_remaining == 2 and env.state.step_budget == 2 and env.state.episode_id == "run-7/episode-1"
    env.step(SQLAction("QUERY", "SELECT 1"))
    assert env.step(SQLAction("QUERY", "SELECT 2")).truncated
    obs = env.reset(question_id="music_q1")
    assert obs.budget_remaining == 5 and env.state.step_budget == 5 and env.step_budget == 5
    assert env.state.episode_id not in ("", "run-7/episode-1")
    for bad in (0, -3, 1.5, True, "3"):
        with pytest.raises(ValueError, match="step_budget"):
            env.reset(question_id="music_q1", step_budget=bad)
    with pytest.raises(ValueError, match="episode_id must be a string"):
        env.reset(question_id="music_q1", episode_id=7)
    assert env.state.step_budget == 5  # a refused reset leaves the episode as it was


def test_check_env_catches_a_missing_member_and_a_mislabelled_end(toy):
    class NoClose:
        """Everything of the protocol but `close`."""

        def __init__(self, env):
            self.env = env

        def __getattr__(self, name):
            if name == "close":
                raise AttributeError(name)
            return getattr(self.env, name)

    with pytest.raises(EnvCheckError, match="lacks members of sqlenv.protocol.Environment: close"):
        check_env(NoClose(SQLEnvironment(*toy)))

    class TerminatedByBudget(SQLEnvironment):
        """Reports running out of budget as a termination (what Gymnasium calls a truncation)."""

        def step(self, action):
            obs = super().step(action)
            if obs.truncated and not obs.error.startswith("The episode is over"):
                obs.terminated, obs.truncated = True, False
            return obs

    with pytest.raises(EnvCheckError, match="did not truncate"):
        check_env(TerminatedByBudget(*toy))


def test_from_dataset_with_a_prepared_directory(toy):
    env = SQLEnvironment.from_dataset(str(toy[0].parent), split="train", step_budget=7)
    assert len(env.questions) == 10 and env.step_budget == 7
    assert env.reset(question_id="shop_q2").budget_remaining == 7


def test_reward_breakdown_sums_the_layers(env):
    env.reset(question_id="music_q1")
    layers = [env.step(a).reward_layers for a in
              [SQLAction("DESCRIBE", "singer"), SQLAction("QUERY", "SELECT count(*) FROM singer"),
               SQLAction("ANSWER", "30")]]
    rb = env.reward_breakdown
    assert isinstance(rb, RewardBreakdown)
    assert rb.operational == pytest.approx(sum(l.operational for l in layers))
    assert rb.progress == pytest.approx(sum(l.progress for l in layers))
    assert rb.correctness == 1.0 and rb.total == pytest.approx(sum(l.total for l in layers))


def test_32_instances_in_32_threads_do_not_cross_talk(toy):
    """Each thread plays its own questions on its own env; every transcript matches a serial reference."""
    env = SQLEnvironment(*toy)
    ids = [q.question_id for q in env.questions]

    def play(e: SQLEnvironment, qid: str) -> dict:
        e.reset(question_id=qid)
        q = e.question
        e.step(SQLAction("DESCRIBE", q.tables_involved[0]))
        e.step(SQLAction("QUERY", q.gold_sql))
        e.step(SQLAction("QUERY", f"SELECT count(*) FROM {q.tables_involved[-1]}"))
        e.step(SQLAction("ANSWER", format_answer(q.gold_answer, q.answer_type)))
        return e.transcript()

    reference = {qid: play(env, qid) for qid in ids}
    barrier = threading.Barrier(32)
    results: dict[int, list] = {}
    errors: list = []

    def worker(i: int) -> None:
        try:
            mine = SQLEnvironment(*toy)
            barrier.wait()
            results[i] = [(qid, play(mine, qid)) for qid in (ids[(i + k) % len(ids)] for k in range(6))]
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 32
    for runs in results.values():
        for qid, transcript in runs:
            assert transcript == reference[qid]
            assert transcript["correct"]


def test_one_env_shared_by_threads_stays_consistent(toy):
    """Not the intended use, but a shared env must not corrupt its sandbox: queries stay correct."""
    env = SQLEnvironment(*toy)
    env.reset(question_id="music_q1")
    sandbox = env.sandbox
    outcomes: list = []

    def worker() -> None:
        for _ in range(50):
            outcomes.append(sandbox.execute("music", "SELECT count(*) FROM concert").rows)
            outcomes.append(sandbox.execute("shop", "SELECT count(*) FROM orders").rows)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(tuple, outcomes)) == sorted([((60,),), ((200,),)] * 400)


def test_answer_with_a_header_copied_from_the_query_result(env):
    env.reset(question_id="shop_q3")
    shown = env.step(SQLAction("QUERY", env.question.gold_sql)).result
    assert shown.splitlines()[0] == "category | count(*)"
    assert env.step(SQLAction("ANSWER", shown)).reward_layers.terminal == 1.0


def test_runaway_query_is_stopped_and_the_episode_goes_on(toy):
    import time

    env = SQLEnvironment(*toy, sandbox=SandboxSettings(timeout_s=1.0))
    env.reset(question_id="music_q1")
    start = time.monotonic()
    obs = env.step(SQLAction("QUERY", "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
                                      "SELECT max(n) FROM r"))
    assert time.monotonic() - start <= 1.5
    assert "timed out after 1 s" in obs.error and not obs.done and obs.reward == pytest.approx(-0.02)
    obs = env.step(SQLAction("QUERY", "SELECT count(*) FROM singer"))
    assert obs.error == "" and obs.result == "count(*)\n30"
    assert env.step(SQLAction("ANSWER", "30")).reward_layers.terminal == 1.0


# --------------------------------------------------------------------- hardening (issue 26: items 2 and 4)

@pytest.mark.parametrize("kind,limit", [("DESCRIBE", 256), ("SAMPLE", 256), ("QUERY", 20_000),
                                        ("ANSWER", 1_000_000)])
def test_each_action_type_has_a_length_limit_at_the_door(env, kind, limit):
    """An argument over its action's limit is refused before anything is done with it: 15 MB QUERY arguments used
    to stay as keys of the process's SQL caches (60 steps: +900 MB) and 15 MB table names in the episode's seen
    actions (30 steps: 555 MB). Ten 2 MB arguments here leave nothing of themselves behind."""
    import tracemalloc

    env.reset(question_id="music_q1")
    assert not tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        observations = [env.step(SQLAction(kind, f"{i} " + "x" * 2_000_000)) for i in range(10)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 500_000, held  # 20 MB before
    assert max(len(key) for _, key in env._seen_actions or [("", "")]) <= limit
    for i, obs in enumerate(observations):
        assert "too long" in obs.error and f"limit {limit}" in obs.error, obs.error
        assert obs.step_count == i + 1 and not obs.done and obs.result == ""
    step = env.transcript()["steps"][-1]
    assert len(step["argument"]) <= 10_000 and "too long" in step["error"]
    assert len(obs.action_history[-1]) < 120


def test_arguments_at_their_limit_pass_the_door(env):
    env.reset(question_id="music_q1")
    query = "SELECT count(*) FROM singer -- "
    obs = env.step(SQLAction("QUERY", query + "x" * (20_000 - len(query))))
    assert obs.error == "" and obs.result.endswith("30")
    obs = env.step(SQLAction("QUERY", query + "x" * (20_001 - len(query))))
    assert "SQL too long (20001 characters, limit 20000)" in obs.error
    assert "Unknown table" in env.step(SQLAction("DESCRIBE", "s" * 256)).error
    assert "Table name too long (257 characters, limit 256)" in env.step(SQLAction("SAMPLE", "s" * 257)).error
    obs = env.step(SQLAction("X" * 1_000_000, "y" * 1_000_000))  # an action type that long is no action type
    assert obs.error.startswith("Unknown action type") and len(obs.error) < 200
    assert all(len(kind) <= 32 and len(key) <= 20_000 for kind, key in env._seen_actions)
    assert env.step(SQLAction("ANSWER", " 30 ")).reward_layers.terminal == 1.0


def test_results_kept_across_environments_are_bounded_in_total(toy):
    """Each environment keeps its last QUERY result for EX (up to `max_result_bytes`): 64 server sessions could keep
    ~2 GB (issue 35). What all the environments of the process keep is bounded; the results kept longest are dropped
    first, and an episode whose result was dropped still scores EX (its query runs again when it ends)."""
    import sys

    from sqlenv.kept_results import KEPT_RESULTS

    budget = 3_000_000
    settings = SandboxSettings(max_kept_result_bytes=budget)
    big = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 110) "
           "SELECT n, zeroblob(9000) FROM r")  # ~1 MB held
    envs = [SQLEnvironment(*toy, sandbox=settings) for _ in range(6)]
    try:
        envs[0].reset(question_id="music_q1")
        assert envs[0].step(SQLAction("QUERY", "SELECT count(*) FROM singer")).error == ""  # the gold query
        for env in envs[1:]:
            env.reset(question_id="music_q1")
            assert env.step(SQLAction("QUERY", big)).error == ""
            assert KEPT_RESULTS.held_bytes() <= budget
        held = [env._kept.result for env in envs if env._kept is not None and env._kept.result is not None]
        measured = sum(sys.getsizeof(row) + 8 + sum(sys.getsizeof(v) for v in row) for r in held for row in r.rows)
        assert 2 <= len(held) <= 3 and measured <= budget  # 5 MB asked for
        assert envs[0]._kept.result is None  # kept longest: dropped
        envs[0].step(SQLAction("ANSWER", "30"))
        assert envs[0].execution_match is True  # scored all the same
        envs[-1].step(SQLAction("ANSWER", "30"))
        assert envs[-1].execution_match is False
    finally:
        for env in envs:
            env.close()
    assert KEPT_RESULTS.held_bytes() <= budget
