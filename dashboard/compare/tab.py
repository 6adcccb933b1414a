"""Compare tab: a run's transcripts on the same eval question, side by side: the random baseline, the model before
GRPO when the run played it (its warm start: the SFT model, or the base model), and the trained model; then its
tables: success and execution accuracy (95% intervals), reward and steps per policy, then per hardness and per
database. Columns can be added from saved evaluations (`python -m sqlenv eval --out runs/evaluations/<name>`)
and from other runs, scored on this run's eval questions (`dashboard.compare.added_columns`)."""

from __future__ import annotations

import html
import random
from typing import Any

import gradio as gr
import pandas as pd

from dashboard.access.inputs import quote
from dashboard.compare.added_columns import columns_for, source_choices
from dashboard.core import picks
from dashboard.core.context import AppContext
from dashboard.core.results import SUMMARY_HEADERS, breakdown_frame, pair_transcripts, summary_frame
from dashboard.core.run_notes import comparison_error, comparison_error_html, kept_html
from dashboard.core.transcripts import transcript_html

RANDOM = "random"
#: More than any comparison plays (a few hundred questions): a list of that many options renders at once.
MAX_QUESTIONS_LISTED = 10_000


def pair_question_id(pair: dict[str, Any], index: int) -> str:
    if pair.get("question_id"):
        return str(pair["question_id"])
    for transcript in pair_transcripts(pair):
        if transcript and transcript.get("question_id"):
            return str(transcript["question_id"])
    return f"pair {index + 1}"


def pair_label(pair: dict[str, Any], index: int) -> str:
    qid = pair_question_id(pair, index)
    text = next((t.get("question", "") for t in pair_transcripts(pair) if t), "")
    text = text if len(text) <= 70 else text[:67] + "…"
    return f"#{index + 1} {qid} — {text}" if text else f"#{index + 1} {qid}"


# A comparison draws its questions by seed, with replacement: 200 episodes on 1022 questions repeat about 20, so a
# question id names no single episode. The dropdown's values are episode positions instead.
EPISODE_PREFIX = "episode:"


def question_choices(pairs: list[dict[str, Any]]) -> list:
    """The question dropdown's choices: random, then every paired episode (label "#i question id — text")."""
    return [RANDOM] + [(pair_label(p, i), f"{EPISODE_PREFIX}{i}") for i, p in enumerate(pairs)]


def find_pair(pairs: list[dict[str, Any]], question: Any) -> int | None:
    """The index of the episode the page picked: `episode:<i>`, or (an API caller's) question id, first match."""
    if isinstance(question, str) and question.startswith(EPISODE_PREFIX):
        number = question[len(EPISODE_PREFIX):]
        if number.isascii() and number.isdigit() and len(number) <= 9 and int(number) < len(pairs):
            return int(number)
        return None
    return next((i for i, p in enumerate(pairs) if pair_question_id(p, i) == question), None)


def base_title(summary: dict[str, Any] | None) -> str:
    """The middle column's title: what the comparison calls the model before GRPO (`base_label`, e.g. "SFT
    warm-start (before GRPO)"), as the tables' `base: ...` column does."""
    label = (summary or {}).get("base_label")
    return str(label) if label else "Base model (before GRPO)"


def question_label(n_pairs: int) -> str:
    return f"Eval question ({n_pairs} paired)" if n_pairs else "Eval question"


def runs_with_comparison(ctx: AppContext) -> list[str]:
    return [r["run_id"] for r in ctx.runs.list() if (ctx.runs.runs_root / r["run_id"] / "comparison.jsonl").exists()]


def build(ctx: AppContext) -> dict[str, Any]:
    gr.Markdown(
        "Random baseline, the model before GRPO (its warm start, when the run played it) and the trained model on "
        "the **same eval question with the same seed**, step by step. Pick a run that has finished its comparison, "
        "then a question (or *random*). The tables give answer success and execution accuracy (EX: the last "
        "successful QUERY matches the gold query under the official Spider rules) with 95% intervals, per policy, "
        "per hardness and per database; add columns from saved evaluations "
        "(`python -m sqlenv eval ... --out runs/evaluations/<name>`) or other runs, scored on this run's questions."
    )
    with gr.Row():
        run_dd = gr.Dropdown([], label="Run", elem_id="compare-run", scale=3)
        # Every paired question listed at once: Gradio's default shows the first 100 and loads more only on
        # scrolling, which read as "100 of the 200 questions". (None would mean "all", but a None prop never reaches
        # the page, whose default is 100 again.)
        question_dd = gr.Dropdown([RANDOM], value=RANDOM, label=question_label(0), elem_id="compare-question", scale=4,
                                  num_choices_shown=MAX_QUESTIONS_LISTED)
        show_btn = gr.Button("Show", variant="primary", elem_id="compare-show", scale=1)
        refresh_btn = gr.Button("Refresh runs", elem_id="compare-refresh", scale=1)
    add_dd = gr.Dropdown([], multiselect=True, label="Add columns: saved evaluations and other runs, on this run's "
                         "eval questions", elem_id="compare-add")
    note = gr.HTML("", elem_id="compare-note")
    summary = gr.Dataframe(
        pd.DataFrame(columns=SUMMARY_HEADERS), label="Summary on the eval questions", interactive=False,
        elem_id="compare-summary",
    )
    with gr.Accordion("By hardness and by database (success and EX: rate [95% CI] (episodes))", open=True):
        by_hardness = gr.Dataframe(pd.DataFrame(columns=["hardness"]), label="By hardness", interactive=False,
                                   elem_id="compare-hardness", wrap=True)
        by_database = gr.Dataframe(pd.DataFrame(columns=["database"]), label="By database", interactive=False,
                                   elem_id="compare-database", wrap=True, max_height=360)
    with gr.Row(equal_height=False):
        left = gr.HTML("", elem_id="compare-random")
        # The model before GRPO: shown only for runs that played it (`compare_base`), so two columns otherwise.
        middle = gr.HTML("", elem_id="compare-warm-start", visible=False)
        right = gr.HTML("", elem_id="compare-trained")

    run_listing, add_listing = picks.listing_holder(), picks.listing_holder()

    def refresh_runs(current, added):
        # The values are set in the page when this answer arrives (`picks.keep_picks`): `current` may be stale.
        names = runs_with_comparison(ctx)
        default = next(iter(names), None)
        choices = source_choices(ctx.runs, exclude=current if current in names else default)
        return (gr.update(choices=names), gr.update(choices=choices), picks.listing(names, default),
                picks.listing([c[1] for c in choices]))

    def empty_tables():
        return (pd.DataFrame(columns=SUMMARY_HEADERS), pd.DataFrame(columns=["hardness"]),
                pd.DataFrame(columns=["database"]))

    def tables(snap, added):
        columns, problems = columns_for(ctx.runs, snap, added)
        notes = "".join(f'<div class="sqe-err-box">{html.escape(p)}</div>' for p in problems)
        if not columns:
            return (notes, *empty_tables())
        return (notes, summary_frame(columns), breakdown_frame(columns, "hardness"),
                breakdown_frame(columns, "database"))

    def on_run(name, added):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            return (gr.update(choices=[RANDOM], value=RANDOM, label=question_label(0)),
                    f'<div class="sqe-muted">{html.escape(err or "")}</div>', *empty_tables())
        pairs = snap.pairs
        name = (snap.config or {}).get("model") or snap.status.get("model")
        model = f" (model <code>{html.escape(str(name))}</code>)" if name else ""
        choices = question_choices(pairs)
        if not pairs and comparison_error(snap) is not None:
            msg = (f"Run <b>{html.escape(snap.run_id)}</b>{model} ({html.escape(snap.state)}): its final comparison "
                   "failed.")
        elif not pairs:
            msg = (
                f"Run <b>{html.escape(snap.run_id)}</b>{model} ({html.escape(snap.state)}) has no comparison yet: it is "
                "written when training ends."
            )
        else:
            msg = f"Run <b>{html.escape(snap.run_id)}</b>{model}: {len(pairs)} paired eval episodes."
        problems, *frames = tables(snap, added)
        notes = comparison_error_html(snap) + kept_html(snap, "compare-kept")
        return (gr.update(choices=choices, value=RANDOM, label=question_label(len(pairs))),
                f'<div class="sqe-muted">{msg}</div>{notes}{problems}', *frames)

    def on_added(name, added):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            return (f'<div class="sqe-muted">{html.escape(err or "")}</div>', *empty_tables())
        problems, *frames = tables(snap, added)
        return (f'<div class="sqe-muted">Run <b>{html.escape(snap.run_id)}</b>: {len(snap.pairs)} paired eval '
                f"episodes.</div>{problems}", *frames)

    def show(name, question):
        hidden = gr.update(value="", visible=False)
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            return f'<div class="sqe-muted">{html.escape(err or "")}</div>', hidden, ""
        pairs = snap.pairs
        if not pairs:
            return '<div class="sqe-muted">No paired transcripts in this run.</div>', hidden, ""
        if question in (None, RANDOM):
            index = random.randrange(len(pairs))
        else:
            index = find_pair(pairs, question)
            if index is None:
                return (f'<div class="sqe-muted">Question {html.escape(quote(question))} is not in this run.</div>',
                        hidden, "")
        baseline, trained, base = pair_transcripts(pairs[index])
        three = base is not None  # three columns side by side: each transcript in its compact layout
        middle_update = (gr.update(value=transcript_html(base, title=base_title(snap.summary), compact=True),
                                   visible=True) if three else hidden)
        return (
            transcript_html(baseline, title="Random baseline", compact=three),
            middle_update,
            transcript_html(trained, title="Trained model", compact=three),
        )

    refresh_outputs = [run_dd, add_dd, run_listing, add_listing]
    picked = [(run_dd, run_listing), (add_dd, add_listing)]
    picks.keep_picks(refresh_btn.click(refresh_runs, inputs=[run_dd, add_dd], outputs=refresh_outputs), picked)
    table_outputs = [summary, by_hardness, by_database]
    run_dd.change(on_run, inputs=[run_dd, add_dd], outputs=[question_dd, note, *table_outputs]).then(
        show, inputs=[run_dd, question_dd], outputs=[left, middle, right]
    )
    add_dd.input(on_added, inputs=[run_dd, add_dd], outputs=[note, *table_outputs])
    show_btn.click(show, inputs=[run_dd, question_dd], outputs=[left, middle, right])
    question_dd.input(show, inputs=[run_dd, question_dd], outputs=[left, middle, right])
    return {"load": (refresh_runs, [run_dd, add_dd], refresh_outputs), "then": lambda e: picks.keep_picks(e, picked)}
