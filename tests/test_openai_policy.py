"""`--policy openai`: a model behind a real OpenAI-compatible server on 127.0.0.1 plays episodes through the tools.

The server is the project's own (`python -m training.generation.openai_server`) around a tiny model warm-started here for a
few seconds (120 SFT steps: enough to answer in tool calls), and it requires an API key, so a completed run proves
the key was sent. The fault cases are real too: an unreachable port, a refused key, an unknown model name, a
server whose model cannot call tools.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from serverproc import REPO, ServerProcess, free_port

from sqlenv.evaluation.concurrent import evaluate_concurrently
from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import evaluate
from sqlenv.evaluation.openai_policy import OPENAI_TOOLS, TOOLS, EndpointSettings, OpenAIPolicy, redact_url
from sqlenv.evaluation.policies import OraclePolicy
from sqlenv.types import DIFFICULTIES

pytest.importorskip("openai", reason="the openai extra is not installed (pip install 'sqlenv[openai]')")

SERVED_KEY_ENV = "SQLENV_TEST_SERVED_KEY"
SECRET = "sk-test-7f3a9c1e5b-not-a-real-key-41d2"


def _server_command(model: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "training.generation.openai_server", "--model", model, "--port", "{port}", "--threads", "1",
            *extra]


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory, one_cpu_thread):
    """A tiny model warm-started for 120 SFT steps on oracle episodes: it answers with tool calls."""
    from training.models import load_model_and_tokenizer
    from training.warm_start import SFTSettings, run_sft

    model, tokenizer = load_model_and_tokenizer("builtin:tiny", device="cpu")
    run_sft(model, tokenizer, SFTSettings(max_steps=120, batch_size=4, learning_rate=3e-3, episodes=400,
                                          logging_steps=50))
    path = tmp_path_factory.mktemp("openai") / "tiny-sft"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(trained_model):
    """The trained model served on 127.0.0.1 as "tiny-sft", requiring `SECRET` as its API key."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SERVED_KEY_ENV, SECRET)
        proc = ServerProcess(command=_server_command(str(trained_model), "--served-name", "tiny-sft",
                                                     "--api-key-env", SERVED_KEY_ENV))
        proc.start()
    yield proc
    proc.stop()


def _eval(args: list[str], cwd, key: str | None = SECRET, timeout: float = 300):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "SQLENV_DEBUG")}
    env["PYTHONPATH"] = str(REPO)
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "sqlenv", "eval", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)


def _openai_args(url: str, model: str = "tiny-sft", *extra: str) -> list[str]:
    return ["--dataset", "builtin", "--split", "eval", "--policy", "openai", "--base-url", url + "/v1",
            "--model", model, "--budget", "4", "--max-tokens", "48", *extra]


def _assert_one_line_exit_2(res, *needles):
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("sqlenv") and "error:" in lines[0], res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ------------------------------------------------------------------------------------------ no server needed
def test_tools_are_the_tools_training_renders():
    from training.environment.trl_env import tool_schemas

    assert TOOLS == tool_schemas()
    assert OPENAI_TOOLS == [{"type": "function", "function": {k: v for k, v in t["function"].items() if k != "return"}}
                            for t in tool_schemas()]
    assert EndpointSettings("http://h/v1", "m").tools == TOOLS
    assert EndpointSettings("http://h/v1", "m", tool_schemas="openai").tools == OPENAI_TOOLS


def test_concurrent_evaluation_plays_the_episodes_evaluate_plays(builtin):
    """Same seeds, same questions, same results in episode order; one environment per worker."""
    made = []

    def make_env():
        env = SQLEnvironment.from_dataset(builtin.root, "eval", step_budget=10)
        made.append(env)
        return env

    result = evaluate_concurrently(make_env, OraclePolicy, n_episodes=9, seed=3, concurrency=4)
    env = SQLEnvironment.from_dataset(builtin.root, "eval", step_budget=10)
    try:
        expected = evaluate(env, OraclePolicy(), n_episodes=9, seed=3)
    finally:
        env.close()
    assert len(made) == 4
    assert [(e["question_id"], e["seed"], e["outcome"], e["total_reward"]) for e in result.episodes] == \
        [(e["question_id"], e["seed"], e["outcome"], e["total_reward"]) for e in expected.episodes]
    assert result.success_rate == 1.0 and result.policy == "oracle" and result.seed == 3
    assert all(e["wall_s"] >= 0 for e in result.episodes)


def test_concurrent_evaluation_plays_listed_questions_in_order(builtin):
    from sqlenv.data.datasets import load_questions

    ids = [q.question_id for q in load_questions(builtin.questions_path("eval"))][5:12]
    result = evaluate_concurrently(lambda: SQLEnvironment.from_dataset(builtin.root, "eval"), OraclePolicy,
                                   seed=0, concurrency=3, question_ids=ids)
    assert [e["question_id"] for e in result.episodes] == ids and result.success_rate == 1.0
    with pytest.raises(ValueError, match="more than the 7 question_ids"):
        evaluate_concurrently(SQLEnvironment, OraclePolicy, n_episodes=8, question_ids=ids)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        evaluate_concurrently(SQLEnvironment, OraclePolicy, n_episodes=1, concurrency=0)


def test_endpoint_settings_check_their_values():
    for bad in ({"base_url": "ftp://x/v1"}, {"base_url": "localhost:8000"}, {"model": " "}, {"timeout": 0},
                {"max_retries": -1}, {"max_tokens": 0}, {"tool_schemas": "xml"}):
        with pytest.raises(ValueError):
            EndpointSettings(**{"base_url": "http://127.0.0.1:1/v1", "model": "m", **bad})
    assert redact_url("https://user:pw@host:8443/v1") == "https://host:8443/v1"
    described = EndpointSettings("https://user:pw@host/v1", "m").describe()
    assert "pw" not in json.dumps(described)


def test_which_refusals_mean_the_model_cannot_call_tools():
    """A 400 about tools stops the run; one about the context length fails only its episode (real messages)."""
    from sqlenv.evaluation.openai_policy import _about_tools

    assert _about_tools('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    assert _about_tools("registry.ollama.ai/library/gemma:2b does not support tools")
    assert _about_tools("tool calling is not enabled on this server (started with --no-tool-calling)")
    assert not _about_tools("This model's maximum context length is 4096 tokens. However, you requested 5120 tokens "
                            "(4608 in the messages, 512 in the completion). Please reduce the length of the messages.")
    assert not _about_tools("temperature must be a number from 0 to 2")


def test_unreachable_endpoint_is_one_line_exit_2(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    res = _eval(_openai_args(url, "m", "--episodes", "4", "--concurrency", "2", "--timeout", "3",
                             "--max-retries", "1"), tmp_path, timeout=120)
    _assert_one_line_exit_2(res, "cannot reach", url)
    assert time.monotonic() - started < 120  # bounded by the subprocess timeout above as well


@pytest.mark.parametrize("args, needle", [
    (["--policy", "openai", "--model", "m"], "--policy openai needs --base-url"),
    (["--policy", "openai", "--base-url", "http://127.0.0.1:1/v1"], "--policy openai needs --model"),
    (["--policy", "openai", "--base-url", "file:///etc", "--model", "m"], "base URL must be http"),
    (["--policy", "oracle", "--concurrency", "4"], "--concurrency only applies to --policy openai"),
    (["--policy", "random", "--base-url", "http://127.0.0.1:1/v1"], "--base-url only applies"),
    (["--policy", "openai", "--base-url", "http://h/v1", "--model", "m", "--timeout", "0"], "expected a number > 0"),
    (["--policy", "openai", "--base-url", "http://h/v1", "--model", "m", "--chat-template-kwargs", "[1]"],
     "expected a JSON object"),
])
def test_bad_endpoint_flags_are_one_line_exit_2(tmp_path, args, needle):
    _assert_one_line_exit_2(_eval(args, tmp_path), needle)


# --------------------------------------------------------------------------------- against a served model
@pytest.mark.slow
def test_eval_against_a_served_model(server, tmp_path):
    """N episodes complete through real tool calls, each with its hardness, token usage and latency; the key the
    run used (the server refuses any other) is in no file the run wrote, nor in its output or the server's log."""
    out = tmp_path / "out"
    saved = out / "evaluations" / "tiny-sft"
    res = _eval(_openai_args(server.url, "tiny-sft", "--episodes", "8", "--concurrency", "3", "--json",
                             "--transcripts", str(out / "transcripts.jsonl"), "--out", str(saved)), tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["n_episodes"] == 8 and summary["n_errors"] == 0, summary
    assert summary["policy"] == "openai:tiny-sft" and summary["concurrency"] == 3
    assert summary["endpoint"] == {"base_url": server.url + "/v1", "model": "tiny-sft", "temperature": 0.0,
                                   "max_tokens": 48, "tool_schemas": "training", "chat_template_kwargs": None,
                                   "prompt": "full"}
    usage = summary["usage"]
    assert usage["requests"] >= 8 and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["tool_calls"] > 0, "the warm-started model should answer in tool calls"

    episodes = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert [e["seed"] for e in episodes] == list(range(8))
    by_hardness: dict[str, int] = {}
    for e in episodes:
        assert e["difficulty"] in DIFFICULTIES and e["outcome"] in ("correct", "wrong_answer", "budget_exhausted")
        assert e["n_steps"] >= 1 and e["usage"]["requests"] >= 1 and e["usage"]["prompt_tokens"] > 0
        assert e["usage"]["latency_s"] > 0 and e["wall_s"] >= e["usage"]["latency_s"] - 1e-3
        by_hardness[e["difficulty"]] = by_hardness.get(e["difficulty"], 0) + 1
    assert sum(by_hardness.values()) == 8
    cells = summary["breakdown"]["hardness"]  # the per-hardness table, with each cell's count and interval
    assert {k: c["n"] for k, c in cells.items()} == by_hardness
    assert all(len(c["success_ci"]) == 2 for c in cells.values())
    # Saved as a Compare column: the endpoint and its usage recorded, the episodes beside them.
    record = json.loads((saved / "evaluation.json").read_text())
    assert record["endpoint"]["model"] == "tiny-sft" and record["concurrency"] == 3 and record["n_episodes"] == 8
    assert len((saved / "episodes.jsonl").read_text().splitlines()) == 8

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written, "the run wrote its transcripts"
    for text in [res.stdout, res.stderr, server.log] + [p.read_text(errors="replace") for p in written]:
        assert SECRET not in text


@pytest.mark.slow
def test_policy_plays_in_process_with_plain_evaluate(server, builtin, monkeypatch):
    """`OpenAIPolicy` follows the Policy protocol: `sqlenv.evaluate` plays it like any other."""
    monkeypatch.setenv("SQLENV_TEST_CLIENT_KEY", SECRET)
    settings = EndpointSettings(server.url + "/v1", "tiny-sft", api_key_env="SQLENV_TEST_CLIENT_KEY", max_tokens=48)
    env = SQLEnvironment.from_dataset(builtin.root, "eval", step_budget=4)
    try:
        result = evaluate(env, OpenAIPolicy(settings), n_episodes=2, seed=5)
    finally:
        env.close()
    assert result.n_episodes == 2 and result.n_errors == 0
    assert all(e["n_steps"] >= 1 for e in result.episodes)


@pytest.mark.slow
def test_refused_key_is_one_line_exit_2(server, tmp_path):
    wrong = "sk-wrong-key-0000"
    res = _eval(_openai_args(server.url, "tiny-sft", "--episodes", "2"), tmp_path, key=wrong)
    _assert_one_line_exit_2(res, "refused the API key from $OPENAI_API_KEY", "401")
    assert wrong not in res.stderr
    res = _eval(_openai_args(server.url, "tiny-sft", "--episodes", "2"), tmp_path, key=None)
    _assert_one_line_exit_2(res, "$OPENAI_API_KEY is not set")


@pytest.mark.slow
def test_unknown_model_is_one_line_exit_2(server, tmp_path):
    res = _eval(_openai_args(server.url, "gpt-nope", "--episodes", "2"), tmp_path)
    _assert_one_line_exit_2(res, "has no model 'gpt-nope'")


@pytest.mark.slow
def test_model_that_cannot_call_tools_is_one_line_exit_2(tmp_path):
    with ServerProcess(command=_server_command("builtin:tiny", "--served-name", "tiny", "--no-tool-calling")) as proc:
        res = _eval(_openai_args(proc.url, "tiny", "--episodes", "3", "--concurrency", "2"), tmp_path, key=None)
    _assert_one_line_exit_2(res, "model 'tiny'", "cannot call tools")


@pytest.mark.slow
def test_server_answers_bad_requests_with_openai_errors(server):
    """The test server is a real endpoint: bad bodies get 400/401/404 in OpenAI's error shape, not a crash."""
    import urllib.error
    import urllib.request

    def post(body, key=SECRET, raw=None):
        data = raw if raw is not None else json.dumps(body).encode()
        request = urllib.request.Request(server.url + "/v1/chat/completions", data=data, method="POST",
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    ok = {"model": "tiny-sft", "messages": [{"role": "user", "content": "Question: how many artists?"}],
          "max_tokens": 8}
    status, body = post(ok)
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] > 0 and 1 <= body["usage"]["completion_tokens"] <= 8
    for bad, code in [(dict(ok, stream=True), 400), (dict(ok, messages=[]), 400), (dict(ok, messages="hi"), 400),
                      (dict(ok, messages=[{"role": "robot", "content": "x"}]), 400), (dict(ok, max_tokens=0), 400),
                      (dict(ok, max_tokens=10**6), 400), (dict(ok, tools=[{"type": "nope"}]), 400),
                      (dict(ok, model="other"), 404)]:
        status, body = post(bad)
        assert status == code and body["error"]["message"], (bad, status, body)
    assert post(None, raw=b"{not json")[0] == 400
    assert post(dict(ok, chat_template_kwargs="x"))[0] == 400
    thinking = post(dict(ok, chat_template_kwargs={"enable_thinking": True}))
    assert thinking[0] == 200  # the template's thinking opener is left out: another prompt, fewer tokens
    assert thinking[1]["usage"]["prompt_tokens"] < post(ok)[1]["usage"]["prompt_tokens"]
    assert post(ok, key="wrong")[0] == 401
