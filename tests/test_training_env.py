"""The TRL adapter without a model: configure(), reset/tools, isolation, penalties, reward functions, parsing,
prompts and the context budget. Real SQLite files from the built-in dataset."""

from __future__ import annotations

import threading

import pytest

from sqlenv.data.datasets import load_questions
from sqlenv.types import SQLAction, SQLObservation
from sqlenv.agent import prompts
from training.grpo.rewards import REWARD_FUNCS, reward_correctness, reward_operational, reward_progress
from sqlenv.agent.model_output import parse_model_output
from training.environment.trl_env import POST_EPISODE_PENALTY, SQLEnvTRL, tool_methods, tool_schemas, train_rows
from sqlenv.scoring.verifier import format_answer


@pytest.fixture(autouse=True)
def configured(builtin):
    SQLEnvTRL.configure(dataset="builtin", split="train", step_budget=4)
    yield
    SQLEnvTRL.reset_configuration()


def _oracle(env: SQLEnvTRL, q) -> str:
    env.describe(q.tables_involved[0])
    env.query(q.gold_sql)
    return env.answer(format_answer(q.gold_answer, q.answer_type))


def test_configure_with_paths_and_errors(builtin, tmp_path):
    SQLEnvTRL.configure(questions_path=builtin.questions_path("eval"), db_dir=builtin.db_dir, step_budget=3)
    assert SQLEnvTRL.settings()["step_budget"] == 3
    env = SQLEnvTRL()
    eval_q = load_questions(builtin.questions_path("eval"))[0]
    assert "Question:" in env.reset(question_id=eval_q.question_id)
    with pytest.raises(ValueError, match="step_budget"):
        SQLEnvTRL.configure(dataset="builtin", step_budget=0)
    with pytest.raises(ValueError):
        SQLEnvTRL.configure(dataset="builtin", split="no-such-split")
    with pytest.raises(FileNotFoundError):
        SQLEnvTRL.configure(questions_path=tmp_path / "none.json", db_dir=builtin.db_dir)
    with pytest.raises(ValueError, match="dataset"):
        SQLEnvTRL.configure()
    SQLEnvTRL.reset_configuration()
    with pytest.raises(RuntimeError, match="configure"):
        SQLEnvTRL().reset(question_id=eval_q.question_id)


def test_only_the_four_tools_are_exposed():
    names = [m.__name__ for m in tool_methods()]
    assert names == ["answer", "describe", "query", "sample"]
    schemas = tool_schemas()
    params = {s["function"]["name"]: list(s["function"]["parameters"]["properties"]) for s in schemas}
    assert params == {"answer": ["value"], "describe": ["table_name"], "query": ["sql"], "sample": ["table_name"]}
    assert all(s["function"]["description"] for s in schemas)


def test_reset_text_and_prefix(questions):
    env = SQLEnvTRL()
    q = questions[0]
    text = env.reset(question_id=q.question_id, prompt=[{"role": "user", "content": ""}])
    assert text.startswith("Question: " + q.question_text)
    assert "Tables:" in text and "4 steps" in text
    appended = env.reset(question_id=q.question_id, prompt=[{"role": "user", "content": "Solve this."}])
    assert appended.startswith("\n\nQuestion:")


def test_oracle_episode_rewards_and_episode_over(questions):
    env = SQLEnvTRL()
    q = questions[0]
    env.reset(question_id=q.question_id)
    described = env.describe(q.tables_involved[0])
    assert "steps left" in described
    queried = env.query(q.gold_sql)
    assert "Error" not in queried
    result = env.answer(format_answer(q.gold_answer, q.answer_type))
    assert "correct" in result and "Episode over" in result
    assert env.done
    rb = env.breakdown
    assert rb.correctness == 1.0 and rb.progress > 0
    before = env.breakdown.operational
    late = env.query("SELECT 1")
    assert "episode is over" in late and env.post_episode_calls == 1
    assert env.breakdown.operational == pytest.approx(before + POST_EPISODE_PENALTY)
    assert env.breakdown.correctness == 1.0


def test_errors_are_text_and_budget_ends_episode(questions):
    env = SQLEnvTRL()
    env.reset(question_id=questions[1].question_id)
    assert env.describe("no_such_table").startswith("Error:")
    assert env.query("DELETE FROM x").startswith("Error:")
    assert env.sample("") .startswith("Error:")
    last = env.query("SELECT 1")
    assert env.done and "Episode over" in last  # budget of 4 spent
    assert env.breakdown.correctness == 0.0


def test_reset_clears_state_and_instances_are_isolated(questions):
    a, b = SQLEnvTRL(), SQLEnvTRL()
    qa, qb = questions[0], questions[5]
    a.reset(question_id=qa.question_id)
    b.reset(question_id=qb.question_id)
    _oracle(a, qa)
    b.query("SELECT 1")
    assert a.breakdown.correctness == 1.0 and b.breakdown.correctness == 0.0 and not b.done
    assert b.observation.question == qb.question_text
    a.query("SELECT 1")  # post-episode penalty
    a.reset(question_id=qb.question_id)
    assert a.breakdown.total == pytest.approx(a.unfinished_penalty) == pytest.approx(4 * -0.02)
    assert a.post_episode_calls == 0 and not a.done and a.breakdown.correctness == 0.0
    assert a.observation.question == qb.question_text


def test_instances_in_threads_do_not_cross_talk(questions):
    envs = [SQLEnvTRL() for _ in range(8)]
    chosen = questions[:8]
    errors = []

    def play(env, q, correct):
        try:
            env.reset(question_id=q.question_id)
            env.query(q.gold_sql)
            env.answer(format_answer(q.gold_answer, q.answer_type) if correct else "definitely wrong")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=play, args=(e, q, i % 2 == 0)) for i, (e, q) in enumerate(zip(envs, chosen))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [e.breakdown.correctness for e in envs] == [1.0 if i % 2 == 0 else 0.0 for i in range(8)]
    assert [e.observation.question for e in envs] == [q.question_text for q in chosen]


def test_reward_functions_on_environment_path(questions):
    envs = [SQLEnvTRL(), SQLEnvTRL(), SQLEnvTRL()]
    for env, q in zip(envs, questions[:3]):
        env.reset(question_id=q.question_id)
    _oracle(envs[0], questions[0])
    envs[1].query("SELECT nonsense FROM nowhere")
    prompts_, completions = [[]] * 3, [[]] * 3
    correctness = reward_correctness(prompts_, completions, environments=envs)
    progress = reward_progress(prompts_, completions, environments=envs)
    operational = reward_operational(prompts_, completions, environments=envs)
    assert correctness == [1.0, 0.0, 0.0]
    assert 0.0 < progress[0] <= 1.0 and progress[1] == 0.0 and progress[2] == 0.0
    # envs[1] erred once then stopped, envs[2] never acted: both pay the step cost of the whole budget (4 steps)
    assert operational[1] == pytest.approx(-0.08) and operational[2] == pytest.approx(-0.08)
    assert operational == [e.breakdown.operational for e in envs]


def test_giving_up_never_beats_trying(questions):
    """An episode the model abandons is charged its unused steps: silence scores like spending the budget."""
    silent, wrong, spent = SQLEnvTRL(), SQLEnvTRL(), SQLEnvTRL()
    for env in (silent, wrong, spent):
        env.reset(question_id=questions[2].question_id)
    assert silent.unfinished_penalty == pytest.approx(4 * -0.02)
    wrong.answer("not it")
    for _ in range(4):
        spent.sample(questions[2].tables_involved[0])
    assert wrong.unfinished_penalty == 0.0 and spent.unfinished_penalty == 0.0 and spent.done
    assert silent.reward <= spent.reward < wrong.reward


def test_reward_functions_on_rollout_fields():
    fields = {"correctness": [1.0, 0.0], "progress": [0.15, 0.075], "operational": [0.01, -0.05]}
    assert reward_correctness([], [None, None], **fields) == [1.0, 0.0]
    assert reward_progress([], [None, None], **fields) == pytest.approx([1.0, 0.5])
    assert reward_operational([], [None, None], **fields) == [0.01, -0.05]
    with pytest.raises(KeyError, match="rollout_func"):
        reward_correctness([], [None])
    with pytest.raises(ValueError, match="2 values for 3"):
        reward_correctness([], [None] * 3, **fields)
    assert [f.__name__ for f in REWARD_FUNCS] == ["reward_correctness", "reward_progress", "reward_operational"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('<tool_call>\n{"name": "query", "arguments": {"sql": "SELECT 1"}}\n</tool_call><|im_end|>',
         ("QUERY", "SELECT 1")),
        ('<think>\n\n</think>\n\n<tool_call>\n{"name": "describe", "arguments": {"table_name": "t"}}\n</tool_call>',
         ("DESCRIBE", "t")),
        ('<tool_call>{"name": "answer", "arguments": {"value": "42"}}', ("ANSWER", "42")),
        ("QUERY: SELECT name FROM singer", ("QUERY", "SELECT name FROM singer")),
        ("answer: Paris, Rome", ("ANSWER", "Paris, Rome")),
        ("DESCRIBE singer", ("DESCRIBE", "singer")),
        ("QUERY:\n```sql\nSELECT 2\n```", ("QUERY", "SELECT 2")),
        ("I think the answer is blue", ("QUERY", "I think the answer is blue")),
        ("<tool_call>{broken json</tool_call>", ("QUERY", "<tool_call>{broken json</tool_call>")),
        ("", ("QUERY", "")),
    ],
)
def test_parse_model_output(text, expected):
    action = parse_model_output(text)
    assert (action.action_type, action.argument) == expected


def test_tool_call_round_trip():
    for kind, arg in (("DESCRIBE", "t"), ("SAMPLE", "t"), ("QUERY", "SELECT 1"), ("ANSWER", "[]")):
        call = prompts.action_to_tool_call(SQLAction(kind, arg))
        back = prompts.tool_call_to_action(call["function"]["name"], call["function"]["arguments"])
        assert (back.action_type, back.argument) == (kind, arg)
    assert prompts.tool_call_to_action("drop_table", {"x": "y"}).action_type == "DROP_TABLE"


def test_train_rows_one_per_question(questions):
    rows = train_rows(dataset="builtin", split="train")
    assert len(rows) == len(questions)
    assert rows[0]["question_id"] == questions[0].question_id
    assert rows[0]["prompt"][0]["content"] == prompts.SYSTEM_PROMPT and rows[0]["prompt"][1]["content"] == ""


def test_system_prompt_is_short_and_states_formats():
    assert len(prompts.SYSTEM_PROMPT) < 400
    for word in ("describe", "query", "answer", "a | b", "[]", "one tool per turn"):
        assert word in prompts.SYSTEM_PROMPT


def test_tool_result_formatting_cuts_long_results():
    obs = SQLObservation(question="q", schema_info="Tables: t", result="x" * 5000, budget_remaining=3)
    text = prompts.format_tool_result(obs)
    assert len(text) < prompts.MAX_OBSERVATION_CHARS + 50 and "more characters cut" in text and "3 steps left" in text
    err = prompts.format_tool_result(SQLObservation(question="q", schema_info="", error="bad", done=True))
    assert err.startswith("Error: bad") and "Episode over" in err


def test_context_budget_keeps_question_schema_and_recent_turns():
    obs = SQLObservation(question="How many singers?", schema_info="Tables: singer\nsinger(id INTEGER PK, name TEXT)",
                         budget_remaining=2, action_history=[f"{i}. QUERY q{i} -> 1 row" for i in range(1, 9)])
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Question: How many singers?"}]
    for i in range(1, 9):
        messages.append({"role": "assistant", "content": f"call {i} " + "y" * 200})
        messages.append({"role": "tool", "name": "query", "content": f"result {i} " + "z" * 200})

    def count(ms):
        return sum(len(m["content"]) for m in ms) // 4

    assert prompts.fit_context(messages, obs, count, 10_000) is messages
    fitted = prompts.fit_context(messages, obs, count, 400)
    assert count(fitted) <= 400
    assert fitted[0]["content"] == "S"
    user = fitted[1]["content"]
    assert "How many singers?" in user and "singer(id INTEGER PK, name TEXT)" in user and "Earlier steps" in user
    assert fitted[-1]["content"].startswith("result 8")  # the most recent turn is kept
    assert len(fitted) < len(messages)
