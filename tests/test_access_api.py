"""The dashboard's events called straight through its API, as anyone on the internet could once it is public.

A real `python app.py` on 127.0.0.1 per access mode. Anonymous callers (gradio_client, and raw HTTP for what
the client will not send) must be refused by the server for every event that spends the owner's compute or
changes runs, and nothing may start; the owner (password token, or a Hub login's session for a Space) gets
through. Visitors' events get hostile values and must answer with a clear message and keep serving.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import time

import httpx
import pytest

from app_server import app_config, call_event, default_inputs, serve
from training.run.directory import RunDir

PASSWORD = "correct horse battery staple"
REFUSED = "Refused: only the owner may"
# Private but not owner-only: the owner bar's own events (log in, log out, set the page up) and the page's
# unload (closes the caller's own Play episode).
GATE_EVENTS = ("login", "logout", "on_load", "close_play_episodes")
OWNER_EVENTS = {"start", "stop", "push", "on_dataset"}  # at least these are owner-only (on_dataset: Train form)
MEGABYTE = "x" * 1_000_000


@pytest.fixture(scope="module")
def password_app():
    with serve({"SQLENV_ADMIN_PASSWORD": PASSWORD}, log_name="password") as app:
        app["config"] = app_config(app["url"])
        yield app


def deps_by_name(config):
    return {d["api_name"]: d for d in config["dependencies"] if d.get("backend_fn")}


def elem_ids(config, ids):
    by_id = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}
    return [by_id.get(i) for i in ids]


def event(config, api_prefix, output_elem_id=None):
    """The dependency named `api_prefix` (or `api_prefix_N`) writing to the component `output_elem_id`."""
    for d in config["dependencies"]:
        name = d.get("api_name") or ""
        if d.get("backend_fn") and (name == api_prefix or name.startswith(api_prefix + "_")):
            if output_elem_id is None or output_elem_id in elem_ids(config, d["outputs"]):
                return d
    raise LookupError(f"no event {api_prefix} -> {output_elem_id}")


def call(app, dep, data, **kwargs):
    return call_event(app["url"], dep["id"], data, queued=dep.get("queue", True) is not False, **kwargs)


def files_and_times(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*"))


def run_dirs(app):
    return sorted(p.name for p in app["runs"].iterdir() if p.name != "models")


def login(app, password=PASSWORD):
    result = call(app, event(app["config"], "login"), [password])
    assert result["success"], result
    return result["output"][0]  # the token the page keeps in localStorage


# ------------------------------------------------------------------------------- issue 20: findings 5, 6, 7
def test_log_out_revokes_the_token(password_app):
    """A token issued before Log out used to stop a run afterwards (valid up to 12 h)."""
    config = password_app["config"]
    token = login(password_app)
    stop = event(config, "stop")
    assert call(password_app, stop, [*default_inputs(config, stop)[:-1], token])["success"]
    assert call(password_app, event(config, "logout"), [token])["success"]
    after = call(password_app, stop, [*default_inputs(config, stop)[:-1], token])
    assert not after["success"] and REFUSED in after["error"], after


def test_wrong_passwords_lock_out_only_their_sender():
    """Five wrong passwords a minute from anyone used to block every login. Behind one trusted proxy (as on a
    Space) clients are told apart by the proxy's X-Forwarded-For entry."""
    with serve({"SQLENV_ADMIN_PASSWORD": PASSWORD, "SQLENV_PROXY_HOPS": "1"}, log_name="throttle") as app:
        app["config"] = config = app_config(app["url"])
        guesser, owner = {"X-Forwarded-For": "203.0.113.9"}, {"X-Forwarded-For": "198.51.100.1"}
        for _ in range(5):
            assert "Wrong password" in call(app, event(config, "login"), ["guess"], headers=guesser)["output"][1]
        refused = call(app, event(config, "login"), [PASSWORD], headers=guesser)
        assert refused["output"][0] == "" and "Too many wrong passwords" in refused["output"][1]
        spoofed = {"X-Forwarded-For": "1.2.3.4, 203.0.113.9"}  # words of its own left of the proxy's entry
        assert "Too many" in call(app, event(config, "login"), [PASSWORD], headers=spoofed)["output"][1]
        welcome = call(app, event(config, "login"), [PASSWORD], headers=owner)
        assert welcome["output"][0] and 'data-owner="true"' in welcome["output"][1]

        # Issue 43, finding 8: the same client in the two spellings that went unthrottled 8 times of 8. (a) A
        # header line of the client's own, then the proxy's line; (b) a new IPv6 address of one /64 each try.
        for spelling in (lambda i: [("X-Forwarded-For", f"6.6.6.{i}"), ("X-Forwarded-For", "203.0.113.20")],
                         lambda i: {"X-Forwarded-For": f"2001:db8:43:8::{i + 1:x}"}):
            answers = [call(app, event(config, "login"), ["guess"], headers=spelling(i))["output"][1]
                       for i in range(6)]
            assert all("Wrong password" in a for a in answers[:5]) and "Too many" in answers[5], answers


def test_uploads_are_refused_and_nothing_can_be_read_back(password_app):
    """`POST /gradio_api/upload` took files (1 byte each, 1000 a request, unbounded) served back by /file=."""
    import httpx

    for payload in (b"", b"x", b"x" * 1024):
        upload = httpx.post(password_app["url"] + "gradio_api/upload", files={"files": ("a.txt", payload)})
        assert upload.status_code == 403 and "no files" in upload.text, upload.text[:200]
    many = httpx.post(password_app["url"] + "gradio_api/upload",
                      files=[("files", (f"{i}.txt", b"x")) for i in range(100)])
    assert many.status_code == 403
    assert password_app["proc"].poll() is None


# ------------------------------------------------------------------------------------ owner-only events
def test_gradio_client_sees_no_owner_events_and_cannot_call_them(password_app):
    from gradio_client import Client

    client = Client(password_app["url"], verbose=False)
    named = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    listed = {name.strip("/") for name in named}
    assert listed and not listed & (OWNER_EVENTS | {"login", "login_1", "logout"}), listed
    with pytest.raises(ValueError, match="Cannot find a function"):
        client.predict(api_name="/start")
    assert run_dirs(password_app) == []


def test_every_anonymous_call_is_refused_or_harmless_and_starts_nothing(password_app):
    """Every event of the page, called anonymously with the values a fresh page sends (and a forged owner
    token): owner-only events are refused by the server, and no event starts a run or writes one."""
    config = password_app["config"]
    # A finished run that an unguarded event could change (resume it, push it, delete it): it must not change.
    existing = RunDir.create(password_app["runs"], "run-existing")
    existing.write_config({"model": "builtin:tiny"})
    existing.write_status("completed", step=2, total_steps=2)
    existing.append("metrics", {"step": 1, "reward": 0.1})
    (existing.final_dir).mkdir()
    (existing.final_dir / "model.safetensors").write_bytes(b"weights")
    before = files_and_times(existing.path)
    refused = set()
    for dep in config["dependencies"]:
        if not dep.get("backend_fn"):
            continue
        data = default_inputs(config, dep)
        result = call(password_app, dep, data)
        name = dep["api_name"]
        if dep.get("api_visibility") == "private" and not name.startswith(GATE_EVENTS):
            assert not result["success"] and REFUSED in (result["error"] or ""), (name, result)
            refused.add(name)
            # A forged token in the owner-token input (always the last) is no better than none.
            forged = call(password_app, dep, [*data[:-1], "9999999999." + "0" * 64])
            assert not forged["success"] and REFUSED in forged["error"], (name, forged)
    assert OWNER_EVENTS <= refused, refused
    time.sleep(1.0)  # a run started by mistake would have created its directory by now
    assert run_dirs(password_app) == ["run-existing"]
    assert files_and_times(existing.path) == before
    assert "Started" not in password_app["log"].read_text()
    shutil.rmtree(existing.path)


def test_the_owner_logs_in_with_the_password_and_controls_training(password_app):
    config = password_app["config"]
    wrong = call(password_app, event(config, "login"), ["guess"])
    assert wrong["output"][0] == "" and "Wrong password" in wrong["output"][1]
    token = login(password_app)
    assert token and 'data-owner="true"' in call(password_app, event(config, "login"), [PASSWORD])["output"][1]
    stop = event(config, "stop")
    result = call(password_app, stop, [*default_inputs(config, stop)[:-1], token])
    assert result["success"], result
    assert "No run is training" in result["output"][0]
    # The page-load check: the token enables the controls on a reload; no token leaves them off.
    load = next(d for d in config["dependencies"] if (d.get("api_name") or "").startswith("on_load")
                and "owner-status" in elem_ids(config, d["outputs"]))
    assert 'data-owner="true"' in call(password_app, load, [token])["output"][0]
    visitor = call(password_app, load, [""])["output"]
    assert 'data-owner="false"' in visitor[0]
    # The login is greyed out until that check has answered: a login answered before it was undone by it (CI saw a
    # "Wrong password." note wiped on a loaded machine), so the check is what enables it.
    props = {c.get("props", {}).get("elem_id"): c.get("props", {}) for c in config["components"]}
    assert props["owner-password"]["interactive"] is False and props["owner-login"]["interactive"] is False
    enabled = dict(zip(elem_ids(config, load["outputs"]), visitor))
    assert enabled["owner-password"]["interactive"] is True and enabled["owner-login"]["interactive"] is True


# ---------------------------------------------------------------------------------------- other modes
def test_a_space_without_an_owner_has_its_controls_off_and_says_how_to_turn_them_on():
    with serve({"SPACE_ID": "alice/sqlenv", "SPACE_AUTHOR_NAME": "alice"}, log_name="locked") as app:
        config = app_config(app["url"])
        status = next(c for c in config["components"] if c.get("props", {}).get("elem_id") == "owner-status")
        text = status["props"]["value"]
        assert 'data-mode="locked"' in text and "SQLENV_ADMIN_PASSWORD" in text and "hf_oauth: true" in text
        start = event(config, "start")
        assert {c["props"].get("interactive") for c in config["components"]
                if c["id"] in start["inputs"][:-2]} == {False}  # the Train form, greyed out
        result = call(app, start, default_inputs(config, start))
        assert not result["success"] and "no owner is configured" in result["error"]
        assert run_dirs(app) == []


def session_cookie(client_secret: str, username: str) -> dict[str, str]:
    """The signed session cookie that Gradio's OAuth callback stores after a Hub login (Starlette's
    SessionMiddleware format, signed with the key Gradio derives from the Space's OAuth secret): what a
    browser sends once the Hub has said who the user is. No Hub involved."""
    from itsdangerous import TimestampSigner

    info = {"access_token": "hf_oauth_test", "token_type": "bearer", "scope": "openid profile",
            "expires_at": int(time.time()) + 3600,
            "userinfo": {"sub": "1", "name": username.title(), "preferred_username": username,
                         "profile": f"https://huggingface.co/{username}", "picture": ""}}
    secret = hashlib.sha256((client_secret + "-v4").encode()).hexdigest()
    data = base64.b64encode(json.dumps({"oauth_info": info}).encode())
    return {"session": TimestampSigner(secret).sign(data).decode()}


def test_on_a_space_with_hub_login_only_the_owners_control_training():
    pytest.importorskip("authlib")
    pytest.importorskip("itsdangerous")
    secret = "oauth-client-secret"
    env = {"SYSTEM": "spaces", "SPACE_ID": "alice/sqlenv", "SPACE_AUTHOR_NAME": "alice", "OAUTH_CLIENT_ID": "client-id",
           "OAUTH_CLIENT_SECRET": secret, "OAUTH_SCOPES": "openid profile",
           # Never contacted: only the /login/huggingface redirect (not used here) would fetch it.
           "OPENID_PROVIDER_URL": "http://127.0.0.1:9"}
    with serve(env, log_name="oauth") as app:
        config = app_config(app["url"])
        assert any(c.get("props", {}).get("elem_id") == "owner-oauth" for c in config["components"])
        stop = event(config, "stop")
        data = default_inputs(config, stop)
        owner = call(app, stop, data, cookies=session_cookie(secret, "alice"))
        assert owner["success"] and "No run is training" in owner["output"][0], owner
        for cookies in (session_cookie(secret, "bob"), None, session_cookie("another-secret", "alice")):
            other = call(app, stop, data, cookies=cookies)
            assert not other["success"] and REFUSED in other["error"] and "alice" in other["error"], other
        start = event(config, "start")
        assert REFUSED in call(app, start, default_inputs(config, start), cookies=session_cookie(secret, "bob"))["error"]
        assert run_dirs(app) == []


# ------------------------------------------------------------------------------------ visitors' input
def test_hostile_values_in_public_events_get_clear_messages_and_the_app_keeps_serving(password_app):
    config, root = password_app["config"], password_app["root"]
    # Things outside runs/ and data/ that a visitor must not reach: a run and a prepared dataset.
    outside_run = root / "outside-run"
    outside_run.mkdir()
    (outside_run / "status.json").write_text(json.dumps({"status": "completed", "error": "SECRET-RUN"}))
    from sqlenv.data.builtin import ensure_builtin

    info = ensure_builtin(root / "outside-data")
    questions = json.loads(info.questions_path("eval").read_text())
    questions[0]["question_text"] = "SECRET-QUESTION"
    info.questions_path("eval").write_text(json.dumps(questions))
    before = sorted(p.name for p in root.iterdir())

    new = event(config, "new_episode")
    session = "visitor-play"
    for dataset, message in ((str(info.root), "Unknown dataset"), ("../outside-data", "Unknown dataset"),
                             ("x" * 5000, "Dataset is too long: 5,000 characters")):
        result = call(password_app, new, [dataset, "eval", "random", 15, None], session_hash=session)
        assert result["success"] and message in result["output"][1], result
        assert len(result["output"][1]) < 2000
    unknown_question = call(password_app, new, ["builtin", "eval", "q-does-not-exist", 15, None])
    assert not unknown_question["success"] and "q-does-not-exist" in unknown_question["error"]

    started = call(password_app, new, ["builtin", "eval", "random", 15, None], session_hash=session)
    assert 'data-budget="15"' in started["output"][1]
    step = event(config, "do_step")
    huge = call(password_app, step, ["QUERY", "x" * 50_000, None], session_hash=session)
    assert huge["success"] and "too long: 50,000 characters (at most 20,000)" in huge["output"][2]
    assert "no step was spent" in huge["output"][2]
    normal = call(password_app, step, ["QUERY", "SELECT 1", None], session_hash=session)
    assert 'data-budget="14"' in normal["output"][1]  # the refused step cost nothing
    fresh = call(password_app, new, ["builtin", "eval", "random", 15, None], session_hash=session)
    assert 'data-budget="15"' in fresh["output"][1] and "No actions yet" in fresh["output"][3]  # a new episode

    # Run pickers: Gradio itself refuses a name that is not among the choices this page was offered; what
    # gets past it (or a page offered the name) meets the run cache's own check.
    for api, elem in (("show", "runs-detail"), ("on_run", "compare-note")):
        dep = event(config, api, elem)
        for name, message in (("../outside-run", "Refused"), ("no-such-run", "No run named 'no-such-run'"),
                              ("r" * 5000, "Refused: invalid run name"),
                              (MEGABYTE, "is too large")):  # refused before Gradio reads it (test_app_requests)
            result = call(password_app, dep, [name, *default_inputs(config, dep)[1:]])
            text = json.dumps(result)
            assert message in text or "is not in the list of choices" in text, (api, name, text[:300])
            assert "SECRET" not in text

    # Every public event, every text input 1 MB long: answered (the size refusal, a message or Gradio's own
    # refusal), not a crash.
    for dep in config["dependencies"]:
        if not dep.get("backend_fn") or dep.get("api_visibility") == "private":
            continue
        data = [MEGABYTE if isinstance(v, str) else v for v in default_inputs(config, dep)]
        result = call(password_app, dep, data)
        assert result["success"] or result["error"], (dep["api_name"], result)
        assert "SECRET" not in json.dumps(result)
    # The app takes no files: an upload is refused before it reaches the server's temp folder.
    import httpx

    upload = httpx.post(password_app["url"] + "gradio_api/upload", files={"files": ("a.txt", b"x" * 1024)})
    assert upload.status_code == 403, upload.text[:200]
    assert password_app["proc"].poll() is None
    again = call(password_app, new, ["builtin", "eval", "random", 15, None])
    assert again["success"] and 'data-budget="15"' in again["output"][1]
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written beside runs/ and data/
    assert run_dirs(password_app) == []


# ---------------------------------------------------------------------------------- issue 26: items 3, 9, 10
def open_databases(app) -> int:
    """How many SQLite files under the app's folders its process holds open (a Play episode's connections)."""
    fd_dir = f"/proc/{app['proc'].pid}/fd"
    count = 0
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        count += target.startswith(str(app["root"])) and target.endswith(".sqlite")
    return count


def wait_for(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.2)
    return time.monotonic() - start


def test_play_keeps_few_episodes_and_closes_idle_and_abandoned_ones():
    """Each Play session's environment (connections and last result, ~100 MB) lived as long as the server: 8
    sessions took the app from 286 to 1,084 MB for good. Now at most SQLENV_PLAY_MAX_EPISODES are open, an episode
    idle for SQLENV_PLAY_IDLE_S closes, and so does one whose page is closed. Issue 49, finding 5: with every place
    taken by one visitor each, the next visitor's New episode closed the least recently played episode (a visitor
    still reading the question); now that visitor is told Play is full, and every episode stays open."""
    idle_s = 15  # long enough that nothing expires before the idle part, even on a loaded machine
    with serve({"SQLENV_PLAY_MAX_EPISODES": "2", "SQLENV_PLAY_IDLE_S": str(idle_s)}, log_name="play") as app:
        config = app_config(app["url"])
        new, step = event(config, "new_episode"), event(config, "do_step")

        def play(session, sql="SELECT 1", source=None):
            started = call(app, new, ["builtin", "eval", "random", 15, None], session_hash=session, source=source)
            assert started["success"] and 'data-budget="15"' in started["output"][1], started
            return call(app, step, ["QUERY", sql, None], session_hash=session, source=source)

        for session, source in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
            assert 'data-budget="14"' in play(session, source=source)["output"][1]
        full = call(app, new, ["builtin", "eval", "random", 15, None], session_hash="c", source="127.0.0.3")
        assert full["success"] and 'id="play-full"' in full["output"][1], full
        assert "Play is full: 2 episodes are open" in full["output"][1]
        assert open_databases(app) <= 2, open_databases(app)  # nothing opened for the refused visitor
        # a, the least recently played, is still open; so is b
        assert 'data-budget="13"' in call(app, step, ["QUERY", "SELECT 2", None], session_hash="a")["output"][1]
        assert 'data-budget="13"' in call(app, step, ["QUERY", "SELECT 2", None], session_hash="b",
                                          source="127.0.0.2")["output"][1]
        closed = call(app, step, ["QUERY", "SELECT 1", None], session_hash="c", source="127.0.0.3")
        assert 'id="play-closed"' in closed["output"][2] and "New episode" in closed["output"][2], closed

        # Nobody plays for SQLENV_PLAY_IDLE_S: every episode closes and its connections with it.
        wait_for(lambda: open_databases(app) == 0, idle_s + 10, "idle episodes closed")
        assert 'id="play-closed"' in call(app, step, ["QUERY", "SELECT 1", None], session_hash="a")["output"][2]

        # A page that goes away (its heartbeat stream ends: tab closed or reloaded) closes its episode at once.
        with httpx.Client(timeout=30) as http:
            with http.stream("GET", app["url"] + "gradio_api/heartbeat/d") as heartbeat:
                assert heartbeat.status_code == 200
                assert 'data-budget="14"' in play("d")["output"][1]
                played = time.monotonic()
                assert open_databases(app) == 1, open_databases(app)
        wait_for(lambda: open_databases(app) == 0, 8, "a closed page's episode closed")
        assert time.monotonic() - played < idle_s  # before it could have expired
        assert app["proc"].poll() is None


def test_a_finished_play_episode_says_what_to_press(password_app):
    """After the last step Play answered "call reset() to start a new one" (the API's words); the page has a
    New episode button."""
    config, session = password_app["config"], "visitor-finished"
    started = call(password_app, event(config, "new_episode"), ["builtin", "eval", "random", 1, None],
                   session_hash=session)
    assert 'data-budget="1"' in started["output"][1]
    step = event(config, "do_step")
    last = call(password_app, step, ["QUERY", "SELECT 1", None], session_hash=session)
    assert 'id="play-verdict"' in last["output"][2]  # the budget is spent: the episode is over
    again = call(password_app, step, ["QUERY", "SELECT 1", None], session_hash=session)
    text = again["output"][2]
    assert "press New episode to start another" in text and "reset()" not in text, text


def test_a_runs_config_never_shows_a_secret_and_the_owner_cannot_save_one(password_app):
    """`grpo.hub_token` in the owner's Advanced JSON was saved in config.json, which the public Runs tab shows."""
    config = password_app["config"]
    token = login(password_app)
    start = event(config, "start")
    data = default_inputs(config, start)
    advanced = elem_ids(config, start["inputs"]).index("cfg-advanced")
    for secret in ({"grpo": {"hub_token": "hf_OWNERSECRET"}}, {"sft": {"args": {"hub_token": "hf_OWNERSECRET"}}}):
        data[advanced] = json.dumps(secret)
        try:
            result = call(password_app, start, [*data[:-1], token])
            assert result["success"] and "HF_TOKEN" in result["output"][0] and "Started" not in result["output"][0]
            assert run_dirs(password_app) == []
        finally:  # on a build that accepted it, stop the run it started
            if run_dirs(password_app):
                stop = event(config, "stop")
                call(password_app, stop, [*default_inputs(config, stop)[:-1], token])
                time.sleep(5)
                for name in run_dirs(password_app):
                    shutil.rmtree(password_app["runs"] / name, ignore_errors=True)

    # A run written before TrainConfig refused them (or by hand): its readers redact the value.
    run = RunDir.create(password_app["runs"], "run-with-secret")
    try:
        run.write_config({"model": "builtin:tiny", "grpo": {"hub_token": "hf_RUNSECRET", "loss_type": "dr_grpo"},
                          "sft": {"args": {"model_init_kwargs": {"token": "hf_RUNSECRET"}}}})
        run.write_status("completed", step=1, total_steps=1)
        session = "visitor-runs"
        listed = call(password_app, event(config, "refresh", "runs-table"), [None, []], session_hash=session)
        assert listed["success"], listed
        shown = call(password_app, event(config, "show", "runs-detail"), ["run-with-secret"], session_hash=session)
        text = json.dumps(shown)
        assert shown["success"] and "dr_grpo" in text and "hf_RUNSECRET" not in text, text[:500]
        assert "<redacted>" in text
    finally:
        shutil.rmtree(run.path)


def test_a_local_client_cannot_choose_the_address_the_login_throttle_counts():
    """uvicorn believes X-Forwarded-For from 127.0.0.1 by default, so any local client named a new address per
    guess: 195 guesses in 10 s. With no proxy configured the throttle counts the TCP peer."""
    with serve({"SQLENV_ADMIN_PASSWORD": PASSWORD}, log_name="no-proxy") as app:
        app["config"] = config = app_config(app["url"])
        for i in range(5):
            guess = call(app, event(config, "login"), ["guess"], headers={"X-Forwarded-For": f"203.0.113.{i}"})
            assert "Wrong password" in guess["output"][1], guess
        refused = call(app, event(config, "login"), [PASSWORD], headers={"X-Forwarded-For": "198.51.100.1"})
        assert refused["output"][0] == "" and "Too many wrong passwords" in refused["output"][1], refused

    # An operator who lists the proxy's address for uvicorn (FORWARDED_ALLOW_IPS) gets clients told apart by it.
    with serve({"SQLENV_ADMIN_PASSWORD": PASSWORD, "FORWARDED_ALLOW_IPS": "127.0.0.1"}, log_name="uvicorn-proxy") as app:
        app["config"] = config = app_config(app["url"])
        guesser = {"X-Forwarded-For": "203.0.113.9"}
        for _ in range(5):
            assert "Wrong password" in call(app, event(config, "login"), ["guess"], headers=guesser)["output"][1]
        assert "Too many" in call(app, event(config, "login"), [PASSWORD], headers=guesser)["output"][1]
        welcome = call(app, event(config, "login"), [PASSWORD], headers={"X-Forwarded-For": "198.51.100.1"})
        assert welcome["output"][0] and 'data-owner="true"' in welcome["output"][1]


# ------------------------------------------------------------------------------ issue 43, finding 11
def test_one_bad_run_directory_leaves_runs_and_compare_listing_the_others(password_app):
    """A config.json nested 1,000,000 deep made the Runs and Compare tabs' load events fail (RecursionError) and
    their lists came back empty for everyone; a 50 MB config was sent whole to each page that opened it. Now such
    runs are listed as corrupt, say why, and send nothing of the file."""
    config, runs = password_app["config"], password_app["runs"]
    written = {"deep": "[" * 1_000_000 + "]" * 1_000_000, "deep-within-bound": '{"a":' * 20_000 + "1" + "}" * 20_000,
               "huge": json.dumps({"model": "builtin:tiny", "pad": "x" * 50_000_000}), "good": None}
    made = []
    try:
        for name, text in written.items():
            run = RunDir.create(runs, f"bad-dir-{name}")
            made.append(run.path)
            run.write_config({"model": "builtin:tiny", "dataset": "builtin"})
            run.write_status("completed", step=1, total_steps=1)
            run.append("comparison", {"kind": "summary", "split": "eval", "n_episodes": 1,
                                      "trained": {"success_rate": 1.0, "n_episodes": 1}})
            if text is not None:
                run.file("config.json").write_text(text)
        session = "visitor-bad-runs"
        listed = call(password_app, event(config, "refresh", "runs-table"), [None, []], session_hash=session)
        assert listed["success"], listed
        table = listed["output"][0]
        statuses = {row[0]: row[1] for row in table["data"]}
        assert statuses["bad-dir-good"] == "completed", statuses
        assert all(statuses[f"bad-dir-{name}"] == "corrupt" for name in written if name != "good"), statuses
        compare = call(password_app, event(config, "refresh_runs"), [None, []], session_hash=session)
        assert compare["success"] and "bad-dir-good" in json.dumps(compare["output"][0]), compare
        shown = call(password_app, event(config, "show", "runs-detail"), ["bad-dir-huge"], session_hash=session)
        text = json.dumps(shown)
        assert shown["success"] and "config.json unreadable" in text and len(text) < 200_000, len(text)
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------ issue 49, finding 6
def test_a_long_runs_detail_is_a_bounded_reply(password_app):
    """An honest long run that logs every step wrote a 58 MB metrics.jsonl (400,000 lines), and each anonymous Run
    detail view sent it whole, charted: 6 s and 41.6 MB. The charts now draw at most HEAD + SPREAD + TAIL points a
    series (the run's first and newest lines, a spread between), read in bounded work: here 120,000 lines (14 MB)
    answer in well under 2 MB (before: ~30 MB)."""
    from dashboard.core.run_sample import HEAD, SPREAD, TAIL

    config, runs = password_app["config"], password_app["runs"]
    run = RunDir.create(runs, "long-run")
    try:
        run.write_config({"model": "builtin:tiny", "dataset": "builtin"})
        run.write_status("completed", step=120_000, total_steps=120_000)
        with open(run.file("metrics.jsonl"), "w") as f:
            f.writelines(f'{{"grad_norm": {i % 97 / 31:.4f}, "reward": {i % 13 / 13:.4f}, "reward_std": 0.1, '
                         f'"health/sampled_entropy": 0.5, "phase": "grpo", "step": {i}, "time": {1.7e9 + i}}}\n'
                         for i in range(1, 120_001))
        for step in (40_000, 80_000, 120_000):  # traces: listed as summaries, the newest shown read from its line
            run.append("transcripts", {"step": step, "transcript": {"question_id": f"q-{step}", "outcome": "correct",
                                                                   "question": f"question at {step}", "steps": []}})
        session = "visitor-long-run"
        assert call(password_app, event(config, "refresh", "runs-table"), [None, []], session_hash=session)["success"]
        shown = call(password_app, event(config, "show", "runs-detail"), ["long-run"], session_hash=session)
        reply = json.dumps(shown)
        assert shown["success"] and "~1" in shown["output"][0] and "spread over the run" in shown["output"][0]
        assert len(reply) < 2_000_000, len(reply)
        picker, trace = shown["output"][7], shown["output"][8]
        assert [label.split(" — ")[0] for label, _ in picker["choices"]] == ["step 120000", "step 80000", "step 40000"]
        assert "Trace at step 120000" in trace and "question at 120000" in trace, trace[:300]
        oldest = call(password_app, event(config, "show_trace"), ["long-run", picker["choices"][-1][1]],
                      session_hash=session)
        assert "question at 40000" in oldest["output"][0], oldest
        reward = json.loads(shown["output"][2]["plot"])
        mean = next(t for t in reward["data"] if t.get("name") == "reward (mean)")
        assert len(mean["x"]) <= HEAD + SPREAD + TAIL and mean["x"][-1] == 120_000
    finally:
        shutil.rmtree(run.path, ignore_errors=True)


# ------------------------------------------------------------------------------ issue 43, finding 10
SLOW_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"  # 5 s: stopped
HONEST = "127.0.0.20"


def test_play_keeps_an_honest_visitor_s_episode_and_step_beside_hostile_visitors(password_app):
    """16 anonymous New episode calls in 2 s closed an honest visitor's episode, and 8 visitors running 5 s queries
    made an honest step wait 7.8 s (one concurrency limit of 4 for every visitor's steps). Episodes are now bounded
    per client (no one's episode closed for another's) and each client runs at most 2 Play events at once, no limit
    shared by all: the honest step is answered while every hostile query still runs. Other clients are other
    loopback addresses (127.0.0.x)."""
    import threading

    config = password_app["config"]
    new, step = event(config, "new_episode"), event(config, "do_step")
    fresh = ["builtin", "eval", "random", 15, None]
    honest = "honest-player"
    # An address of its own (this module's other tests play from 127.0.0.1 and leave their episodes open).
    assert 'data-budget="15"' in call(password_app, new, fresh, session_hash=honest, source=HONEST)["output"][1]
    # Hostile visitors: 5 addresses with one session each, and one address with three (its third step is refused).
    # The three are opened first: a client's second and later episodes only while Play is less than half full.
    visitors = [("127.0.0.10", f"slow-many-{i}") for i in range(3)] + [(f"127.0.0.{3 + i}", f"slow-{i}")
                                                                        for i in range(5)]
    for source, session in visitors[:3]:
        assert 'data-budget="15"' in call(password_app, new, fresh, session_hash=session, source=source)["output"][1]
    for i in range(16):
        call(password_app, new, fresh, session_hash=f"anon-new-{i}", source="127.0.0.2")
    played = call(password_app, step, ["QUERY", "SELECT 1", None], session_hash=honest, source=HONEST)
    assert 'data-budget="14"' in played["output"][1], played  # still open
    for source, session in visitors[3:]:
        assert 'data-budget="15"' in call(password_app, new, fresh, session_hash=session, source=source)["output"][1]
    results: dict[str, dict] = {}

    def slow(source, session):
        results[session] = call(password_app, step, ["QUERY", SLOW_SQL, None], session_hash=session, source=source)

    threads = [threading.Thread(target=slow, args=visitor) for visitor in visitors]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # every hostile step joined the queue and started (or was refused)
    played = call(password_app, step, ["QUERY", "SELECT 2", None], session_hash=honest, source=HONEST)
    finished_before = dict(results)
    for thread in threads:
        thread.join(60)
    assert 'data-budget="13"' in played["output"][1], played
    refused = [s for s, r in results.items() if 'id="play-slots"' in (r["output"] or [""] * 3)[2]]
    assert set(finished_before) <= set(refused), finished_before  # the honest step did not wait for any query
    assert len(refused) == 1 and refused[0].startswith("slow-many-"), results
    assert all("timed out" in r["output"][2] for s, r in results.items() if s not in refused), results
