"""Who may spend the owner's compute and disk: owner-only events, checked by the server on every call.

Once the app is public, everything a page can do anyone can do: every Gradio event is also an HTTP endpoint,
whatever the page shows or hides. So starting, stopping (and resuming) training, pushing runs to the Hub, and
anything else that spends the owner's compute or disk or changes runs is wired through `OwnerGate`:

    ctx.owner.owner_event(resume_btn.click, resume, inputs=[...], outputs=[...], action="resume a run")
    ctx.owner.control(resume_btn)   # greyed out on a visitor's page (cosmetic: the line above is the lock)

`owner_event` wires the event exactly like `resume_btn.click(resume, inputs=..., outputs=...)` except that
(1) `resume` is wrapped so the server checks the caller before it runs and refuses with a `gr.Error` naming
what was refused (the function never runs), and (2) the event is left out of the public API
(`api_visibility="private"`: not listed, not callable by name; a raw HTTP call still reaches the check).
Every other event is public: visitors watch the live run, compare, play, and browse runs.

Who the owner is (`AccessPolicy.mode`, resolved once at start by `AccessPolicy.from_env(host)`):

- ``"open"``: bound to a loopback address (127.0.0.1, localhost, ::1), not on a Space, no owner configured.
  Whoever can reach the page is the owner: local use, as before.
- ``"password"``: `SQLENV_ADMIN_PASSWORD` is set (self-hosting, or a Space secret). The owner types it under
  "Owner login"; the server answers with a signed token (an expiry time and its HMAC under a key drawn at
  start) that the browser keeps in localStorage (`gr.BrowserState`), so a reload stays logged in. Every owner
  event sends the token and the server checks it. Tokens die with the process (a restart logs the owner out),
  and "Log out" revokes the page's token for good (a copy of it kept elsewhere is refused from then on).
  Wrong passwords are throttled per client (`LoginThrottle`, keyed by `AccessPolicy.client`: the address behind
  the trusted proxies, an IPv6 one as its /64), so a guesser locks out only itself.
- ``"oauth"``: on a HuggingFace Space with `hf_oauth: true` in the README front matter ("Sign in with Hugging
  Face", Gradio's `gr.LoginButton`). Owners are `SQLENV_ADMIN_USERS` (comma-separated Hub user or
  organization names), by default the Space's author (`SPACE_AUTHOR_NAME`). A member of an owner
  organization counts when the login profile lists that organization with the admin or write role.
- ``"locked"``: anywhere else (bound beyond loopback, or on a Space) with no owner configured: nobody may train,
  and the page says how to turn the controls on.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import inspect
import ipaddress
import os
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import gradio as gr

from sqlenv.client_address import FORWARDED_ALLOW_IPS_ENV, client_key, proxy_hops_setting

MODES = ("open", "password", "oauth", "locked")
PASSWORD_ENV = "SQLENV_ADMIN_PASSWORD"
USERS_ENV = "SQLENV_ADMIN_USERS"
# A logged-in owner's token lasts this long (seconds); then the owner types the password again.
TOKEN_TTL_S = 12 * 3600
# A client's logins are refused once this many of its passwords were wrong within LOGIN_WINDOW_S: a guesser gets
# a few tries a minute per address and locks out nobody else. A long random password is the real defence.
MAX_LOGIN_FAILURES = 5
LOGIN_WINDOW_S = 60.0
# Most client addresses the throttle remembers (the oldest are forgotten first): bounded memory under a flood.
MAX_THROTTLED_CLIENTS = 10_000
# SQLENV_PROXY_HOPS (reverse proxies whose X-Forwarded-For entries are trusted) and uvicorn's FORWARDED_ALLOW_IPS
# (proxy addresses whose header it believes; its default 127.0.0.1 would let any local process name any
# address): one of them, read as the OpenEnv server reads it (`sqlenv.client_address`). The app serves with
# FORWARDED_ALLOW_IPS empty unless the operator set it (`trusted_proxies_setting`).
OWNER_ROLES = ("admin", "write")  # roles in an owner organization that count as owner
HOW_TO_ENABLE = (
    "To turn them on, set <code>SQLENV_ADMIN_PASSWORD</code> (on a Space: a secret in its settings) and log in "
    "as the owner, or on a Space add <code>hf_oauth: true</code> to the README front matter so the Space's "
    "author can sign in with Hugging Face (other Hub users: <code>SQLENV_ADMIN_USERS</code>)."
)


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.1 and the rest of 127/8, ::1 and localhost: only this machine can connect."""
    if not host:
        return False
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(sorted({n.strip().lower() for n in (text or "").split(",") if n.strip()}))


@dataclass(frozen=True)
class AccessPolicy:
    """Who counts as the owner; pure logic, no Gradio (see the module docstring for the four modes).

    Args:
        mode: "open", "password", "oauth" or "locked".
        password: the owner's password (password mode only).
        owners: Hub user or organization names allowed in oauth mode (lower case).
        reason: one sentence for the page saying why the mode is what it is.
        proxy_hops: reverse proxies in front of the app whose `X-Forwarded-For` entries are trusted (default 0:
            the TCP peer is the client). Used to tell clients apart (`client`: the login throttle, Play; the
            connection bound per peer is off behind proxies); set it (env `SQLENV_PROXY_HOPS`; `from_env` takes 1
            on a HuggingFace Space, `SPACE_ID` with `SYSTEM=spaces`, as `sqlenv.client_address.proxy_hops_setting`
            decides for the server too) to the number of proxies that append to that header, never more: a client
            can write any entries of its own to the left of theirs.
    """

    mode: str = "open"
    password: str | None = field(default=None, repr=False)
    owners: tuple[str, ...] = ()
    reason: str = ""
    proxy_hops: int = 0
    # Signs password-mode tokens; drawn once per process, so tokens never outlive the server.
    _token_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False, compare=False)
    # Tokens revoked by Log out, as signature -> expiry: checked by `token_valid` until they expire anyway.
    _revoked: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _revoked_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown access mode {self.mode!r}; expected one of {MODES}")
        if self.mode == "password" and not self.password:
            raise ValueError("password mode needs a password")
        if not isinstance(self.proxy_hops, int) or self.proxy_hops < 0:
            raise ValueError(f"proxy_hops must be a non-negative integer, got {self.proxy_hops!r}")

    @classmethod
    def from_env(cls, host: str | None = "127.0.0.1", env: Mapping[str, str] | None = None) -> "AccessPolicy":
        """The policy for an app listening on `host`, from the environment (default `os.environ`):
        `SQLENV_ADMIN_PASSWORD`, `SQLENV_ADMIN_USERS`, and the Space's own `SPACE_ID`, `SPACE_AUTHOR_NAME`,
        `SYSTEM` ("spaces") and `OAUTH_CLIENT_ID` (set when the Space has `hf_oauth: true`).

        The proxies trusted: `SQLENV_PROXY_HOPS` or `FORWARDED_ALLOW_IPS` (`proxy_hops_setting`); with neither,
        one on a Space (`SPACE_ID` with `SYSTEM=spaces`: every request comes through Hugging Face's proxy, which
        appends the client to `X-Forwarded-For`; with none, every visitor would be one client to the throttle and
        Play's bounds), none elsewhere: `SPACE_ID` alone says nothing of a proxy, and trusting the header without
        one lets a password guesser name a new address at every try."""
        env = os.environ if env is None else env
        password = env.get(PASSWORD_ENV) or None
        space = env.get("SPACE_ID") or None
        # One rule for the server and the dashboard: a forwarded address is believed only where the platform says a
        # proxy is in front (SPACE_ID with SYSTEM=spaces) or the operator says so; SPACE_ID alone is any variable.
        hops = proxy_hops_setting(env=env)
        if password:
            return cls("password", password=password, reason=f"{PASSWORD_ENV} is set: the owner logs in with it.",
                       proxy_hops=hops)
        # Gradio serves the real Hub login only where it sees a Space (SYSTEM=spaces with SPACE_ID, as every
        # Space sets); elsewhere its login button would impersonate the machine's own Hub account.
        if space and env.get("OAUTH_CLIENT_ID") and env.get("SYSTEM") == "spaces":
            owners = _names(env.get(USERS_ENV)) or _names(env.get("SPACE_AUTHOR_NAME") or space.split("/")[0])
            who = ", ".join(owners) or "nobody"
            return cls("oauth", owners=owners, reason=f"Sign in with Hugging Face: the owners are {who}.",
                       proxy_hops=hops)
        if space:
            return cls("locked", reason=f"This app runs as the Space {space} and no owner is configured.",
                       proxy_hops=hops)
        if is_loopback(host):
            return cls("open", reason=f"Bound to {host}: only this machine can reach it, so it is open.",
                       proxy_hops=hops)
        return cls("locked", reason=f"Bound to {host or 'all interfaces'} and no owner is configured.",
                   proxy_hops=hops)

    # --- password mode ---------------------------------------------------------------------------------
    def password_matches(self, given: Any) -> bool:
        if self.mode != "password" or not isinstance(given, str):
            return False
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.password.encode("utf-8"))

    def _sign(self, expires: str) -> str:
        return hmac.new(self._token_key, expires.encode(), hashlib.sha256).hexdigest()

    def issue_token(self, now: float | None = None) -> str:
        """A token proving a password login, valid for TOKEN_TTL_S from `now`."""
        expires = str(int((time.time() if now is None else now) + TOKEN_TTL_S))
        return f"{expires}.{self._sign(expires)}"

    def token_valid(self, token: Any, now: float | None = None) -> bool:
        if self.mode != "password" or not isinstance(token, str) or len(token) > 200:
            return False
        expires, _, signature = token.partition(".")
        if not expires.isdigit() or int(expires) < (time.time() if now is None else now):
            return False
        return hmac.compare_digest(signature, self._sign(expires)) and signature not in self._revoked

    def revoke(self, token: Any, now: float | None = None) -> bool:
        """Refuse `token` from now on (Log out). Only a valid token is remembered, until it would expire anyway,
        so the list holds at most the owner's own logins of the last TOKEN_TTL_S. True when it was revoked."""
        now = time.time() if now is None else now
        if not self.token_valid(token, now=now):
            return False
        expires, _, signature = token.partition(".")
        with self._revoked_lock:
            for old in [s for s, e in self._revoked.items() if e < now]:
                del self._revoked[old]
            self._revoked[signature] = int(expires)
        return True

    def client(self, request: Any) -> str:
        """Who a Gradio event's caller is, for every per-client limit (the login throttle, Play): `client_key` of
        the HTTP request behind `request` (a `gr.Request`), with `proxy_hops` trusted proxies' `X-Forwarded-For`
        entries, every line of the header, and an IPv6 address as its /64: the rules the OpenEnv server's
        sessions per client count by. The TCP peer is the one uvicorn reports, which is the TCP peer as long as it
        trusts no proxy (`trusted_proxies_setting`), else the client its operator-set FORWARDED_ALLOW_IPS resolved.
        "unknown" when there is no request."""
        scope = getattr(getattr(request, "request", None), "scope", None)
        return client_key(scope if isinstance(scope, dict) else {}, self.proxy_hops)

    # --- oauth mode -------------------------------------------------------------------------------------
    def profile_allowed(self, profile: Mapping[str, Any] | None) -> bool:
        """Whether a Hub login profile (OpenID userinfo: `preferred_username`, maybe `orgs`) is an owner."""
        if self.mode != "oauth" or not profile:
            return False
        username = str(profile.get("preferred_username") or "").lower()
        if username and username in self.owners:
            return True
        orgs = profile.get("orgs")
        for org in orgs if isinstance(orgs, list) else []:
            if not isinstance(org, Mapping):
                continue
            name = str(org.get("preferred_username") or org.get("name") or "").lower()
            role = org.get("roleInOrg")
            if name in self.owners and (role is None or role in OWNER_ROLES):
                return True
        return False

    # --- any mode ---------------------------------------------------------------------------------------
    def is_owner(self, token: Any = None, profile: Mapping[str, Any] | None = None) -> bool:
        """The check every owner event runs: `token` from the browser (password mode), `profile` from the
        signed session cookie (oauth mode)."""
        if self.mode == "open":
            return True
        if self.mode == "password":
            return self.token_valid(token)
        if self.mode == "oauth":
            return self.profile_allowed(profile)
        return False


def trusted_proxies_setting(env: Mapping[str, str] | None = None) -> str:
    """The FORWARDED_ALLOW_IPS the app's server must run with (`dashboard.server.launch` sets it): the operator's
    own value when set, else "" (uvicorn trusts no peer's X-Forwarded-For). Gradio starts uvicorn with its
    default otherwise, 127.0.0.1: a client connecting from this machine (a local proxy, or anything else on it)
    would then choose the address that the login throttle counts, by sending a header."""
    env = os.environ if env is None else env
    return env.get(FORWARDED_ALLOW_IPS_ENV) or ""


class LoginThrottle:
    """Counts wrong passwords per client; refuses a client's logins while it has MAX_LOGIN_FAILURES within the
    window. Other clients (the owner) log in as usual.

    Args:
        max_failures: wrong passwords a client may send within `window_s` (default 5).
        window_s: the sliding window in seconds (default 60).
        max_clients: most clients remembered (default 10_000); past it the least recently failed is forgotten,
            so a flood from many addresses costs bounded memory.
    """

    def __init__(self, max_failures: int = MAX_LOGIN_FAILURES, window_s: float = LOGIN_WINDOW_S,
                 max_clients: int = MAX_THROTTLED_CLIENTS):
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait_s(self, client: str = "", now: float | None = None) -> float:
        """Seconds until `client` may try a login again (0 when it may now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._failures.get(client)
            while times and now - times[0] >= self.window_s:
                times.popleft()
            if not times:
                self._failures.pop(client, None)
                return 0.0
            if len(times) < self.max_failures:
                return 0.0
            return self.window_s - (now - times[0])

    def failed(self, client: str = "", now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._failures.pop(client, None) or deque(maxlen=self.max_failures)
            times.append(now)
            self._failures[client] = times  # most recent last
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)


class OwnerGate:
    """The policy's Gradio side for one Blocks: the owner bar, owner-only events, controls a visitor sees
    greyed out. Call `render()` where the owner bar goes (before any `owner_event`), then build the tabs, then
    `wire(demo)` once every control is registered."""

    def __init__(self, policy: AccessPolicy):
        self.policy = policy
        self.throttle = LoginThrottle()
        self._controls: list[gr.components.Component] = []
        self.token: gr.BrowserState | None = None
        self.status: gr.HTML | None = None
        self._password: gr.Textbox | None = None
        self._login: gr.Button | None = None
        self._logout: gr.Button | None = None

    # --- the check --------------------------------------------------------------------------------------
    def refusal(self, action: str) -> str:
        how = {
            "password": "log in as the owner (the password box at the top of the page)",
            "oauth": "sign in with Hugging Face as one of the owners ("
                     + (", ".join(self.policy.owners) or "none configured") + ")",
            "locked": "no owner is configured on this server",
        }.get(self.policy.mode, "")
        return f"Refused: only the owner may {action}" + (f"; {how}." if how else ".")

    def guard(self, fn: Callable[..., Any], action: str) -> Callable[..., Any]:
        """`fn` behind the owner check. The wrapper takes the Hub login profile first (Gradio fills it from the
        type hint, from the signed session cookie; None when not signed in), then `fn`'s inputs and the owner
        token last (the input `owner_event` adds); it raises gr.Error before calling `fn` unless the caller is
        the owner."""
        policy, message = self.policy, self.refusal(action)

        def check(profile, args):
            *inputs, token = args
            if not policy.is_owner(token=token, profile=profile):
                raise gr.Error(message, title="Owner only", print_exception=False)
            return inputs

        if inspect.isgeneratorfunction(fn):
            def guarded(profile: gr.OAuthProfile | None, *args):
                yield from fn(*check(profile, args))
        else:
            def guarded(profile: gr.OAuthProfile | None, *args):
                return fn(*check(profile, args))
        guarded.__name__ = getattr(fn, "__name__", "owner_event")
        guarded.__doc__ = getattr(fn, "__doc__", None)
        return guarded

    def owner_event(self, trigger: Callable[..., Any], fn: Callable[..., Any], *, inputs=None, outputs=None,
                    action: str = "do this", **kwargs: Any):
        """Wire `trigger(fn, inputs, outputs, **kwargs)` (e.g. `start_btn.click`) as an owner-only event: the
        server checks the caller on every call and the event is kept out of the public API.

        Args:
            trigger: the event listener, e.g. `button.click` or `dropdown.change`.
            fn: the handler, called with `inputs` as usual (only ever for the owner).
            inputs, outputs: as for any Gradio event.
            action: what is refused, for the message: "Refused: only the owner may <action>; ...".
            kwargs: any other event argument (show_progress, queue, ...); `api_visibility` is always private.
        """
        if self.token is None:
            raise RuntimeError("OwnerGate.render() must run before owner events are wired")
        kwargs["api_visibility"] = "private"
        return trigger(self.guard(fn, action), inputs=[*(inputs or []), self.token], outputs=outputs, **kwargs)

    def control(self, *components: gr.components.Component) -> None:
        """Components only the owner may use: interactive for the owner, greyed out for everyone else."""
        for component in components:
            component.interactive = self.policy.mode == "open"
            self._controls.append(component)

    # --- the owner bar ----------------------------------------------------------------------------------
    def status_html(self, owner: bool, note: str = "") -> str:
        mode = self.policy.mode
        if mode == "open":
            text = (f"Local mode: {html.escape(self.policy.reason)} Bind it elsewhere or deploy it as a Space and "
                    "training needs the owner.")
        elif owner:
            text = "You are the owner: the training controls are yours."
        elif mode == "locked":
            text = (f"Visitor mode: watch the live run, compare, play and browse runs. Training controls are off: "
                    f"{html.escape(self.policy.reason)} {HOW_TO_ENABLE}")
        else:
            who = ("the owner logs in with the password, here" if mode == "password" else
                   f"{html.escape(', '.join(self.policy.owners) or 'nobody')} sign in with Hugging Face, here")
            text = ("Visitor mode: watch the live run, compare, play and browse runs. Only the owner can start "
                    f"or stop training ({who}).")
        note_html = f' <b id="owner-note">{html.escape(note)}</b>' if note else ""
        return (f'<div id="owner-state" class="sqe-muted" data-mode="{mode}" data-owner="{str(owner).lower()}">'
                f"{text}{note_html}</div>")

    def render(self) -> None:
        """The owner bar: who you are and, depending on the mode, a password box or a Hugging Face sign-in."""
        self.token = gr.BrowserState("", storage_key="sqlenv-owner-token")
        mode = self.policy.mode
        with gr.Row(elem_id="owner-bar", equal_height=True):
            self.status = gr.HTML(self.status_html(owner=mode == "open"), elem_id="owner-status", scale=4)
            if mode == "password":
                # Greyed out until the page's load event has said who this is: a login answered before it would be
                # undone by it (its note wiped, an owner shown the visitor's page).
                self._password = gr.Textbox(placeholder="owner password", type="password", show_label=False,
                                            elem_id="owner-password", scale=1, min_width=180, max_length=512,
                                            container=False, interactive=False)
                self._login = gr.Button("Log in", elem_id="owner-login", scale=0, min_width=100, size="md",
                                        interactive=False)
                self._logout = gr.Button("Log out", elem_id="owner-logout", scale=0, min_width=110, size="md",
                                         visible=False)
            elif mode == "oauth":
                # Only here: a LoginButton makes Gradio add its OAuth routes, which outside a Space would ask
                # the Hub who the local user is.
                gr.LoginButton(elem_id="owner-oauth", scale=0, min_width=220)

    def _page(self, owner: bool, note: str = "") -> list:
        updates = [self.status_html(owner, note)]
        updates += [gr.update(interactive=owner) for _ in self._controls]
        if self.policy.mode == "password":
            updates += [gr.update(visible=not owner, value="", interactive=True),
                        gr.update(visible=not owner, interactive=True), gr.update(visible=owner)]
        return updates

    def wire(self, demo: gr.Blocks) -> None:
        """Per page: enable the controls for the owner when the page loads, and the login/logout buttons."""
        outputs = [self.status, *self._controls]
        if self.policy.mode == "password":
            outputs += [self._password, self._login, self._logout]
        policy = self.policy

        def on_load(profile: gr.OAuthProfile | None, token):
            return self._page(policy.is_owner(token=token, profile=profile))

        if self.policy.mode != "open":
            demo.load(on_load, inputs=[self.token], outputs=outputs, show_progress="hidden",
                      api_visibility="private")
        if self.policy.mode != "password":
            return

        def login(password, request: gr.Request):
            client = policy.client(request)
            wait = self.throttle.wait_s(client)
            if wait > 0:
                return ["", *self._page(False, f"Too many wrong passwords: try again in {wait:.0f} s.")]
            if not policy.password_matches(password):
                self.throttle.failed(client)
                return ["", *self._page(False, "Wrong password.")]
            return [policy.issue_token(), *self._page(True)]

        def logout(token):
            policy.revoke(token)  # a copy of the token kept elsewhere stops working too
            return ["", *self._page(False, "Logged out.")]

        self._login.click(login, inputs=[self._password], outputs=[self.token, *outputs], show_progress="hidden",
                          api_visibility="private")
        self._password.submit(login, inputs=[self._password], outputs=[self.token, *outputs],
                              show_progress="hidden", api_visibility="private")
        self._logout.click(logout, inputs=[self.token], outputs=[self.token, *outputs], show_progress="hidden",
                           api_visibility="private")
