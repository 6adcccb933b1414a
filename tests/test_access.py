"""Who may train, without a server: the access modes, password tokens, the OAuth allow-list (no Hub: the
profiles are the OpenID userinfo a Space login stores), the login throttle, the runs folder on a Space,
visitors' input checks, and a Hub push up to the network call."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

from dashboard.access.owner import TOKEN_TTL_S, AccessPolicy, LoginThrottle, is_loopback
from dashboard.core.storage import choose_runs_root
from training.run.directory import RunDir, now_iso

SPACE = {"SPACE_ID": "alice/sqlenv", "SPACE_AUTHOR_NAME": "alice"}
OAUTH = {**SPACE, "SYSTEM": "spaces", "OAUTH_CLIENT_ID": "client-id"}


# --------------------------------------------------------------------------------------------- modes
@pytest.mark.parametrize("host, env, mode", [
    ("127.0.0.1", {}, "open"),
    ("localhost", {}, "open"),
    ("::1", {}, "open"),
    ("0.0.0.0", {}, "locked"),
    ("192.168.1.20", {}, "locked"),
    ("", {}, "locked"),
    ("127.0.0.1", SPACE, "locked"),  # on a Space even a loopback bind is not "only this machine"
    ("0.0.0.0", SPACE, "locked"),
    ("0.0.0.0", OAUTH, "oauth"),
    ("0.0.0.0", {**SPACE, "OAUTH_CLIENT_ID": "x"}, "locked"),  # SPACE_ID alone is not Gradio's Space: no login
    ("0.0.0.0", {"SQLENV_ADMIN_PASSWORD": "s3cret"}, "password"),
    ("127.0.0.1", {"SQLENV_ADMIN_PASSWORD": "s3cret"}, "password"),
    ("0.0.0.0", {**OAUTH, "SQLENV_ADMIN_PASSWORD": "s3cret"}, "password"),
])
def test_mode_from_host_and_environment(host, env, mode):
    policy = AccessPolicy.from_env(host, env=env)
    assert policy.mode == mode, policy.reason
    assert policy.is_owner() is (mode == "open")  # nobody but a local user is the owner without proof


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", "", None))


def test_unknown_mode_and_password_mode_without_password_are_refused():
    with pytest.raises(ValueError, match="unknown access mode"):
        AccessPolicy("everyone")
    with pytest.raises(ValueError, match="needs a password"):
        AccessPolicy("password")


# ------------------------------------------------------------------------------------------ password
def test_password_tokens_are_signed_expire_and_die_with_the_process():
    policy = AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "correct horse"})
    assert policy.password_matches("correct horse")
    assert not any(policy.password_matches(p) for p in ("correct hors", "", None, 12, "correct horse "))
    token = policy.issue_token(now=1000.0)
    assert policy.token_valid(token, now=1000.0 + TOKEN_TTL_S - 1)
    assert not policy.token_valid(token, now=1000.0 + TOKEN_TTL_S + 1)  # expired
    expires, signature = token.split(".")
    forged = f"{int(expires) + 3600}.{signature}"  # a later expiry with the old signature
    assert not policy.token_valid(forged, now=1000.0)
    assert not any(policy.token_valid(t) for t in ("", "1.2", None, "x" * 10_000, ["a"], token + "0"))
    assert policy.is_owner(token=policy.issue_token()) and not policy.is_owner(token="nope")
    # Another process (same password) signs with another key: its tokens mean nothing here.
    other = AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "correct horse"})
    assert not policy.token_valid(other.issue_token())
    assert "correct horse" not in repr(policy)


def test_login_throttle_refuses_only_the_client_that_guessed():
    """Five wrong passwords a minute from anyone used to block every login, the owner's too (finding 5)."""
    throttle = LoginThrottle(max_failures=3, window_s=60)
    for t in (0.0, 1.0, 2.0):
        assert throttle.wait_s("203.0.113.9", now=t) == 0
        throttle.failed("203.0.113.9", now=t)
    assert throttle.wait_s("203.0.113.9", now=3.0) == pytest.approx(57.0)
    assert throttle.wait_s("198.51.100.1", now=3.0) == 0  # the owner, elsewhere, is not locked out
    assert throttle.wait_s("203.0.113.9", now=61.0) == 0  # the first failure left the window
    flood = LoginThrottle(max_failures=1, window_s=60, max_clients=100)
    for i in range(1000):  # many addresses: the memory stays bounded, the newest are remembered
        flood.failed(f"10.0.{i // 256}.{i % 256}", now=0.0)
    assert len(flood._failures) == 100 and flood.wait_s("10.0.3.231", now=1.0) > 0


class _Request:
    """What a queued event's `gr.Request` carries: the HTTP request behind it, as `.request.scope`."""

    def __init__(self, peer, *forwarded_lines):
        self.request = type("R", (), {"scope": {"client": (peer, 5000) if peer else None,
                                                "headers": [(b"x-forwarded-for", line.encode())
                                                            for line in forwarded_lines]}})()


def test_client_address_trusts_only_the_configured_proxies():
    direct = AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "pw"})
    assert direct.client(_Request("192.0.2.7", "203.0.113.1")) == "192.0.2.7"  # no proxy: the header is words
    proxied = AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "pw", "SQLENV_PROXY_HOPS": "1"})
    assert proxied.client(_Request("10.0.0.1", "6.6.6.6, 203.0.113.1")) == "203.0.113.1"  # the proxy's entry
    assert proxied.client(_Request("10.0.0.1")) == "10.0.0.1"
    assert proxied.client(_Request(None, "")) == "unknown" and proxied.client(None) == "unknown"
    with pytest.raises(ValueError, match="SQLENV_PROXY_HOPS"):
        AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "pw", "SQLENV_PROXY_HOPS": "-1"})


def test_one_client_identity_for_every_limit():
    """Issue 43, finding 8: the throttle read the first X-Forwarded-For line (a client's own, when the proxy adds a
    line of its own) and keyed on the full IPv6 address, while the server's session cap joined every line and
    grouped IPv6 by /64. Both now count by `client_key`."""
    from sqlenv.client_address import address_block, client_key

    proxied = AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "pw", "SQLENV_PROXY_HOPS": "1"})
    # The client's own line, then the proxy's: the proxy's entry, whatever the client wrote.
    assert proxied.client(_Request("10.0.0.1", "6.6.6.6", "203.0.113.1")) == "203.0.113.1"
    # A new address of one /64 each try is one client; another /64 is another.
    tries = {proxied.client(_Request("10.0.0.1", f"2001:db8:1:2::{i:x}")) for i in range(1, 9)}
    assert tries == {"2001:db8:1:2::/64"}
    assert proxied.client(_Request("10.0.0.1", "2001:db8:1:3::1")) == "2001:db8:1:3::/64"
    direct = AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "pw"})
    assert direct.client(_Request("2001:db8::5")) == "2001:db8::/64"
    assert direct.client(_Request("::ffff:192.0.2.7")) == "192.0.2.7"
    # On a Space every request comes through Hugging Face's proxy: one hop unless the operator says otherwise.
    space = {"SPACE_ID": "someone/sqlenv", "SYSTEM": "spaces"}
    assert AccessPolicy.from_env("0.0.0.0", env=space).proxy_hops == 1
    assert AccessPolicy.from_env("0.0.0.0", env={**space, "SQLENV_PROXY_HOPS": "0"}).proxy_hops == 0
    assert AccessPolicy.from_env("0.0.0.0", env={**space, "FORWARDED_ALLOW_IPS": "10.0.0.5"}).proxy_hops == 0
    assert AccessPolicy.from_env("0.0.0.0", env={}).proxy_hops == 0
    # SPACE_ID alone (any machine may set it) is no proxy: the server's rule, so a guesser cannot forge addresses.
    assert AccessPolicy.from_env("0.0.0.0", env={"SPACE_ID": "someone/sqlenv"}).proxy_hops == 0
    scope = _Request("10.0.0.1", "6.6.6.6", "2001:db8:1:2::9").request.scope
    assert client_key(scope, 1) == proxied.client(_Request("10.0.0.1", "6.6.6.6", "2001:db8:1:2::9"))
    assert address_block("unknown") == "unknown" and address_block("[2001:db8::1]") == "2001:db8::/64"


def test_a_revoked_token_is_refused_until_it_would_have_expired():
    """Log out used to leave the token valid for up to 12 h (finding 6)."""
    policy = AccessPolicy.from_env("0.0.0.0", env={"SQLENV_ADMIN_PASSWORD": "correct horse"})
    token, other = policy.issue_token(now=1000.0), policy.issue_token(now=1001.0)
    assert policy.revoke(token, now=1002.0)
    assert not policy.token_valid(token, now=1003.0) and not policy.is_owner(token=token)
    assert policy.token_valid(other, now=1003.0)  # another login (another device) stays valid
    assert not policy.revoke("9999999999." + "0" * 64) and not policy.revoke(None)  # only real tokens are kept
    later = policy.issue_token(now=1000.0 + TOKEN_TTL_S + 10)
    policy.revoke(later, now=1000.0 + TOKEN_TTL_S + 20)  # expired entries are dropped on the next revocation
    assert list(policy._revoked) == [later.split(".")[1]]


# --------------------------------------------------------------------------------------------- oauth
def profile(username, orgs=None):
    info = {"preferred_username": username, "name": username.title(), "profile": f"https://hf.co/{username}",
            "picture": ""}
    if orgs is not None:
        info["orgs"] = orgs
    return info


def test_oauth_owner_is_the_spaces_author_by_default():
    policy = AccessPolicy.from_env("0.0.0.0", env=OAUTH)
    assert policy.owners == ("alice",)
    assert policy.is_owner(profile=profile("alice")) and policy.is_owner(profile=profile("Alice"))
    assert not policy.is_owner(profile=profile("bob"))
    assert not policy.is_owner(profile=None) and not policy.is_owner(profile={})
    assert not policy.is_owner(token=AccessPolicy("password", password="x").issue_token())  # not a login here


def test_oauth_allowed_users_are_configurable():
    policy = AccessPolicy.from_env("0.0.0.0", env={**OAUTH, "SQLENV_ADMIN_USERS": " Bob, carol ,"})
    assert policy.owners == ("bob", "carol")
    assert policy.is_owner(profile=profile("bob")) and policy.is_owner(profile=profile("carol"))
    assert not policy.is_owner(profile=profile("alice"))  # the list replaces the default


def test_oauth_members_of_an_owner_organization_with_write_rights():
    policy = AccessPolicy.from_env("0.0.0.0", env={**OAUTH, "SPACE_ID": "acme/sqlenv", "SPACE_AUTHOR_NAME": "acme"})
    writer = profile("dana", orgs=[{"name": "Acme", "preferred_username": "acme", "roleInOrg": "write"}])
    reader = profile("erin", orgs=[{"name": "Acme", "preferred_username": "acme", "roleInOrg": "read"}])
    other_org = profile("fay", orgs=[{"preferred_username": "other", "roleInOrg": "admin"}])
    assert policy.is_owner(profile=writer)
    assert not policy.is_owner(profile=reader) and not policy.is_owner(profile=other_org)
    assert not policy.is_owner(profile=profile("gus", orgs="acme"))  # malformed: not an owner


def test_oauth_without_author_falls_back_to_the_space_namespace():
    policy = AccessPolicy.from_env("0.0.0.0", env={"SPACE_ID": "zed/app", "SYSTEM": "spaces", "OAUTH_CLIENT_ID": "x"})
    assert policy.owners == ("zed",)


# ---------------------------------------------------------------------------------------- runs folder
def test_runs_folder_on_a_space_with_persistent_storage(tmp_path):
    persistent = tmp_path / "data"
    persistent.mkdir()
    assert choose_runs_root(env=SPACE, persistent_dir=persistent) == persistent / "runs"
    assert choose_runs_root(env={**SPACE, "SQLENV_RUNS_DIR": "/x/runs"}, persistent_dir=persistent).as_posix() == "/x/runs"
    assert choose_runs_root(tmp_path / "mine", env=SPACE, persistent_dir=persistent) == tmp_path / "mine"
    assert choose_runs_root(env={}, persistent_dir=persistent).as_posix() == "runs"  # not a Space
    assert choose_runs_root(env=SPACE, persistent_dir=tmp_path / "absent").as_posix() == "runs"  # no storage


# ------------------------------------------------------------------------------------- visitor input
def test_visitor_dataset_names_never_reach_the_disk_outside_data(tmp_path):
    from dashboard.access import inputs
    from sqlenv.data.builtin import ensure_builtin

    data = tmp_path / "data"
    info = ensure_builtin(data / "builtin")
    assert inputs.dataset_source("builtin", data) == "builtin"
    shutil.copytree(info.root, data / "mini")
    meta = json.loads((data / "mini" / "dataset.json").read_text())
    (data / "mini" / "dataset.json").write_text(json.dumps({**meta, "name": "mini"}))
    assert inputs.dataset_source("mini", data) == str(data / "mini")
    shutil.copytree(info.root, tmp_path / "outside")  # a prepared dataset outside data/
    for bad in (str(tmp_path / "outside"), "../outside", "mini/../../outside", "/etc", "", None, 5, "x" * 1_000_000):
        with pytest.raises(inputs.InputRefused) as err:
            inputs.dataset_source(bad, data)
        assert len(str(err.value)) < 400  # a 1 MB name is not echoed back


def test_visitor_text_limits():
    from dashboard.access import inputs

    assert inputs.text(None, "Arg") == "" and inputs.text("SELECT 1", "Arg") == "SELECT 1"
    with pytest.raises(inputs.InputRefused, match=r"too long: 1,000,000 characters \(at most 20,000\)"):
        inputs.text("x" * 1_000_000, "The argument")
    with pytest.raises(inputs.InputRefused, match="must be text"):
        inputs.text({"a": 1}, "The argument")
    assert inputs.run_names(["a", "b"]) == ["a", "b"]
    with pytest.raises(inputs.InputRefused, match="Too many runs"):
        inputs.run_names(["r"] * 13)


def test_run_cache_messages_for_missing_traversing_and_huge_names(tmp_path):
    from dashboard.core.run_data import RunCache

    (tmp_path / "runs").mkdir()
    cache = RunCache(tmp_path / "runs")
    assert cache.try_snapshot("no-such-run") == (None, "No run named 'no-such-run' under runs/.")
    snap, err = cache.try_snapshot("../etc")
    assert snap is None and err.startswith("Refused")
    snap, err = cache.try_snapshot("r" * 1_000_000)
    assert snap is None and err.startswith("Refused") and len(err) < 200


# ------------------------------------------------------------------------------------------ Hub push
def finished_run(root, status="completed"):
    run = RunDir.create(root, "run-a")
    run.write_config({"model": "builtin:tiny"})
    run.write_status(status, started_at=now_iso())
    run.append("metrics", {"step": 1, "reward": 0.5})
    (run.final_dir).mkdir()
    (run.final_dir / "model.safetensors").write_bytes(b"weights")
    (run.path / ".final-abc123").mkdir()  # a half-written temp folder
    (run.path / ".final-abc123" / "model.safetensors").write_bytes(b"half")
    (run.path / ".status.json.x.tmp").write_text("{")
    return run


def test_push_plan_lists_the_run_files_and_weights_only(tmp_path):
    from dashboard.runs.hub import plan_push

    plan = plan_push(finished_run(tmp_path), " alice/sqlenv-runs ")
    assert plan.repo_id == "alice/sqlenv-runs" and plan.path_in_repo == "runs/run-a"
    assert plan.files == ("config.json", "final/model.safetensors", "metrics.jsonl", "status.json")
    assert plan.has_weights and "run-a" in plan.commit_message


def test_push_refuses_unfinished_runs_and_bad_repo_names(tmp_path):
    from dashboard.runs.hub import HubPushError, plan_push

    run = finished_run(tmp_path, status="running")
    with pytest.raises(HubPushError, match="is running: push it once it has finished"):
        plan_push(run, "alice/runs")
    run.write_status("stopped")
    for bad in ("", "a/b/c", "../x", "x" * 500):
        with pytest.raises(HubPushError):
            plan_push(run, bad)


def test_push_goes_as_far_as_the_network_and_reports_it(tmp_path, monkeypatch):
    """The Hub cannot be reached from here: point the push at a closed port on 127.0.0.1 and check that it
    gets as far as the Hub call and fails with a message that says where it was going."""
    from dashboard.runs.hub import HubPushError, push_run

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once the socket closes
    with pytest.raises(HubPushError) as err:
        push_run(finished_run(tmp_path), "alice/sqlenv-runs", token="hf_test", endpoint=f"http://127.0.0.1:{closed}")
    message = str(err.value)
    assert message.startswith("Could not push run-a to alice/sqlenv-runs:")
    assert "Connect" in message or "connect" in message or "Offline" in message, message


def test_a_malformed_proxy_setting_stops_the_app_with_one_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "SQLENV_ADMIN_PASSWORD": "pw", "SQLENV_PROXY_HOPS": "two", "SQLENV_RUNS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "app.py", "--port", "0"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "SQLENV_PROXY_HOPS" in lines[0], done.stderr[-1000:]


# ------------------------------------------------------------------------------ issue 26: items 3 and 10
def test_one_proxy_setting_decides_the_client_address():
    """uvicorn believed any loopback peer's X-Forwarded-For (its default FORWARDED_ALLOW_IPS), beside
    SQLENV_PROXY_HOPS: the app serves with no trusted proxy unless the operator lists one, and refuses both."""
    from dashboard.access.owner import trusted_proxies_setting

    assert trusted_proxies_setting({}) == "" and trusted_proxies_setting({"FORWARDED_ALLOW_IPS": ""}) == ""
    assert trusted_proxies_setting({"FORWARDED_ALLOW_IPS": "10.0.0.5"}) == "10.0.0.5"  # the operator's own
    both = {"SQLENV_ADMIN_PASSWORD": "pw", "SQLENV_PROXY_HOPS": "1", "FORWARDED_ALLOW_IPS": "10.0.0.5"}
    with pytest.raises(ValueError, match="SQLENV_PROXY_HOPS and FORWARDED_ALLOW_IPS both"):
        AccessPolicy.from_env("0.0.0.0", env=both)
    assert AccessPolicy.from_env("0.0.0.0", env={**both, "SQLENV_PROXY_HOPS": "0"}).proxy_hops == 0


def _opened(episodes, builtin, session=None):
    """A real environment on an episode, kept by `episodes`: (handle, a weak reference to the environment)."""
    import weakref

    from sqlenv.environment import SQLEnvironment

    env = SQLEnvironment.from_dataset(builtin, split="eval", step_budget=5)
    env.reset(seed=0)
    return episodes.open(env, ("builtin", "eval", 5), session, client=f"client-{session}"), weakref.ref(env)


def test_play_episodes_are_bounded_in_number_and_idle_time_and_free_their_environments(builtin):
    import gc

    from dashboard.play.episodes import EpisodeBusy, PlayEpisodes, PlayFull

    now = [0.0]
    episodes = PlayEpisodes(capacity=2, idle_s=60, clock=lambda: now[0])
    a, a_env = _opened(episodes, builtin, "s1")
    now[0] = 1
    b, b_env = _opened(episodes, builtin, "s2")
    now[0] = 2
    episode = episodes.take(a)
    with pytest.raises(EpisodeBusy):
        episodes.take(a)  # one step at a time
    episodes.give_back(episode)
    del episode
    with pytest.raises(PlayFull, match="Play is full: 2 episodes are open"):
        _opened(episodes, builtin, "s3")  # no room: refused, and nobody's episode closed for it
    assert len(episodes) == 2 and b_env() is not None
    episodes.close(b)
    gc.collect()
    assert episodes.take(b) is None and b_env() is None  # closed and freed
    c, c_env = _opened(episodes, builtin, "s3")

    busy = episodes.take(c)  # a step is running on c when it is closed: it closes when the step ends
    episodes.close(c)
    assert episodes.take(c) is None and busy.closed and busy.env is c_env()
    assert not busy.env.step(("QUERY", "SELECT 1")).error  # the running step keeps its environment
    episodes.give_back(busy)
    assert busy.env is None
    del busy
    gc.collect()
    assert c_env() is None

    now[0] = 2 + 59
    episodes.sweep()
    assert len(episodes) == 1
    now[0] = 2 + 60  # a: a minute without a step
    d, _ = _opened(episodes, builtin, "s4")  # opening sweeps too
    gc.collect()
    assert a_env() is None and len(episodes) == 1
    episodes.close_session("other")
    assert len(episodes) == 1
    episodes.close_session("s4")
    assert len(episodes) == 0 and episodes.take(d) is None and episodes.take(None) is None


class _Env:
    closed = False

    def close(self):
        self.closed = True


def test_play_never_closes_an_episode_played_within_its_idle_window():
    """Issue 43, finding 10: 16 anonymous New episode calls closed an honest visitor's episode. Issue 49, finding 5:
    then, with one episode each from 16 addresses, the next address's New episode closed the least recently played
    of all, the visitor still reading the question. Now no one's episode played within the idle window is closed
    for another's: one more than there is room for is refused, saying why; a client holds at most `per_client`,
    and more than one only while fewer than half the places are taken; a page's New episode replaces its own."""
    from dashboard.play.episodes import ClientSlots, PlayEpisodes, PlayFull

    now = [0.0]
    key = ("builtin", "eval", 5)
    episodes = PlayEpisodes(capacity=16, idle_s=600, per_client=4, clock=lambda: now[0])
    honest_env = _Env()
    honest = episodes.open(honest_env, key, "honest", client="198.51.100.1")
    visitors, handles = [_Env() for _ in range(15)], []
    for i, env in enumerate(visitors):
        now[0] += 1
        handles.append(episodes.open(env, key, f"visitor-{i}", client=f"203.0.113.{i}"))
    assert len(episodes) == 16
    newcomer = _Env()
    with pytest.raises(PlayFull, match="Play is full: 16 episodes are open") as full:
        episodes.open(newcomer, key, "newcomer", client="192.0.2.1")
    assert "within 10 minutes" in str(full.value) and "No one's episode is closed for yours" in str(full.value)
    assert episodes.refusal("192.0.2.1") == str(full.value)  # the check made before an environment is built
    assert not honest_env.closed and not any(e.closed for e in visitors) and not newcomer.closed
    episode = episodes.take(honest)  # the least recently played of all is still open
    assert episode is not None and episode.env is honest_env
    episodes.give_back(episode)
    # A page's New episode replaces its own episode, even in a full Play.
    replaced = episodes.open(_Env(), key, "visitor-0", client="203.0.113.0", replaces=handles[0])
    assert visitors[0].closed and len(episodes) == 16 and episodes.take(replaced) is not None
    # An idle window gone by frees a place: the least recently played goes for the newcomer (not before).
    now[0] = 601.9  # visitor 1 was last played at 2, the honest visitor at 15
    with pytest.raises(PlayFull, match="within 1 s"):
        episodes.open(newcomer, key, "newcomer", client="192.0.2.1")
    now[0] = 602
    episodes.open(newcomer, key, "newcomer", client="192.0.2.1")
    assert visitors[1].closed and not visitors[2].closed and not honest_env.closed

    # Few addresses: one client holds 4 at most, more than one only while fewer than half the places are taken.
    episodes = PlayEpisodes(capacity=16, idle_s=600, per_client=4, clock=lambda: now[0])
    many = [episodes.open(_Env(), key, f"m-{i}", client="2001:db8:1:2::/64") for i in range(4)]
    with pytest.raises(PlayFull, match="You already have 4 episodes open"):
        episodes.open(_Env(), key, "m-4", client="2001:db8:1:2::/64")
    for i in range(4):
        episodes.open(_Env(), key, f"n-{i}", client="2001:db8:9:9::/64")
    episodes.open(_Env(), key, "x", client="2001:db8:a:a::/64")  # its first: room for it
    with pytest.raises(PlayFull, match="half of Play's 16 places or more are taken"):
        episodes.open(_Env(), key, "x2", client="2001:db8:a:a::/64")
    assert len(episodes) == 9 and len(many) == 4  # to fill 16 places takes 2 + 8 addresses at least, not 4

    slots = ClientSlots(per_client=2)
    assert slots.enter("a") and slots.enter("a") and not slots.enter("a") and slots.enter("b")
    slots.leave("a")
    assert slots.enter("a") and not slots.enter("a")
    for client in ("a", "a", "b"):
        slots.leave(client)
    assert slots._running == {}  # only clients with a running event are remembered


def test_play_limits_come_from_the_environment():
    from dashboard.play.episodes import IDLE_S, MAX_EPISODES, limits_from_env

    assert limits_from_env({}) == (MAX_EPISODES, IDLE_S)
    assert limits_from_env({"SQLENV_PLAY_MAX_EPISODES": "3", "SQLENV_PLAY_IDLE_S": "2.5"}) == (3, 2.5)
    for name, value in (("SQLENV_PLAY_MAX_EPISODES", "0"), ("SQLENV_PLAY_MAX_EPISODES", "many"),
                        ("SQLENV_PLAY_IDLE_S", "-1"), ("SQLENV_PLAY_IDLE_S", "inf"), ("SQLENV_PLAY_IDLE_S", "x")):
        with pytest.raises(ValueError, match=name):
            limits_from_env({name: value})
