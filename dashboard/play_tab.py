"""Play tab: a person plays one episode by hand.

Each browser session plays its own `SQLEnvironment`, so two people playing at once never see each other's
episode. Anyone may open one, and one holds database connections and its last QUERY result, so the app keeps
them in one bounded `PlayEpisodes` (the session's `gr.State` holds only a handle): at most
`SQLENV_PLAY_MAX_EPISODES` open (a new one closes the least recently used), each closed after
`SQLENV_PLAY_IDLE_S` seconds without a step (Gradio expires the state) or when its page is closed (unload).
Anyone may play: dataset names, splits, question ids and arguments are checked (dashboard.inputs) before
anything is opened or run.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gradio as gr

from dashboard import inputs as checked
from sqlenv.sandbox.native_memory import fix_mmap_threshold, malloc_trim
from dashboard.context import AppContext, dataset_choices, dataset_splits
from dashboard.transcripts import esc, format_gold, layers_html, steps_table, transcript_html, verdict_badge

RANDOM = "random"
ACTIONS = ["DESCRIBE", "SAMPLE", "QUERY", "ANSWER"]
PLACEHOLDERS = {
    "DESCRIBE": "a table name, e.g. singer",
    "SAMPLE": "a table name, e.g. singer",
    "QUERY": "one SELECT statement, e.g. SELECT count(*) FROM singer",
    "ANSWER": "the answer: a value; a comma-separated list; table rows `a | b` one per line; [] for none",
}


MAX_EPISODES_ENV = "SQLENV_PLAY_MAX_EPISODES"
IDLE_ENV = "SQLENV_PLAY_IDLE_S"
# Each open episode holds its database connections and its last QUERY result (up to the sandbox's
# max_result_bytes, 32 MB), and any visitor may open one: these bound how many and how long an abandoned one lives.
MAX_EPISODES = 16
IDLE_S = 600.0


def limits_from_env(env: Mapping[str, str] | None = None) -> tuple[int, float]:
    """(most open episodes, idle seconds) from `SQLENV_PLAY_MAX_EPISODES` / `SQLENV_PLAY_IDLE_S` (default 16, 600);
    a malformed value raises ValueError naming the variable."""
    env = os.environ if env is None else env
    text = (env.get(MAX_EPISODES_ENV) or str(MAX_EPISODES)).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{MAX_EPISODES_ENV} must be a whole number >= 1, got {text!r}")
    idle_text = (env.get(IDLE_ENV) or str(IDLE_S)).strip()
    try:
        idle = float(idle_text)
    except ValueError:
        idle = -1.0
    if not 0 < idle < float("inf"):
        raise ValueError(f"{IDLE_ENV} must be a positive number of seconds, got {idle_text!r}")
    return int(text), idle


def _close_env(env: Any) -> None:
    try:
        env.close()
    except Exception:  # closing a broken environment must not fail the visitor's event
        pass


# Episodes step on Gradio's worker threads, and glibc keeps what a thread's arena freed: without a trim a
# closed episode's result stays in the app's RSS (measured: 8 episodes of 30 MB results, 243 -> 515 MB, and
# still 515 MB after all of them closed).
_TRIM = malloc_trim()


@dataclass
class Episode:
    """One visitor's open environment in `PlayEpisodes`."""

    env: Any
    key: tuple  # (dataset, split, budget, questions mtime): a new episode on the same key reuses `env`
    session: str | None  # the Gradio session that opened it (closed with its page)
    used: float  # the clock at its last open or step
    busy: bool = False  # a step is running on it
    closed: bool = False  # dropped while busy: the step closes it when it ends


class EpisodeBusy(Exception):
    """A step of this episode is still running."""


class PlayEpisodes:
    """The Play environments the app keeps open, bounded in number and in idle time.

    Args:
        capacity: most episodes open at once; opening one more closes the least recently used.
        idle_s: an episode with no step for this long is closed by `sweep` (which every `open` runs, and Gradio
            runs through the state's delete callback once the page's state has been idle as long).
        clock: seconds, monotonic (default `time.monotonic`).

    A closed episode drops its environment (connections closed, its last result freed); its visitor's next step
    is told to start a new episode. One step at a time per episode: a second one while the first runs is refused
    (`EpisodeBusy`), and an episode dropped while a step runs is closed when that step ends.
    """

    def __init__(self, capacity: int = MAX_EPISODES, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic):
        if capacity < 1 or idle_s <= 0:
            raise ValueError(f"PlayEpisodes needs capacity >= 1 and idle_s > 0, got {capacity}, {idle_s}")
        self.capacity, self.idle_s, self.clock = capacity, idle_s, clock
        self._episodes: OrderedDict[str, Episode] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        fix_mmap_threshold()  # a closed episode's big blocks go back to the system (see sqlenv.sandbox.native_memory)

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)

    def open(self, env: Any, key: tuple, session: str | None = None) -> str:
        """Keep `env` open for a new episode; returns its handle (unguessable: the page's state holds it)."""
        handle = secrets.token_urlsafe(16)
        with self._lock:
            self._episodes[handle] = Episode(env, key, session, self.clock())
            dropped = self._expired()
            while len(self._episodes) > self.capacity:
                dropped.append(self._episodes.popitem(last=False)[1])
        self._finish(dropped)
        return handle

    def take(self, handle: Any) -> Episode | None:
        """The open episode `handle` names, marked busy for one step (give it back with `give_back`); None when
        it is closed or never was. Raises EpisodeBusy while another step of it runs."""
        with self._lock:
            episode = self._episodes.get(handle) if isinstance(handle, str) else None
            if episode is None:
                return None
            if episode.busy:
                raise EpisodeBusy
            episode.busy, episode.used = True, self.clock()
            self._episodes.move_to_end(handle)
            return episode

    def give_back(self, episode: Episode) -> None:
        """End the step that `take` began; an episode closed meanwhile is closed now."""
        with self._lock:
            episode.busy, episode.used = False, self.clock()
            closing = episode.closed
        if closing:
            self._finish([episode])

    def close(self, handle: Any) -> None:
        """Close the episode `handle` names (no-op when it is not open)."""
        with self._lock:
            episode = self._episodes.pop(handle, None) if isinstance(handle, str) else None
        self._finish([episode] if episode else [])

    def close_session(self, session: str | None) -> None:
        """Close every episode the Gradio session `session` opened (its page was closed)."""
        if not session:
            return
        with self._lock:
            handles = [h for h, e in self._episodes.items() if e.session == session]
            dropped = [self._episodes.pop(h) for h in handles]
        self._finish(dropped)

    def sweep(self) -> None:
        """Close the episodes idle for `idle_s` or more."""
        with self._lock:
            dropped = self._expired()
        self._finish(dropped)

    def _expired(self) -> list[Episode]:  # under the lock
        now = self.clock()
        handles = [h for h, e in self._episodes.items() if not e.busy and now - e.used >= self.idle_s]
        return [self._episodes.pop(h) for h in handles]

    def _finish(self, dropped: list[Episode]) -> None:
        freed = False
        for episode in dropped:
            with self._lock:
                if episode.busy:  # its step is running: that step closes it when it ends (give_back)
                    episode.closed = True
                    continue
                env, episode.env = episode.env, None  # the last reference: its result is freed with it
            if env is not None:
                _close_env(env)
                del env
                freed = True
        if freed and _TRIM is not None:
            _TRIM(0)  # give what the environments held back to the system (a few ms)


def _handle(state: Any) -> Any:
    return state.get("episode") if isinstance(state, dict) else None


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s"


def refused(exc: Any) -> str:
    return f'<div class="sqe-err-box" id="play-refused">{esc(exc)}</div>'


def question_choices(name: str, split: str, data_root) -> tuple[list, str | None]:
    try:
        from sqlenv.data.datasets import resolve_dataset

        source = checked.dataset_source(name, data_root)
        questions = resolve_dataset(source, data_root).load(checked.name(split, "Split"))
    except Exception as exc:
        return [RANDOM], str(exc)
    choices: list = [RANDOM]
    for q in questions:
        text = q.question_text if len(q.question_text) <= 80 else q.question_text[:77] + "…"
        choices.append((f"{q.question_id} — {text}", q.question_id))
    return choices, None


def episode_header(env) -> str:
    q = env.question
    obs = env.last_observation
    return (
        '<div class="sqe-card" id="play-question">'
        f'<div class="sqe-question">{esc(q.question_text)}</div>'
        f'<div class="sqe-meta">database <b>{esc(q.database_name)}</b> · {esc(q.difficulty)} · '
        f'answer type <b>{esc(q.answer_type)}</b> · question {esc(q.question_id)}</div>'
        f'<div class="sqe-meta" style="margin-top:6px">What you know about the schema '
        f'(DESCRIBE a table to add its columns):</div>'
        f'<pre class="sqe-inline sqe-schema">{esc(obs.schema_info if obs else "")}</pre>'
        f'<div class="sqe-meta" id="play-budget" data-budget="{obs.budget_remaining if obs else ""}">'
        f'budget left: <b>{obs.budget_remaining if obs else "?"}</b> / {env.step_budget} steps</div></div>'
    )


def observation_html(env, obs) -> str:
    if obs is None:
        return ""
    text = obs.error or obs.result or "(no output)"
    cls = "sqe-obs sqe-err" if obs.error else "sqe-obs"
    verdict = ""
    if obs.done:
        t = env.transcript(policy="human")
        verdict = (
            f'<div class="sqe-verdict" id="play-verdict" data-outcome="{esc(t["outcome"])}">{verdict_badge(t)} '
            f'<span>your answer: <code>{esc(t.get("answer") if t.get("answer") is not None else "—")}</code></span>'
            f'<span>total reward <b>{t["total_reward"]:+.3f}</b></span></div>'
            '<div class="sqe-gold"><div><b>gold answer:</b> '
            f'<pre class="sqe-inline" id="play-gold-answer">{esc(format_gold(t.get("gold_answer")))}</pre></div>'
            f'<div><b>gold SQL:</b> <pre class="sqe-inline" id="play-gold-sql">{esc(t.get("gold_sql"))}</pre></div></div>'
        )
    return (
        f'<div class="sqe-card" id="play-observation">'
        f'<div class="sqe-meta">step {obs.step_count} · reward {layers_html(obs.reward_layers.to_dict(), obs.reward)}'
        f' · budget left {obs.budget_remaining}</div>'
        f'<pre class="{cls}" style="max-height:22em">{esc(text)}</pre>{verdict}</div>'
    )


def build(ctx: AppContext) -> dict[str, Any]:
    datasets = dataset_choices(ctx.data_root)
    gr.Markdown(
        "Play an episode yourself: the agent's view is the question and the table names. "
        "Explore with **DESCRIBE** / **SAMPLE** / **QUERY**, then **ANSWER**. Every step costs budget and earns "
        "a reward in three layers (operational, progress, terminal)."
    )
    with gr.Row():
        dataset_dd = gr.Dropdown(datasets, value=datasets[0], label="Dataset", allow_custom_value=True,
                                 elem_id="play-dataset", scale=2)
        split_dd = gr.Dropdown(["train", "eval", "eval_unseen_db"], value="eval", label="Split",
                               allow_custom_value=True, elem_id="play-split", scale=2)
        question_dd = gr.Dropdown([RANDOM], value=RANDOM, label="Question", elem_id="play-question-pick", scale=5)
        budget = gr.Number(15, precision=0, label="Step budget", minimum=1, maximum=100, elem_id="play-budget-in",
                           scale=1, min_width=110)
        new_btn = gr.Button("New episode", variant="primary", elem_id="play-new", scale=1)
    header = gr.HTML('<div class="sqe-muted">Press <b>New episode</b> to start.</div>', elem_id="play-header")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            action = gr.Radio(ACTIONS, value="DESCRIBE", label="Action", elem_id="play-action")
            argument = gr.Textbox(label="Argument", lines=3, placeholder=PLACEHOLDERS["DESCRIBE"],
                                  elem_id="play-argument")
            step_btn = gr.Button("Step", variant="primary", elem_id="play-step")
        with gr.Column(scale=3):
            observation = gr.HTML("", elem_id="play-obs")
    gr.Markdown("#### Episode so far")
    history = gr.HTML("", elem_id="play-history")
    episodes = PlayEpisodes(*limits_from_env())
    closed_html = (
        '<div class="sqe-err-box" id="play-closed">No episode is open: press <b>New episode</b> to start one. '
        f"(An episode closes after {_duration(episodes.idle_s)} without a step, or sooner when more than "
        f"{episodes.capacity} are open: the least recently played closes first.)</div>")
    busy_html = '<div class="sqe-err-box">Your last step is still running: wait for its result.</div>'
    # This session's {"episode": handle} in `episodes` ({} before New episode). Gradio deletes the value after
    # `idle_s` without an event, and the callback closes the episode (the state never holds the environment).
    state = gr.State({}, time_to_live=episodes.idle_s,
                     delete_callback=lambda value: episodes.close(_handle(value)))

    def on_dataset(name):
        try:
            source = checked.dataset_source(name, ctx.data_root)
        except checked.InputRefused as exc:
            return gr.update(), gr.update(choices=[RANDOM], value=RANDOM), refused(exc)
        splits, err = dataset_splits(source, ctx.data_root)
        if err:
            return gr.update(), gr.update(choices=[RANDOM], value=RANDOM), f'<div class="sqe-err-box">{esc(err)}</div>'
        split = "eval" if "eval" in splits else splits[0]
        choices, _ = question_choices(name, split, ctx.data_root)
        return gr.update(choices=splits, value=split), gr.update(choices=choices, value=RANDOM), gr.skip()

    def on_split(name, split):
        choices, err = question_choices(name, split, ctx.data_root)
        if err:
            return gr.update(choices=[RANDOM], value=RANDOM), f'<div class="sqe-err-box">{esc(err)}</div>'
        return gr.update(choices=choices, value=RANDOM), gr.skip()

    def new_episode(name, split, question, step_budget, current, request: gr.Request):
        handle = _handle(current)
        try:
            source = checked.dataset_source(name, ctx.data_root)
            split = checked.name(split, "Split")
            question = None if question in (None, "", RANDOM) else checked.name(question, "Question id")
        except checked.InputRefused as exc:
            episodes.close(handle)
            return {}, refused(exc), "", ""
        try:
            episode = episodes.take(handle)
        except EpisodeBusy:
            return current, gr.skip(), busy_html, gr.skip()
        env = None
        try:
            from sqlenv.data.datasets import resolve_dataset
            from sqlenv.environment import SQLEnvironment

            questions = resolve_dataset(source, ctx.data_root).questions_path(split)
            key = (source, split, int(step_budget or 15), questions.stat().st_mtime_ns)
            # The same dataset, split and budget as this session's last episode: reset its environment again.
            if episode is not None and episode.key == key:
                env = episode.env
            else:
                env = SQLEnvironment.from_dataset(source, split=split, data_root=ctx.data_root, step_budget=key[2])
            env.reset(question_id=question)
        except Exception as exc:
            if env is not None and (episode is None or env is not episode.env):
                _close_env(env)
            if episode is not None:
                episodes.give_back(episode)
            episodes.close(handle)
            return {}, f'<div class="sqe-err-box">Cannot start an episode: {esc(exc)}</div>', "", ""
        if episode is not None:
            episodes.give_back(episode)
            if env is episode.env and not episode.closed:
                return current, episode_header(env), "", steps_table([])
            episodes.close(handle)  # (a reused environment dropped meanwhile is kept again below)
        handle = episodes.open(env, key, getattr(request, "session_hash", None))
        return {"episode": handle}, episode_header(env), "", steps_table([])

    def do_step(kind, arg, current):
        try:
            episode = episodes.take(_handle(current))
        except EpisodeBusy:
            return current, gr.skip(), busy_html, gr.skip()
        if episode is None:  # never started, or closed (idle, or the least recently played of too many)
            return {}, gr.skip(), closed_html, gr.skip()
        try:
            env = episode.env
            try:
                kind = checked.name(kind, "Action")
                arg = checked.text(arg, "The argument")
            except checked.InputRefused as exc:  # refused before the environment sees it: no step is spent
                return current, gr.skip(), refused(f"{exc} Nothing was run; no step was spent."), gr.skip()
            if env.state.done and env.last_observation is not None:  # in the page's words, not the API's
                obs = env.last_observation.refusal("This episode is over: press New episode to start another.")
                return current, episode_header(env), observation_html(env, obs), gr.skip()
            from sqlenv.types import SQLAction

            obs = env.step(SQLAction(action_type=kind, argument=arg))
            transcript = env.transcript(policy="human")
            return (
                current,
                episode_header(env),
                observation_html(env, obs),
                transcript_html(transcript, show_gold=obs.done) if obs.done else steps_table(transcript["steps"]),
            )
        finally:
            episodes.give_back(episode)

    def close_play_episodes(request: gr.Request):
        """The page was closed or reloaded (Gradio's unload): its episode goes now, not after idle_s."""
        episodes.close_session(getattr(request, "session_hash", None))

    dataset_dd.change(on_dataset, inputs=[dataset_dd], outputs=[split_dd, question_dd, header])
    split_dd.input(on_split, inputs=[dataset_dd, split_dd], outputs=[question_dd, header])
    new_btn.click(new_episode, inputs=[dataset_dd, split_dd, question_dd, budget, state],
                  outputs=[state, header, observation, history])
    step_btn.click(do_step, inputs=[action, argument, state], outputs=[state, header, observation, history])
    action.change(lambda k: gr.update(placeholder=PLACEHOLDERS.get(k, "")), inputs=[action], outputs=[argument])

    def on_load(name, split):
        choices, _ = question_choices(name, split, ctx.data_root)
        return gr.update(choices=choices, value=RANDOM)

    return {"load": (on_load, [dataset_dd, split_dd], [question_dd]), "unload": close_play_episodes,
            "episodes": episodes}
