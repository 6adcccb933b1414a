"""The Runs tab's Resume button: continues a stopped, failed or interrupted run from its last checkpoint in the
dashboard's training process (`dashboard.core.runner.TrainingRunner.resume`); owner-only (`dashboard.access.owner`).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from dashboard.core.context import AppContext
from dashboard.core.runner import RunnerBusy
from dashboard.core.transcripts import esc
from training.run.directory import RESUMABLE_STATUSES

__all__ = ["resumable", "resume_controls"]


def resumable(snap) -> bool:
    """Whether `python -m training.train --resume` (and the runner) would take the run: stopped, failed or
    interrupted (`training.run.directory.RESUMABLE_STATUSES`), with its config.json to resume from."""
    return snap is not None and snap.state in RESUMABLE_STATUSES and snap.config is not None


def resume_controls(ctx: AppContext, pick: Any) -> tuple[Any, Any]:
    """A Resume button for the picked run: continues a stopped, failed or interrupted run from its last checkpoint
    in the dashboard's training process (the Train tab then shows it). Shown only while the picked run is resumable
    (`resumable`: a completed run has nothing to resume); the runner refuses the others anyway. Owner-only: it
    spends compute and writes. Returns (button, message) for the run picker to update."""
    with gr.Row():
        resume_btn = gr.Button("Resume this run", elem_id="runs-resume", scale=0, min_width=200, visible=False)
        resume_message = gr.HTML("", elem_id="runs-resume-message")

    def resume(name):
        if not name:
            return '<div class="sqe-err-box">Pick a run first.</div>', gr.skip()
        try:
            run_id = ctx.runner.resume(name)
        except (RunnerBusy, ValueError, FileNotFoundError) as exc:  # InvalidRunName is a ValueError
            return f'<div class="sqe-err-box">{esc(str(exc))}</div>', gr.skip()
        # The run is training again, so no longer resumable: the button goes until a run picked is.
        return (f'<div class="sqe-ok-box">Resuming <b>{esc(run_id)}</b> from its last checkpoint: follow it in the '
                "Train tab.</div>", gr.update(visible=False))

    # Spends compute and writes files: owner-only (dashboard.access.owner), checked on the server for every call.
    ctx.owner.control(resume_btn)
    ctx.owner.owner_event(resume_btn.click, resume, inputs=[pick], outputs=[resume_message, resume_btn],
                          show_progress="hidden", action="resume a run")
    return resume_btn, resume_message
