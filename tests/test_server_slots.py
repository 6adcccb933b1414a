"""Python slots (`sqlenv.server.environment.PythonSlots`): a real server on 127.0.0.1 bounds how many sessions run a
step's Python work at once, and a session's statement (a 5 s hostile query) runs without a slot, so it never holds
up another session's steps (the server's own loop probe says how many steps hold a slot). What a bound buys (`/health`
and honest steps answered in time beside 64 hostile sessions) is a timing, for `bench/security/soak.py`
(docs/EXPERIMENTS.md section 12)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import ServerProcess  # noqa: E402

from sqlenv.evaluation.policies import OraclePolicy  # noqa: E402
from sqlenv.server.environment import PYTHON_SLOTS_ENV, PythonSlots  # noqa: E402
from sqlenv.server.loop_probe import PROBE_FILE_ENV  # noqa: E402

#: Runs until the sandbox's time limit (5 s) stops it: no row comes out before.
RUNAWAY = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


@pytest.fixture(scope="module")
def one_slot(builtin, tmp_path_factory):
    """A server with one Python slot, its event-loop probe writing to a file (as the soak runs it)."""
    probe = tmp_path_factory.mktemp("probe") / "loop.jsonl"
    with pytest.MonkeyPatch.context() as env:
        env.setenv(PYTHON_SLOTS_ENV, "1")
        env.setenv(PROBE_FILE_ENV, str(probe))
        with ServerProcess(["--dataset", str(builtin.root), "--split", "train"]) as proc:
            proc.probe = probe
            yield proc


def _ws(server):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{server.port}/ws", proxy=None, compression=None, open_timeout=10)


def _request(ws, message: dict) -> dict:
    ws.send(json.dumps(message))
    return json.loads(ws.recv(timeout=60))


def _oracle_outcomes(server, questions) -> list[str]:
    """Oracle episodes on one session (the sync client), one per question; their outcomes."""
    from sqlenv.evaluation.evaluate import play_episode
    from sqlenv.server.remote import RemoteSQLEnvironment

    with RemoteSQLEnvironment(server.url, questions=questions) as remote:
        return [play_episode(remote, OraclePolicy(), question_id=q.question_id)["outcome"] for q in questions]


def test_a_running_statement_holds_no_python_slot(one_slot, questions):
    """With one slot, two sessions each running a statement until its 5 s limit both hold none: the server's probe
    sees both steps under way at once with no slot held (had a statement kept its step's slot, the other step would
    wait for it holding none, and at most one step would be without a slot). Meanwhile a third session's oracle
    episodes (resets, DESCRIBE, QUERY, ANSWER: each step needing the slot) end correct."""
    with _ws(one_slot) as slow_a, _ws(one_slot) as slow_b:
        for ws in (slow_a, slow_b):
            assert _request(ws, {"type": "reset", "data": {}})["type"] == "observation"
            ws.send(json.dumps({"type": "step", "data": {"action_type": "QUERY", "argument": RUNAWAY}}))
        assert _oracle_outcomes(one_slot, questions[:2]) == ["correct", "correct"]
        for ws in (slow_a, slow_b):
            reply = json.loads(ws.recv(timeout=60))
            assert reply["type"] == "observation"
            assert "timed out" in reply["data"]["observation"]["error"], reply
    assert one_slot.wait_sessions(0) == 0
    windows = _probe(one_slot)
    assert max(w["steps_unslotted_max"] for w in windows) >= 2  # both statements under way, neither holding the slot
    assert max(w["steps_python_max"] for w in windows) <= 1


def _probe(server) -> list[dict]:
    windows = [json.loads(line) for line in server.probe.read_text().splitlines()]
    assert windows, "the probe wrote nothing"
    return windows


def test_one_slot_serves_many_sessions_one_step_at_a_time(one_slot, questions):
    """Eight sessions playing oracle episodes at once on a one-slot server all end correct, and the server's probe
    never saw more than one step holding the slot."""
    import threading

    outcomes: list[str] = []

    def play(index: int) -> None:
        outcomes.extend(_oracle_outcomes(one_slot, questions[index::8][:3]))

    players = [threading.Thread(target=play, args=(i,)) for i in range(8)]
    for thread in players:
        thread.start()
    for thread in players:
        thread.join(120)
    assert outcomes == ["correct"] * 24
    assert one_slot.wait_sessions(0) == 0
    assert max(w["steps_python_max"] for w in _probe(one_slot)) <= 1


def test_slots_are_counted_whole():
    assert PythonSlots(3).slots == 3
    assert PythonSlots().slots is None  # no bound by default
    with pytest.raises(ValueError, match="at least 1"):
        PythonSlots(0)
    slots = PythonSlots(1)
    with slots.held():
        with slots.held():  # re-entrant on one thread
            assert slots.held_now == 1
        with slots.released():
            assert slots.held_now == 0
        assert slots.held_now == 1
    assert slots.held_now == 0
    unbounded = PythonSlots()
    with unbounded.held():  # counted, never waited for
        assert unbounded.held_now == 1
        with unbounded.released():
            assert unbounded.held_now == 0
    assert unbounded.held_now == 0
