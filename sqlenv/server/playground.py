"""The page a `--web` server serves at `/web/`: SQLEnv's own playground, one static page.

The page plays over the WebSocket `/ws`, as any OpenEnv client does: each visitor (each browser tab) opens a
session of their own, resets it and steps it. So the page is held to every bound a client is held to (the session
limit, the sessions per client address, the idle and reset timeouts, the message size and value count in
`sqlenv.server.app`), and the server keeps nothing for it: the page is the same bytes for everyone, and a visitor's
episode is their session's, gone when the tab closes.

Why not OpenEnv's own web interface (`create_web_interface_app`: a Gradio app at `/web` over one episode shared by
every visitor, `POST /web/reset` and `/web/step`, updates pushed to `/ws/ui`). Measured against it on 127.0.0.1
(issue 43):
- it awaited every `/ws/ui` client's send inside each `/web/reset` and `/web/step`: one UI socket that never read
  hung every reset and step (0 of 25 answered), each hung request holding a copy of the whole state;
- its action log kept 1,000 steps' arguments whatever the step budget: 1,000 steps of 1 MB arguments took the
  process from 215 to 1,175 MB, held; with a UI socket that read, every step rebuilt and sent the whole log on the
  event loop (11 GB sent for 150 steps, `/health` up to 1.16 s);
- its Gradio app took uploads from anyone (50 in 0.5 s left 45 MB in the temp folder, served back, never deleted)
  and kept every session's inputs (800 sessions of 0.96 MB: +1.1 GB kept).
None of it can be bounded from outside through OpenEnv's public API (the manager, its log and its pushes are built
inside `create_web_interface_app`), and a shared episode is not what a visitor expects. So none of it is served:
`/web/reset`, `/web/step`, `/web/state`, `/web/metadata`, `/ws/ui` and Gradio's routes answer 404.

Every server value is shown as text (`textContent`), never as HTML, and the page's Content-Security-Policy allows
only its own inline script and style (by hash) and connections to its own origin.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

__all__ = ["PAGE_PATH", "add_playground", "page_headers", "PAGE_HTML"]

#: Where the page is served (`/` and `/web` redirect to it, as OpenEnv's web interface did).
PAGE_PATH = "/web/"
#: The longest argument the page lets a visitor type: the sandbox's longest SQL text (`max_sql_chars`).
MAX_PAGE_ARGUMENT_CHARS = 20_000

_CSS = """
:root { color-scheme: light dark; --line: #8884; --muted: #888; --accent: #2f6fde; --bad: #c0392b; --good: #1e8449; }
body { font: 15px/1.45 system-ui, sans-serif; max-width: 980px; margin: 0 auto; padding: 16px; }
h1 { font-size: 1.4em; margin: 0 0 4px; } h2 { font-size: 1.05em; margin: 0 0 6px; }
p { margin: 4px 0; } .muted { color: var(--muted); }
section { border: 1px solid var(--line); border-radius: 8px; padding: 12px; margin: 12px 0; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font: 13px/1.4 ui-monospace, monospace; }
.row { display: flex; gap: 8px; flex-wrap: wrap; align-items: center; }
input, select, textarea, button { font: inherit; padding: 4px 8px; }
textarea { width: 100%; box-sizing: border-box; font: 13px/1.4 ui-monospace, monospace; }
button { cursor: pointer; } button:disabled { cursor: wait; opacity: 0.6; }
#error { color: var(--bad); } .correct { color: var(--good); } .wrong { color: var(--bad); }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; } dt { color: var(--muted); }
ol { margin: 0; padding-left: 24px; font: 13px/1.4 ui-monospace, monospace; }
"""

_SCRIPT = """
"use strict";
const $ = (id) => document.getElementById(id);
let socket = null;   // this visitor's session: one WebSocket to /ws, opened at the first New episode
let waiting = null;  // the request awaiting its reply (the page sends one at a time)
let playing = false;

function wsUrl() {
  const url = new URL("../ws", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

function status(text) { $("status").textContent = text; }

function setBusy(busy) {
  $("reset").disabled = busy;
  $("step").disabled = busy || !playing;
}

function connect() {
  if (socket && socket.readyState === WebSocket.OPEN) return Promise.resolve(socket);
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl());
    ws.onopen = () => { socket = ws; status("Connected: this tab has a session of its own."); resolve(ws); };
    ws.onmessage = (event) => {
      const pending = waiting;
      waiting = null;
      if (pending) pending.resolve(JSON.parse(event.data));
    };
    ws.onclose = (event) => {
      if (socket === ws) socket = null;
      playing = false;
      const why = event.reason ? `: ${event.reason}` : "";
      status(`Session closed${why}. New episode opens another.`);
      if (waiting) { waiting.reject(new Error(`the session closed${why}`)); waiting = null; }
      reject(new Error(`could not connect${why}`));
      setBusy(false);
    };
  });
}

async function request(message) {
  const ws = await connect();
  return new Promise((resolve, reject) => {
    waiting = { resolve, reject };
    ws.send(JSON.stringify(message));
  });
}

function fixed(value) { return typeof value === "number" ? value.toFixed(3) : "-"; }

function show(reply) {
  if (reply.type === "error") { $("error").textContent = reply.data.message || "error"; return false; }
  const data = reply.data, obs = data.observation, meta = obs.metadata || {};
  $("question").textContent = obs.question;
  $("schema").textContent = obs.schema_info;
  $("result").textContent = obs.result;
  $("error").textContent = obs.error;
  $("steps").textContent = `${obs.step_count} taken, ${obs.budget_remaining} left`;
  $("reward").textContent = fixed(data.reward);
  $("total").textContent = fixed((meta.reward_breakdown || {}).total);
  $("outcome").textContent = meta.outcome || "";
  $("outcome").className = meta.outcome === "correct" ? "correct" : data.done ? "wrong" : "";
  const history = $("history");
  history.replaceChildren(...(obs.action_history || []).map((line) => {
    const item = document.createElement("li");
    item.textContent = line.replace(/^\\d+\\.\\s*/, "");
    return item;
  }));
  playing = !data.done;
  return true;
}

async function revealGold() {
  const reply = await request({ type: "state" });
  const transcript = reply.type === "state" ? reply.data.transcript : null;
  if (!transcript) return;
  $("gold-sql").textContent = transcript.gold_sql || "";
  $("gold-answer").textContent = transcript.gold_answer || "";
  $("gold").hidden = false;
}

async function run(action) {
  setBusy(true);
  $("error").textContent = "";
  try {
    await action();
  } catch (err) {
    $("error").textContent = err.message;
  } finally {
    setBusy(false);
  }
}

$("reset").onclick = () => run(async () => {
  const data = {};
  const id = $("question-id").value.trim();
  if (id) data.question_id = id;
  $("gold").hidden = true;
  if (show(await request({ type: "reset", data }))) {
    $("episode").hidden = false;
    $("argument").focus();
  }
});

$("step").onclick = () => run(async () => {
  const action = { action_type: $("action-type").value, argument: $("argument").value };
  if (show(await request({ type: "step", data: action })) && !playing) await revealGold();
});

$("argument").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !$("step").disabled) $("step").click();
});

$("base-url").textContent = new URL("..", location.href).href.replace(/\\/$/, "");
setBusy(false);
"""

_BODY = """
<h1>SQLEnv</h1>
<p>Answer a question about a SQLite database: DESCRIBE and SAMPLE tables, QUERY with one read-only SELECT, then
ANSWER. Each browser tab plays an episode of its own over the WebSocket <code>/ws</code>, as any OpenEnv client
does.</p>
<p id="status" class="muted">Not connected.</p>
<section>
  <div class="row">
    <input id="question-id" placeholder="question id (optional)" maxlength="255" size="28" aria-label="question id">
    <button id="reset">New episode</button>
  </div>
</section>
<div id="episode" hidden>
  <section>
    <h2>Question</h2><p id="question"></p>
    <pre id="schema" class="muted"></pre>
  </section>
  <section>
    <h2>Action</h2>
    <div class="row">
      <select id="action-type" aria-label="action type">
        <option>DESCRIBE</option><option>SAMPLE</option><option selected>QUERY</option><option>ANSWER</option>
      </select>
      <button id="step">Step</button><span class="muted">Ctrl+Enter</span>
    </div>
    <textarea id="argument" rows="4" maxlength="__MAX_ARGUMENT__" aria-label="argument"
      placeholder="a table name (DESCRIBE, SAMPLE), one SELECT (QUERY) or the answer (ANSWER)"></textarea>
  </section>
  <section>
    <h2>Result</h2>
    <pre id="error"></pre>
    <pre id="result"></pre>
  </section>
  <section>
    <dl>
      <dt>Steps</dt><dd id="steps"></dd>
      <dt>Reward (this step)</dt><dd id="reward"></dd>
      <dt>Reward (episode)</dt><dd id="total"></dd>
      <dt>Outcome</dt><dd id="outcome"></dd>
    </dl>
    <ol id="history"></ol>
  </section>
  <section id="gold" hidden>
    <h2>Gold</h2>
    <pre id="gold-sql"></pre>
    <p>Answer: <code id="gold-answer"></code></p>
  </section>
</div>
<section>
  <h2>From Python</h2>
<pre>from openenv.core import GenericEnvClient

with GenericEnvClient(base_url="<span id="base-url"></span>").sync() as env:
    result = env.reset()
    result = env.step({"action_type": "QUERY", "argument": "SELECT 1"})
    print(result.observation["result"], result.reward)</pre>
</section>
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


#: The whole page (it never changes while the server runs).
PAGE_HTML = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>SQLEnv</title>"
             f"<style>{_CSS}</style></head><body>"
             + _BODY.replace("__MAX_ARGUMENT__", str(MAX_PAGE_ARGUMENT_CHARS))
             + f"<script>{_SCRIPT}</script></body></html>\n")


def page_headers() -> dict[str, str]:
    """The page's response headers: a policy allowing its own inline script and style only (by hash), connections
    to its own origin only (`'self'` covers its `ws:`/`wss:`), no plugins, no base or form targets; no caching
    across server versions; no MIME sniffing; no referrer."""
    policy = (f"default-src 'none'; script-src {_sha256(_SCRIPT)}; style-src {_sha256(_CSS)}; connect-src 'self'; "
              "img-src 'self' data:; base-uri 'none'; form-action 'none'")
    return {"Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache"}


def add_playground(app: Any) -> None:
    """Serve the page at `PAGE_PATH` on the FastAPI `app`; `/` and `/web` redirect to it."""
    from fastapi.responses import HTMLResponse, RedirectResponse

    headers = page_headers()

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(PAGE_PATH)

    @app.get(PAGE_PATH.rstrip("/"), include_in_schema=False)
    async def web_no_slash() -> RedirectResponse:
        return RedirectResponse(PAGE_PATH)

    @app.get(PAGE_PATH, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE_HTML, headers=headers)
