"""The warm-start teacher's SQL on real Spider databases: one spelling that returns the gold rows, the tables whose
values a SAMPLE shows, the broken query and its fix (left out of the loss), and the extra dataset's questions that
never touch the run's own databases."""

from __future__ import annotations

import json

import pytest

from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import play_episode
from sqlenv.evaluation.policies import OraclePolicy, QueryFixPolicy
from sqlenv.evaluation.teacher_sql import broken_queries, filtered_tables, tidy_sql


@pytest.fixture(scope="module")
def two_spiders(spider_source, tmp_path_factory):
    """Two prepared Spider datasets sharing one database (concert_singer): the run's own, and an extra one."""
    from sqlenv.data.spider import prepare_spider

    root = tmp_path_factory.mktemp("spiders")
    own = prepare_spider(spider_source, root / "own", db_ids="concert_singer,pets_1")
    extra = prepare_spider(spider_source, root / "extra", db_ids="concert_singer,singer,orchestra")
    return own, extra


def test_tidy_sql_writes_one_spelling_and_keeps_quoted_text():
    assert tidy_sql('select T1.name ,  count(*) from singer as T1 where T1.country  =  "France";') == \
        "SELECT T1.name, COUNT(*) FROM singer AS T1 WHERE T1.country = 'France'"
    # Quoted text is not touched (its spaces, its case, a keyword inside it); a string holding ' stays double-quoted.
    assert tidy_sql("SELECT name FROM t WHERE note = 'select  from , x'") == \
        "SELECT name FROM t WHERE note = 'select  from , x'"
    assert tidy_sql('SELECT a FROM t WHERE b = "it\'s"') == 'SELECT a FROM t WHERE b = "it\'s"'
    # Names that merely contain a keyword keep their spelling.
    assert tidy_sql("select order_id, t.count from orders as t") == "SELECT order_id, t.count FROM orders AS t"


def test_the_oracle_queries_tidy_sql_that_returns_the_gold_rows(two_spiders):
    own, _ = two_spiders
    env = SQLEnvironment.from_dataset(own, split="train", step_budget=8)
    changed = 0
    try:
        for question in env.questions:
            obs = env.reset(question_id=question.question_id)
            oracle = OraclePolicy(tidy_sql=True)
            episode = play_episode(env, oracle, question_id=question.question_id)
            query = next(s["argument"] for s in episode["steps"] if s["action_type"] == "QUERY")
            assert episode["correct"], (question.gold_sql, query)
            assert query in (question.gold_sql, tidy_sql(question.gold_sql))
            changed += query != question.gold_sql
            assert obs.question
    finally:
        env.close()
    assert changed > len(env.questions) // 2  # Spider's own spelling is rarely the tidy one


def test_filtered_tables_name_the_tables_compared_with_a_string():
    sql = ("SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id "
           "WHERE T1.theme = 'Happy' AND T2.capacity > 100")
    assert filtered_tables(sql) == ["concert"]
    assert filtered_tables("SELECT count(*) FROM singer WHERE country LIKE '%ance'") == ["singer"]
    assert filtered_tables("SELECT count(*) FROM singer WHERE age > 30") == []
    assert filtered_tables("not sql at all (") == []


def test_broken_queries_fail_with_no_such_column(two_spiders):
    own, _ = two_spiders
    env = SQLEnvironment.from_dataset(own, split="train", step_budget=8)
    sandbox, broke, tried = env.sandbox, 0, 0
    try:
        for question in env.questions:
            database = question.database_name

            def columns(table, database=database):
                return [name for name, _, _ in sandbox.find_table(database, table).columns]

            for sql in broken_queries(question.gold_sql, columns, sandbox.table_names(database)):
                tried += 1
                assert sql != question.gold_sql
                with pytest.raises(Exception, match="no such column"):
                    sandbox.execute(database, sql)
                broke += 1
    finally:
        env.close()
    assert tried and broke == tried


def test_query_fix_episode_reads_the_error_then_answers_right(two_spiders):
    own, _ = two_spiders
    env = SQLEnvironment.from_dataset(own, split="train", step_budget=8)
    fixed = 0
    try:
        for question in env.questions[:40]:
            policy = QueryFixPolicy(seed=1)
            episode = play_episode(env, policy, question_id=question.question_id)
            queries = [s for s in episode["steps"] if s["action_type"] == "QUERY"]
            assert episode["correct"]
            if policy.mistake_turns:
                (turn,) = policy.mistake_turns
                assert episode["steps"][turn] is queries[0] and "no such column" in queries[0]["error"]
                assert len(queries) == 2 and not queries[1]["error"] and queries[1]["argument"] == question.gold_sql
                fixed += 1
            else:
                assert len(queries) == 1
    finally:
        env.close()
    assert fixed >= 10


def test_the_broken_turn_is_seen_but_not_trained(two_spiders, tiny):
    from training.generation.chat import ChatRenderer
    from training.warm_start import teacher_conversations
    from training.warm_start.examples import episode_example

    own, _ = two_spiders
    conversations = teacher_conversations(own, "train", step_budget=8, episodes=30, error_rate=1.0,
                                          mistakes=["query_fix"], prompt="compact", tidy_sql=True)
    renderer = ChatRenderer(tiny[1], chat_template_kwargs={"enable_thinking": False}, prompt="compact")
    checked = 0
    for conversation in conversations:
        messages = conversation["messages"]
        broken = [m for m in messages if m.get("trained") is False]
        if not broken:
            continue
        (turn,) = broken
        arguments = json.loads(turn["tool_calls"][0]["function"]["arguments"])
        after = messages[messages.index(turn) + 1]
        assert after["role"] == "tool" and "no such column" in after["content"]
        marked = episode_example(renderer, messages)
        unmarked = episode_example(renderer, [{k: v for k, v in m.items() if k != "trained"} for m in messages])
        assert marked["input_ids"] == unmarked["input_ids"]  # the same episode, seen whole ...
        dropped = [i for i, (a, b) in enumerate(zip(marked["assistant_masks"], unmarked["assistant_masks"])) if a != b]
        # ... less exactly the broken turn's tokens in the loss: they spell its SQL.
        text = tiny[1].decode([marked["input_ids"][i] for i in dropped])
        assert dropped and arguments["sql"].split()[1] in text
        checked += 1
    assert checked >= 5


def test_extra_episodes_never_touch_the_runs_own_databases(two_spiders):
    from sqlenv.data.datasets import load_questions
    from training.warm_start import foreign_questions, teacher_conversations

    own, extra = two_spiders
    foreign = foreign_questions(extra, own)
    extra_train = load_questions(extra.questions_path("train"))
    assert foreign == {q.question_id for q in extra_train if q.database_name == "concert_singer"}
    played = teacher_conversations(extra, "train", step_budget=8, episodes=200, held_out=foreign, prompt="compact")
    by_id = {q.question_id: q.database_name for q in extra_train}
    assert played and {by_id[c["question_id"]] for c in played} == {"singer", "orchestra"}
