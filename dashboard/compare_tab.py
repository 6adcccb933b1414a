"""Compare tab: a run's random-baseline and trained-model transcripts on the same eval question, side by side,
and the summary table (success, reward, steps for random / base / trained) from comparison.jsonl."""

from __future__ import annotations

import html
import random
from typing import Any

import gradio as gr
import pandas as pd

from dashboard.context import AppContext
from dashboard.inputs import quote
from dashboard.transcripts import summary_rows, transcript_html

RANDOM = "random"
SUMMARY_HEADERS = ["policy", "success rate", "avg reward", "avg steps", "episodes"]
BASELINE_KEYS = ("random", "baseline", "random_transcript")
TRAINED_KEYS = ("trained", "model", "trained_transcript")


def pair_transcripts(pair: dict[str, Any]) -> tuple[dict | None, dict | None, dict | None]:
    """(random, trained, base) transcripts of a comparison pair record (nested under "transcripts" or not)."""
    source = pair.get("transcripts") if isinstance(pair.get("transcripts"), dict) else pair

    def pick(keys):
        return next((source[k] for k in keys if isinstance(source.get(k), dict)), None)

    return pick(BASELINE_KEYS), pick(TRAINED_KEYS), pick(("base", "base_model"))


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
    return f"{qid} — {text}" if text else qid


def runs_with_comparison(ctx: AppContext) -> list[str]:
    return [r["run_id"] for r in ctx.runs.list() if (ctx.runs.runs_root / r["run_id"] / "comparison.jsonl").exists()]


def build(ctx: AppContext) -> dict[str, Any]:
    gr.Markdown(
        "Random baseline vs trained model on the **same eval question with the same seed**, "
        "step by step. Pick a run that has finished its comparison, then a question (or *random*)."
    )
    with gr.Row():
        run_dd = gr.Dropdown([], label="Run", elem_id="compare-run", scale=3)
        question_dd = gr.Dropdown([RANDOM], value=RANDOM, label="Eval question", elem_id="compare-question", scale=4)
        show_btn = gr.Button("Show", variant="primary", elem_id="compare-show", scale=1)
        refresh_btn = gr.Button("Refresh runs", elem_id="compare-refresh", scale=1)
    note = gr.HTML("", elem_id="compare-note")
    summary = gr.Dataframe(
        pd.DataFrame(columns=SUMMARY_HEADERS), label="Summary on the eval questions", interactive=False,
        elem_id="compare-summary",
    )
    with gr.Row(equal_height=False):
        left = gr.HTML("", elem_id="compare-random")
        right = gr.HTML("", elem_id="compare-trained")

    def refresh_runs(current):
        names = runs_with_comparison(ctx)
        value = current if current in names else (names[0] if names else None)
        return gr.update(choices=names, value=value)

    def on_run(name):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            return gr.update(choices=[RANDOM], value=RANDOM), (f'<div class="sqe-muted">{html.escape(err or "")}</div>'), pd.DataFrame(columns=SUMMARY_HEADERS)
        pairs = snap.pairs
        name = (snap.config or {}).get("model") or snap.status.get("model")
        model = f" (model <code>{html.escape(str(name))}</code>)" if name else ""
        choices = [RANDOM] + [(pair_label(p, i), pair_question_id(p, i)) for i, p in enumerate(pairs)]
        if not pairs:
            msg = (
                f"Run <b>{html.escape(snap.run_id)}</b>{model} ({html.escape(snap.state)}) has no comparison yet: it is "
                "written when training ends."
            )
        else:
            msg = f"Run <b>{html.escape(snap.run_id)}</b>{model}: {len(pairs)} paired eval episodes."
        rows = summary_rows(snap.summary) if snap.summary else []
        return (
            gr.update(choices=choices, value=RANDOM),
            f'<div class="sqe-muted">{msg}</div>',
            pd.DataFrame(rows, columns=SUMMARY_HEADERS),
        )

    def show(name, question):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            return f'<div class="sqe-muted">{html.escape(err or "")}</div>', ""
        pairs = snap.pairs
        if not pairs:
            return '<div class="sqe-muted">No paired transcripts in this run.</div>', ""
        if question in (None, RANDOM):
            index = random.randrange(len(pairs))
        else:
            index = next((i for i, p in enumerate(pairs) if pair_question_id(p, i) == question), None)
            if index is None:
                return f'<div class="sqe-muted">Question {html.escape(quote(question))} is not in this run.</div>', ""
        baseline, trained, _ = pair_transcripts(pairs[index])
        return (
            transcript_html(baseline, title="Random baseline"),
            transcript_html(trained, title="Trained model"),
        )

    refresh_btn.click(refresh_runs, inputs=[run_dd], outputs=[run_dd])
    run_dd.change(on_run, inputs=[run_dd], outputs=[question_dd, note, summary]).then(
        show, inputs=[run_dd, question_dd], outputs=[left, right]
    )
    show_btn.click(show, inputs=[run_dd, question_dd], outputs=[left, right])
    question_dd.input(show, inputs=[run_dd, question_dd], outputs=[left, right])
    return {"load": (refresh_runs, [run_dd], [run_dd])}
