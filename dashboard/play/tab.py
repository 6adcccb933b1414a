"""Play tab: a person plays one episode by hand.

Each browser session plays its own `SQLEnvironment`, so two people playing at once never see each other's
episode. The app keeps the environments in one `dashboard.play.episodes.PlayEpisodes` (the session's `gr.State`
holds only a handle), bounded in all and per client; an episode closes after `SQLENV_PLAY_IDLE_S` seconds without
a step (Gradio expires the state) or when its page is closed (unload), never for another visitor's: one more than
there is room for is refused (`PlayFull`), before anything is opened for it. Each client runs at most
`STEPS_PER_CLIENT` Play events at once (`ClientSlots`), and Play's events share no other concurrency limit.
Anyone may play: dataset names, splits, question ids and arguments are checked (dashboard.access.inputs) before
anything is opened or run.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from dashboard.access import inputs as checked
from dashboard.core import picks
from dashboard.core.context import AppContext
from dashboard.core.datasets import dataset_choices, dataset_splits
from dashboard.core.formatting import duration_words
from dashboard.core.transcripts import esc, format_gold, layers_html, steps_table, transcript_html, verdict_badge
from dashboard.play.episodes import ClientSlots, EpisodeBusy, PlayEpisodes, PlayFull, close_env, limits_from_env
from sqlenv.data.datasets import resolve_dataset
from sqlenv.environment import SQLEnvironment
from sqlenv.types import SQLAction

RANDOM = "random"
ACTIONS = ["DESCRIBE", "SAMPLE", "QUERY", "ANSWER"]
PLACEHOLDERS = {
    "DESCRIBE": "a table name, e.g. singer",
    "SAMPLE": "a table name, e.g. singer",
    "QUERY": "one SELECT statement, e.g. SELECT count(*) FROM singer",
    "ANSWER": "the answer: a value; a comma-separated list; table rows `a | b` one per line; [] for none",
}


def _handle(state: Any) -> Any:
    return state.get("episode") if isinstance(state, dict) else None


def refused(exc: Any) -> str:
    return f'<div class="sqe-err-box" id="play-refused">{esc(exc)}</div>'


def full_html(why: Any) -> str:
    return f'<div class="sqe-err-box" id="play-full">{esc(why)}</div>'


def question_choices(name: str, split: str, data_root) -> tuple[list, str | None]:
    try:
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
    slots = ClientSlots()
    closed_html = (
        '<div class="sqe-err-box" id="play-closed">No episode is open: press <b>New episode</b> to start one. '
        f"(An episode closes after {duration_words(episodes.idle_s)} without a step, or when its page is "
        "closed.)</div>")
    busy_html = '<div class="sqe-err-box">Your last step is still running: wait for its result.</div>'
    slots_html = (f'<div class="sqe-err-box" id="play-slots">You already have {slots.per_client} Play steps running '
                  "(from this page or others at your address): wait for one of them to finish.</div>")
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

    def in_slot(request, current, event):
        """`event(client)`, run only while its client has fewer than `slots.per_client` Play events running (else
        its page is told so at once): a client's slow queries never hold up another client's step."""
        client = ctx.access.client(request)
        if not slots.enter(client):
            return current, gr.skip(), slots_html, gr.skip()
        try:
            return event(client)
        finally:
            slots.leave(client)

    def new_episode(name, split, question, step_budget, current, request: gr.Request):
        session = getattr(request, "session_hash", None)
        return in_slot(request, current,
                       lambda client: start_episode(name, split, question, step_budget, current, session, client))

    def do_step(kind, arg, current, request: gr.Request):
        return in_slot(request, current, lambda _client: step_episode(kind, arg, current))

    def start_episode(name, split, question, step_budget, current, session, client):
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
        env, reuse, why = None, False, None
        try:
            questions = resolve_dataset(source, ctx.data_root).questions_path(split)
            key = (source, split, int(step_budget or 15), questions.stat().st_mtime_ns)
            # The same dataset, split and budget as this session's last episode: reset its environment again.
            reuse = episode is not None and episode.key == key and not episode.closed
            # Else a new episode: a visitor with no room is told so before an environment is built for them.
            why = None if reuse else episodes.refusal(client, replaces=handle)
            if why is None:
                env = episode.env if reuse else SQLEnvironment.from_dataset(source, split=split,
                                                                             data_root=ctx.data_root,
                                                                             step_budget=key[2])
                env.reset(question_id=question)
        except Exception as exc:
            if env is not None and not reuse:
                close_env(env)
            if episode is not None:
                episodes.give_back(episode)
            episodes.close(handle)
            return {}, f'<div class="sqe-err-box">Cannot start an episode: {esc(exc)}</div>', "", ""
        if episode is not None:
            episodes.give_back(episode)
        if why is not None:
            return current, full_html(why), "", gr.skip()
        if reuse and not episode.closed:
            return current, episode_header(env), "", steps_table([])
        try:  # (a reused environment whose episode was closed meanwhile is kept again here)
            handle = episodes.open(env, key, session, client, replaces=handle)
        except PlayFull as full:  # taken since the check above: this page's own episode is gone, not another's
            close_env(env)
            return {}, full_html(full), "", ""
        return {"episode": handle}, episode_header(env), "", steps_table([])

    def step_episode(kind, arg, current):
        try:
            episode = episodes.take(_handle(current))
        except EpisodeBusy:
            return current, gr.skip(), busy_html, gr.skip()
        if episode is None:  # never started, or closed (idle, or its page gone)
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
    # No shared concurrency limit: each client is bounded by `slots` (Gradio's 40 worker threads bound them all).
    new_btn.click(new_episode, inputs=[dataset_dd, split_dd, question_dd, budget, state],
                  outputs=[state, header, observation, history], concurrency_limit=None)
    step_btn.click(do_step, inputs=[action, argument, state],
                   outputs=[state, header, observation, history], concurrency_limit=None)
    action.change(lambda k: gr.update(placeholder=PLACEHOLDERS.get(k, "")), inputs=[action], outputs=[argument])

    question_listing = picks.listing_holder()

    def on_load(name, split):
        # The question picked while this answer was on its way stays (`picks.keep_picks`), else random.
        choices, _ = question_choices(name, split, ctx.data_root)
        values = [c[1] if isinstance(c, tuple) else c for c in choices]
        return gr.update(choices=choices), picks.listing(values, RANDOM)

    return {"load": (on_load, [dataset_dd, split_dd], [question_dd, question_listing]),
            "then": lambda e: picks.keep_picks(e, [(question_dd, question_listing)]), "unload": close_play_episodes,
            "episodes": episodes}
