"""The OpenEnv server: a real `python -m sqlenv serve` on 127.0.0.1, driven by SQLEnv's client, by OpenEnv's
`GenericEnvClient` and by raw WebSocket frames.

Every test on the shared server checks the session count before and after (no leaked sessions). The fault
cases: malformed JSON, unknown message and action types, wrong field types, a 1 MB argument, 1 MB reset values
(not sent back), bad HTTP `/reset` values (422), a `state` too big for one reply, a message over the size limit,
an unknown session, a closed session's environment, a client dropping mid-episode, capacity, and a server
restarted under connected clients.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import REPO, ServerProcess, free_port, get_json  # noqa: E402

from sqlenv.environment import SQLEnvironment  # noqa: E402
from sqlenv.evaluation.evaluate import play_episode  # noqa: E402
from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy  # noqa: E402
from sqlenv.types import SQLAction  # noqa: E402


@pytest.fixture(scope="module")
def server(builtin):
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train"]) as proc:
        yield proc


@pytest.fixture()
def no_leak(server):
    """The server holds no session before the test and none after it (closed sessions are released)."""
    assert server.wait_sessions(0) == 0
    yield server
    assert server.wait_sessions(0) == 0, server.sessions()


@pytest.fixture()
def local(builtin):
    env = SQLEnvironment(builtin.questions_path("train"), builtin.db_dir)
    yield env
    env.close()


def _one_per_answer_type(questions):
    picked = {}
    for q in questions:
        picked.setdefault(q.answer_type, q)
    return list(picked.values())


def _ws(server, query: str = "", **kwargs):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{server.port}/ws{query}", proxy=None, compression=None, open_timeout=10,
                   **kwargs)


def _request_raw(ws, message) -> str:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return ws.recv(timeout=30)


def _request(ws, message) -> dict:
    return json.loads(_request_raw(ws, message))


# ----------------------------------------------------------------------------------- same as in-process

def test_oracle_episodes_over_the_wire_match_in_process(no_leak, questions, local):
    from sqlenv.server.remote import RemoteSQLEnvironment

    picks = _one_per_answer_type(questions)
    assert len(picks) >= 4
    with RemoteSQLEnvironment(no_leak.url, questions=questions) as remote:
        for q in picks:
            over_the_wire = play_episode(remote, OraclePolicy(), question_id=q.question_id)
            in_process = play_episode(local, OraclePolicy(), question_id=q.question_id)
            assert over_the_wire["outcome"] == "correct", over_the_wire
            assert over_the_wire == in_process
            assert remote.reward_breakdown == local.reward_breakdown
        assert no_leak.sessions()["open"] == 1  # one instance, one session


def test_random_episodes_over_the_wire_match_in_process(no_leak, questions, local):
    """Seeded resets draw the same questions; errors, repeats and budgets score the same."""
    from sqlenv.server.remote import RemoteSQLEnvironment

    with RemoteSQLEnvironment(no_leak.url, questions=questions, step_budget=6) as remote:
        local.step_budget = 6
        for seed in range(4):
            over_the_wire = play_episode(remote, RandomPolicy(seed=seed), seed=seed)
            in_process = play_episode(local, RandomPolicy(seed=seed), seed=seed)
            assert over_the_wire == in_process
        # Errors, a repeat (same query up to case and spacing) and the budget running out.
        table = questions[0].tables_involved[0]
        script = [SQLAction("DESCRIBE", "no_such_table"), SQLAction("QUERY", "DROP TABLE x"),
                  SQLAction("QUERY", f"SELECT count(*) FROM {table}"), SQLAction("query", f"select  count(*)\nfrom {table};"),
                  SQLAction("FOO", "x"), SQLAction("SAMPLE", table)]
        remote.reset(question_id=questions[0].question_id)
        local.reset(question_id=questions[0].question_id)
        for action in script:
            assert remote.step(action) == local.step(action)
        assert remote.transcript() == local.transcript()
        assert local.transcript()["outcome"] == "budget_exhausted"
        assert [s["layers"]["operational"] for s in local.transcript()["steps"]][2:4] == pytest.approx([0.01, -0.03])


def test_generic_env_client_plays_an_oracle_episode(no_leak, questions, local):
    from openenv.core import GenericEnvClient

    q = questions[3]
    in_process = play_episode(local, OraclePolicy(), question_id=q.question_id)
    with GenericEnvClient(base_url=no_leak.url).sync() as client:
        result = client.reset(question_id=q.question_id)
        assert result.observation["question"] == q.question_text and not result.done
        rewards = []
        for step in in_process["steps"]:
            result = client.step({"action_type": step["action_type"], "argument": step["argument"]})
            rewards.append(result.reward)
        assert result.done and result.observation["result"] == "Answer submitted: correct."
        assert (result.observation["terminated"], result.observation["truncated"]) == (True, False)
        assert rewards == [step["reward"] for step in in_process["steps"]]
        assert result.metadata["reward_breakdown"] == in_process["reward_breakdown"]
        state = client.state()
        assert state["transcript"]["steps"] == in_process["steps"]
        assert state["transcript"]["gold_sql"] == q.gold_sql  # revealed once the episode is over
        client.reset(question_id=q.question_id, step_budget=1)  # a budget running out truncates
        result = client.step({"action_type": "QUERY", "argument": "SELECT 1"})
        assert result.done and (result.observation["terminated"], result.observation["truncated"]) == (False, True)


def test_the_environment_checker_passes_in_process_and_over_the_wire(no_leak, questions, local):
    """Both implementations of `sqlenv.protocol.Environment` keep its contract, reset's step_budget and episode_id
    and the terminated / truncated ends included."""
    from sqlenv.checker import check_env
    from sqlenv.protocol import Environment
    from sqlenv.server.remote import RemoteSQLEnvironment

    with RemoteSQLEnvironment(no_leak.url, questions=questions) as remote:
        assert isinstance(remote, Environment) and isinstance(local, Environment)
        assert check_env(remote) == check_env(local)
        named = remote.reset(question_id=questions[0].question_id, step_budget=3, episode_id="ep-over-the-wire")
        assert named.budget_remaining == 3 and remote.state.step_budget == 3
        assert remote.state.episode_id == "ep-over-the-wire"  # the server's episode carries the caller's id
        assert remote.step(SQLAction("QUERY", "SELECT 1")).error == ""  # the named episode is the one stepped
        assert remote.reset(question_id=questions[0].question_id).budget_remaining == 15


def test_async_sessions_are_independent(no_leak, questions):
    from sqlenv.server.client import SQLEnvClient
    from sqlenv.server.models import SQLAction as WireAction

    a, b = questions[0], questions[40]

    async def play():
        async with SQLEnvClient(base_url=no_leak.url) as one, SQLEnvClient(base_url=no_leak.url) as two:
            first = await asyncio.gather(one.reset(question_id=a.question_id), two.reset(question_id=b.question_id))
            assert no_leak.sessions()["open"] == 2
            steps = await asyncio.gather(one.step(WireAction(action_type="QUERY", argument=a.gold_sql)),
                                         two.step(WireAction(action_type="ANSWER", argument="no idea")))
            state_one, state_two = await asyncio.gather(one.state(), two.state())
            return first, steps, state_one, state_two

    # In a thread of its own: a test before this one may leave an event loop running in the main thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first, steps, state_one, state_two = pool.submit(asyncio.run, play()).result(timeout=120)
    assert first[0].observation.question == a.question_text and first[1].observation.question == b.question_text
    assert steps[0].observation.error == "" and not steps[0].done
    assert steps[1].done and steps[1].observation.result == "Answer submitted: incorrect."
    assert state_one.question_id == a.question_id and state_one.step_count == 1 and not state_one.done
    assert state_one.transcript["gold_sql"] is None and state_one.transcript["gold_answer"] is None  # withheld
    assert state_two.done and state_two.outcome == "wrong_answer" and state_two.transcript["gold_sql"] == b.gold_sql


def test_openenv_validates_the_running_server(no_leak):
    done = subprocess.run([sys.executable, "-m", "openenv.cli", "validate", "--url", no_leak.url, "--json"],
                          capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert report["passed"], report
    assert report["mode"] == "simulation"


def test_schema_describes_the_wire_types(no_leak):
    schema = get_json(no_leak.url + "/schema")
    assert set(schema["action"]["properties"]) >= {"action_type", "argument"}
    assert set(schema["observation"]["properties"]) >= {"question", "schema_info", "result", "error", "done",
                                                        "reward", "metadata"}
    assert "transcript" in schema["state"]["properties"]


def test_http_endpoints_are_stateless(no_leak, questions):
    def post(path, body):
        request = urllib.request.Request(no_leak.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    q = questions[0]
    reset = post("/reset", {"question_id": q.question_id})
    assert reset["observation"]["question"] == q.question_text
    assert reset["observation"]["metadata"]["question_id"] == q.question_id
    step = post("/step", {"action": {"action_type": "DESCRIBE", "argument": "x"}})
    assert "No episode is running" in step["observation"]["error"]  # each HTTP call has its own environment


# ----------------------------------------------------------------------------------------- bad input

def test_malformed_messages_get_clear_errors_and_the_session_goes_on(no_leak, questions):
    q = questions[0]
    with _ws(no_leak) as ws:
        assert _request(ws, "{not json")["data"]["code"] == "INVALID_JSON"
        assert _request(ws, {"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        for data in ({"action_type": 5}, {"argument": "x"}, {"action_type": "QUERY", "argument": ["x"]},
                     {"action_type": "QUERY", "argument": "x", "surprise": 1}):
            reply = _request(ws, {"type": "step", "data": data})
            assert reply["type"] == "error" and reply["data"]["code"] == "VALIDATION_ERROR", reply
        for data, words in (({"question_id": "nope"}, "unknown question_id"), ({"seed": "abc"}, "seed must be"),
                            ({"step_budget": 0}, "step_budget must be"), ({"question_id": 7}, "question_id must")):
            reply = _request(ws, {"type": "reset", "data": data})
            assert reply["data"]["code"] == "EXECUTION_ERROR" and words in reply["data"]["message"], reply
        assert no_leak.sessions()["open"] == 1
        # The same session still plays.
        reply = _request(ws, {"type": "reset", "data": {"question_id": q.question_id}})
        assert reply["type"] == "observation" and reply["data"]["observation"]["question"] == q.question_text
        reply = _request(ws, {"type": "step", "data": {"action_type": "EXPLODE", "argument": "x"}})
        observation = reply["data"]["observation"]
        assert "Unknown action type 'EXPLODE'" in observation["error"] and observation["step_count"] == 1
        assert reply["data"]["reward"] == pytest.approx(-0.02)  # it costs its step, as in-process
        reply = _request(ws, {"type": "step", "data": {"action_type": "query", "argument": q.gold_sql}})
        assert reply["data"]["observation"]["error"] == ""


def test_a_huge_reset_value_is_not_sent_back(no_leak):
    """Issue 26: a 1 MB `question_id` came back whole in the error message. An error quotes a short prefix."""
    with _ws(no_leak, max_size=None) as ws:
        for data, words in (({"question_id": "q" * 1_000_000}, "question_id must be at most"),
                            ({"question_id": "builtin-" + "q" * 200}, "unknown question_id"),
                            ({"step_budget": "9" * 1_000_000}, "step_budget must be"),
                            ({"step_budget": [0] * 2_000}, "step_budget must be"),  # more: see test_server_web
                            ({"episode_id": "e" * 1_000_000}, "episode_id must be")):
            raw = _request_raw(ws, {"type": "reset", "data": data})
            reply = json.loads(raw)
            assert reply["data"]["code"] == "EXECUTION_ERROR" and words in reply["data"]["message"], raw[:300]
            assert len(raw) < 1000, len(raw)
        assert _request(ws, {"type": "reset", "data": {}})["type"] == "observation"  # the session goes on


@pytest.mark.parametrize("body,words", [
    ({"question_id": 7}, "question_id must be a string"),
    ({"question_id": "nope"}, "unknown question_id"),
    ({"question_id": "q" * 1_000_000}, "question_id must be at most"),
    ({"step_budget": 0}, "step_budget must be"),
    ({"step_budget": "x" * 1_000_000}, "step_budget must be"),
    ({"episode_id": "e" * 1_000_000}, "at most 255 characters"),  # refused by OpenEnv's request model
    ({"seed": "s" * 1_000_000}, "valid integer"),
])
def test_http_reset_answers_bad_values_with_422(no_leak, body, words):
    """Issue 26: OpenEnv's `/reset` let the environment's `ValueError` become a 500, and FastAPI's own 422
    sends each failing value back whole. A client's bad value is a 422 with a short reason."""
    import urllib.error

    request = urllib.request.Request(no_leak.url + "/reset", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    reply = refused.value.read()
    assert refused.value.code == 422, (refused.value.code, reply[:300])
    assert words in json.dumps(json.loads(reply)["detail"]) and len(reply) < 1000, reply[:300]


@pytest.mark.parametrize("body", [
    {"action": {"action_type": "QUERY", "argument": {"x": "y" * 900_000}}},  # OpenEnv's own 422
    {"action": {"action_type": "QUERY", "z" * 900_000: 1}},  # a key is the client's too
    {"action": "a" * 900_000},  # FastAPI's 422 (the request's model)
])
def test_no_422_carries_the_value_back(no_leak, body):
    """Issue 49: OpenEnv raises `/step`'s 422 itself, with pydantic's errors (each failing value whole), so the
    app's own handler never ran: 1 MB in, 1 MB back. Every error reply is now made in one place, which keeps
    where, what and the error's type, never the value."""
    import urllib.error

    request = urllib.request.Request(no_leak.url + "/step", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    reply = refused.value.read()
    assert refused.value.code == 422 and len(reply) < 2000, (refused.value.code, len(reply), reply[:300])
    assert json.loads(reply)["detail"][0]["type"], reply[:300]


def test_a_state_reply_is_bounded(no_leak):
    """Issue 26: a 1,000-step episode of 10 KB arguments made `state` replies of 10 MB, each built on the server's
    event loop (~50 ms of every session's time). A transcript over the bound is left out of the reply, saying
    why; the state's other fields are still there."""
    from sqlenv.server.environment import MAX_STATE_TRANSCRIPT_CHARS

    bound = MAX_STATE_TRANSCRIPT_CHARS + 200_000  # the step text allowed, plus each step's keys and numbers
    with _ws(no_leak, max_size=None) as ws:
        assert _request(ws, {"type": "reset", "data": {"step_budget": 1000}})["type"] == "observation"
        state = None
        for i in range(1, 401):
            sql = f"SELECT '{i:04d}{'y' * 9000}'"  # ~9 KB of argument and 2 KB of observation a step
            reply = _request(ws, {"type": "step", "data": {"action_type": "QUERY", "argument": sql}})
            assert reply["type"] == "observation", str(reply)[:300]
            if i % 20 == 0:
                raw = _request_raw(ws, {"type": "state"})
                assert len(raw) <= bound, (i, len(raw))  # the old server: 1 MB at step 100, 4 MB at step 400
                state = json.loads(raw)["data"]
                if state["transcript"] is None:
                    break
        assert state["transcript"] is None and state["step_count"] == i, (i, str(state)[:300])
        assert f"{MAX_STATE_TRANSCRIPT_CHARS:,}" in state["transcript_omitted"]
        assert _request(ws, {"type": "step", "data": {"action_type": "ANSWER", "argument": "1"}})["type"] == \
            "observation"  # the session goes on


def test_a_closed_session_environment_refuses_to_play(builtin, questions):
    """A session's environment closed by the server (its connection ended or went silent) is never played
    again, whatever still holds it: OpenEnv's reaper used to close it while its WebSocket went on resetting and
    stepping there (outside the session limit, `/sessions` saying 0)."""
    from sqlenv.server.environment import ServerConfig, SessionClosedError, SQLEnvServerEnvironment
    from sqlenv.server.models import SQLAction as WireAction

    config = ServerConfig.from_dataset(builtin.root)
    env = SQLEnvServerEnvironment(config)
    assert config.sessions.open == 1
    env.reset(question_id=questions[0].question_id)
    env.close()
    assert config.sessions.open == 0
    for play in (lambda: env.reset(question_id=questions[0].question_id),
                 lambda: env.step(WireAction(action_type="QUERY", argument="SELECT 1")), lambda: env.state):
        with pytest.raises(SessionClosedError, match="connect again"):
            play()
    assert config.sessions.open == 0


@pytest.mark.parametrize("kind", ["DESCRIBE", "SAMPLE", "QUERY", "ANSWER"])
def test_a_1mb_argument_is_an_ordinary_observation(no_leak, questions, local, kind):
    from sqlenv.server.remote import RemoteSQLEnvironment

    q = questions[1]
    argument = "SELECT " + "x" * 1_000_000 if kind == "QUERY" else "x" * 1_000_000
    with RemoteSQLEnvironment(no_leak.url, questions=questions) as remote:
        remote.reset(question_id=q.question_id)
        local.reset(question_id=q.question_id)
        over_the_wire = remote.step(SQLAction(kind, argument))
        assert over_the_wire == local.step(SQLAction(kind, argument))
        assert over_the_wire.error or over_the_wire.result == "Answer submitted: incorrect."
        assert remote.transcript() == local.transcript()
        assert len(remote.transcript()["steps"][0]["argument"]) <= 10_000


@pytest.mark.parametrize("argument", ["caf\udce9", "a\x00b", "emoji 🙂 ü", "\n\t ;"])
def test_odd_text_arguments_travel_and_score_as_in_process(no_leak, questions, local, argument):
    from sqlenv.server.remote import RemoteSQLEnvironment

    q = questions[1]
    with RemoteSQLEnvironment(no_leak.url, questions=questions) as remote:
        remote.reset(question_id=q.question_id)
        local.reset(question_id=q.question_id)
        for kind in ("DESCRIBE", "QUERY", "ANSWER"):
            assert remote.step(SQLAction(kind, argument)) == local.step(SQLAction(kind, argument))
        assert remote.transcript() == local.transcript()


def test_a_message_over_the_size_limit_closes_only_its_connection(no_leak, questions):
    from websockets.exceptions import ConnectionClosed

    from sqlenv.server.app import WS_MAX_MESSAGE_BYTES
    from sqlenv.server.remote import RemoteSQLEnvironment

    with RemoteSQLEnvironment(no_leak.url, questions=questions) as healthy:
        healthy.reset(question_id=questions[2].question_id)
        with _ws(no_leak) as ws:
            _request(ws, {"type": "reset", "data": {}})
            with pytest.raises(ConnectionClosed) as closed:
                ws.send(json.dumps({"type": "step", "data": {"action_type": "QUERY",
                                                              "argument": "x" * (WS_MAX_MESSAGE_BYTES + 1)}}))
                ws.recv(timeout=30)
            assert closed.value.rcvd is None or closed.value.rcvd.code == 1009  # "message too big" (if it arrives)
        assert no_leak.wait_sessions(1) == 1
        assert play_episode(healthy, OraclePolicy(), question_id=questions[2].question_id)["outcome"] == "correct"


def test_an_unknown_session_is_refused(no_leak):
    with _ws(no_leak, "?session_id=no-such-session") as ws:
        reply = json.loads(ws.recv(timeout=30))
        assert reply["type"] == "error" and "Unknown session_id" in reply["data"]["message"]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"session_id": "no-such-session"}}
    request = urllib.request.Request(no_leak.url + "/mcp", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        reply = json.loads(response.read())
    assert "Unknown session_id" in reply["error"]["message"]


def test_a_client_dropping_mid_episode_leaves_no_session(no_leak, questions):
    from sqlenv.server.remote import RemoteSQLEnvironment

    q = questions[5]
    with RemoteSQLEnvironment(no_leak.url, questions=questions) as healthy:
        healthy.reset(question_id=q.question_id)
        healthy.step(SQLAction("DESCRIBE", q.tables_involved[0]))
        for _ in range(3):
            with _ws(no_leak) as ws:
                _request(ws, {"type": "reset", "data": {"question_id": q.question_id}})
                _request(ws, {"type": "step", "data": {"action_type": "QUERY", "argument": q.gold_sql}})
                ws.close_socket()  # the TCP connection drops: no close frame
        assert no_leak.wait_sessions(1) == 1  # only the healthy client's session is left
        observation = healthy.step(SQLAction("QUERY", q.gold_sql))
        assert observation.error == "" and healthy.step(SQLAction("ANSWER", "?")).done


def _listening_on(port: int) -> int:
    """How many sockets listen on 127.0.0.1:`port` (the kernel's table of TCP sockets; state 0A is LISTEN)."""
    entries = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in entries
               if line.split()[1] == f"0100007F:{port:04X}" and line.split()[3] == "0A")


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's table of TCP sockets")
def test_the_server_accepts_on_several_sockets_and_serves_each(no_leak):
    """uvloop accepts one connection per listening socket per turn of its loop: with one socket, a client that
    reconnects in a loop queued every newcomer behind its own connections (`/health` waited 3.6 s under the
    soak). The server listens with `LISTENERS` sockets on its port, and each of them is served: a burst of
    connections, which the kernel spreads over all of them, is answered whole."""
    from sqlenv.server.connections import LISTENERS

    assert LISTENERS > 1 and _listening_on(no_leak.port) == LISTENERS

    def health(_):
        with socket.create_connection(("127.0.0.1", no_leak.port), timeout=30) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
            return reply.startswith(b"HTTP/1.1 200") and b'"healthy"' in reply

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        assert all(pool.map(health, range(8 * LISTENERS)))


def _thread_nices(pid: int) -> dict[int, int]:
    """Each thread of process `pid` (Linux: /proc/<pid>/task) and its nice value."""
    import os

    nices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            nices[int(task.name)] = os.getpriority(os.PRIO_PROCESS, int(task.name))
    return nices


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_sessions_run_below_the_event_loop(no_leak, questions):
    """A session's thread runs `SESSION_THREAD_NICE` below the process, so its statements take only what the
    event loop (the main thread, which relays every session and answers `/health`) leaves of the cores."""
    from sqlenv.server.environment import SESSION_THREAD_NICE
    from sqlenv.server.remote import RemoteSQLEnvironment

    pid = no_leak.proc.pid
    before = _thread_nices(pid)
    q = questions[3]
    with RemoteSQLEnvironment(no_leak.url, questions=questions) as env:
        env.reset(question_id=q.question_id)
        assert env.step(SQLAction("QUERY", q.gold_sql)).error == ""
        after = _thread_nices(pid)
    base = before[pid]
    assert after[pid] == base  # the event loop's thread keeps the process's priority
    assert min(19, base + SESSION_THREAD_NICE) in after.values()


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_a_thread_running_an_event_loop_is_never_lowered():
    """OpenEnv builds an HTTP request's environment on the event loop's own thread: that thread keeps its
    priority wherever the loop runs, and a worker thread of the same loop is lowered."""
    import os

    from sqlenv.server.environment import SESSION_THREAD_NICE, lower_session_thread

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen = {}

    def loop_thread():
        async def main():
            seen["loop before"] = nice()
            lower_session_thread()
            seen["loop"] = nice()

            def worker():
                seen["worker before"] = nice()
                lower_session_thread()
                seen["worker"] = nice()

            await asyncio.to_thread(worker)  # the loop's own executor, shut down with it

        asyncio.run(main())

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join(30)
    assert seen["loop"] == seen["loop before"]
    assert seen["worker"] == min(19, seen["worker before"] + SESSION_THREAD_NICE)


def test_listening_sockets_share_one_port_and_a_port_in_use_is_refused():
    from sqlenv.server.connections import listening_sockets

    sockets = listening_sockets("127.0.0.1", 0, 4)
    try:
        assert len({sock.getsockname() for sock in sockets}) == 1  # port 0: one free port for all four
        with socket.socket() as taken:  # a socket listening without SO_REUSEPORT keeps its port
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(OSError):
                listening_sockets("127.0.0.1", taken.getsockname()[1], 4)
    finally:
        for sock in sockets:
            sock.close()
    with pytest.raises(ValueError, match="at least 1"):
        listening_sockets("127.0.0.1", 0, 0)


def test_a_port_in_use_is_one_line_and_exit_code_2(builtin):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "sqlenv", "serve", "--dataset", str(builtin.root), "--port",
                               str(port)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and f"cannot listen on 127.0.0.1:{port}" in done.stderr


# ------------------------------------------------------------------------- capacity and restarts

@pytest.fixture(scope="module")
def small_server(builtin):
    """A second server with room for two sessions (restarted by a test)."""
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--max-sessions", "2"]) as proc:
        yield proc


def test_capacity_is_enforced_and_released(small_server, questions):
    from sqlenv.server.remote import RemoteSQLEnvironment, ServerError

    q = questions[0]
    one = RemoteSQLEnvironment(small_server.url, questions=questions)
    two = RemoteSQLEnvironment(small_server.url, questions=questions)
    three = RemoteSQLEnvironment(small_server.url, questions=questions)
    try:
        one.reset(question_id=q.question_id)
        two.reset(question_id=q.question_id)
        with pytest.raises(ServerError, match="CAPACITY_REACHED"):
            three.reset(question_id=q.question_id)
        assert small_server.sessions() == {"open": 2, "max": 2}
        one.close()
        assert small_server.wait_sessions(1) == 1
        assert three.reset(question_id=q.question_id).question == q.question_text
        assert two.step(SQLAction("QUERY", q.gold_sql)).error == ""
    finally:
        for env in (one, two, three):
            env.close()
    assert small_server.wait_sessions(0) == 0


def test_a_server_restart_under_connected_clients(small_server, questions, local):
    from sqlenv.server.client import SQLEnvClient
    from sqlenv.server.models import SQLAction as WireAction
    from sqlenv.server.remote import RemoteSQLEnvironment

    q = questions[7]
    remote = RemoteSQLEnvironment(small_server.url, questions=questions, reconnect_timeout_s=60)
    typed = SQLEnvClient(base_url=small_server.url).sync()
    try:
        remote.reset(question_id=q.question_id)
        remote.step(SQLAction("DESCRIBE", q.tables_involved[0]))
        typed.reset(question_id=q.question_id)

        small_server.restart()

        # Mid-episode: the episode is gone with the old process. The remote environment ends it with an error
        # observation (step never raises) and the next reset connects to the new process.
        lost = remote.step(SQLAction("QUERY", q.gold_sql))
        assert lost.done and "Lost the connection to the SQLEnv server" in lost.error
        assert lost.truncated and not lost.terminated  # cut short from outside, not an end of the task
        transcript = remote.transcript()
        assert transcript["outcome"] == "error" and len(transcript["steps"]) == 2
        assert remote.step(SQLAction("ANSWER", "1")).error.startswith("The episode is over")
        assert play_episode(remote, OraclePolicy(), question_id=q.question_id) == \
            play_episode(local, OraclePolicy(), question_id=q.question_id)
        # OpenEnv's client reconnects by itself: the new session has no episode until a reset.
        result = typed.step(WireAction(action_type="QUERY", argument=q.gold_sql))
        assert "No episode is running" in result.observation.error
        assert typed.reset(question_id=q.question_id).observation.question == q.question_text

        # A reset while the server is down waits for it (up to reconnect_timeout_s).
        small_server.stop()
        restarter = threading.Timer(2.0, small_server.start)
        restarter.start()
        try:
            started = time.monotonic()
            assert remote.reset(question_id=q.question_id).question == q.question_text
            assert time.monotonic() - started >= 1.5
        finally:
            restarter.join()
    finally:
        remote.close()
        typed.close()
    assert small_server.wait_sessions(0) == 0


def test_reset_gives_up_on_a_server_that_stays_down(questions):
    from sqlenv.server.remote import RemoteSQLEnvironment

    with RemoteSQLEnvironment(f"http://127.0.0.1:{free_port()}", questions=questions,
                              reconnect_timeout_s=1.0, connect_timeout_s=1.0) as remote:
        with pytest.raises(ConnectionError, match="unreachable"):
            remote.reset(question_id=questions[0].question_id)
        assert remote.step(SQLAction("QUERY", "SELECT 1")).error.startswith("No episode is running")


# ------------------------------------------------------------------------------ packaging and CLI

@pytest.mark.parametrize("args,words", [
    (["--split", "nope"], "no split 'nope'"),
    (["--dataset", "no/such/dataset"], "no/such/dataset"),
    (["--port", "70000"], "port number"),
    (["--max-sessions", "0"], "positive integer"),
])
def test_serve_cli_bad_arguments_exit_2_with_one_line(args, words):
    done = subprocess.run([sys.executable, "-m", "sqlenv", "serve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr


def test_the_core_package_imports_no_web_stack():
    code = ("import sys, sqlenv, sqlenv.environment, sqlenv.evaluation.evaluate, sqlenv.cli, sqlenv.data.datasets; "
            "sqlenv.cli.build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'openenv', 'fastapi', 'starlette', 'uvicorn', 'websockets', 'pydantic', 'gradio', 'httpx'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_readme_server_example_runs(no_leak):
    import contextlib
    import io
    import re

    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "GenericEnvClient" in b)
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(block.replace("http://127.0.0.1:8000", no_leak.url), "README.md", "exec"), namespace)
    assert namespace["result"].observation["error"] == "" and namespace["obs"].done
    assert printed.getvalue().rstrip().endswith(" correct")


def test_openenv_manifest_names_the_wire_types():
    import yaml

    manifest = yaml.safe_load((REPO / "openenv.yaml").read_text())
    assert manifest["name"] == "sqlenv" and manifest["port"] == 8000
    module, _, name = manifest["client"].partition(":")
    assert getattr(__import__(module, fromlist=[name]), name).__name__ == "SQLEnvClient"
    from sqlenv.server import models

    assert hasattr(models, manifest["action"]) and hasattr(models, manifest["observation"])


def test_a_serving_process_never_loads_gradio():
    """OpenEnv imports its Gradio web interface whenever Gradio is installed (it is, for the dashboard); the server
    never serves it, and loading it cost each server ~4 s of CPU at start and ~120 MB of memory."""
    code = ("import sys\n"
            "from sqlenv.cli.serve import server_stack\n"
            "serve, config = server_stack()\n"
            "import openenv.core.env_server as env_server\n"
            "assert sys.modules.get('gradio') is None, 'gradio was imported'\n"
            "assert env_server.create_web_interface_app is None and env_server.create_app is not None\n"
            "print(serve.__module__, config.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["sqlenv.server.app", "ServerConfig"]
