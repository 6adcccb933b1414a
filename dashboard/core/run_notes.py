"""What the Runs tab and Compare say of a run beside its figures: which weights it kept and why
(`training.run.kept_weights`), and a final comparison that failed (a crash is an error, never a 0% column).

Each note is one HTML block with an id and data-* attributes the browser tests read, or "" when there is nothing
to say.
"""

from __future__ import annotations

import html
from typing import Any

from training.run.kept_weights import kept_weights
from training.run.directory import FINISHED_STATUSES, INTERRUPTED

__all__ = ["kept_html", "comparison_error", "comparison_error_html"]


def kept_html(snap: Any, elem_id: str) -> str:
    """Which weights the run kept and why: what its final comparison played (the summary's `trained_weights`),
    else keep_best's choice in status.json (so far, while the run trains). `data-kept` is start, best or last."""
    played = kept_weights((snap.summary or {}).get("trained_weights"))
    kept = played or kept_weights(snap.status.get("keep_best"))
    if kept is None:
        return ""
    final = played is not None or snap.state in (*FINISHED_STATUSES, INTERRUPTED)
    also = " The final comparison's trained model plays these weights." if played is not None else ""
    return (f'<div id="{html.escape(elem_id)}" class="sqe-meta" data-kept="{html.escape(kept.kept)}" '
            f'data-kept-step="{kept.step if kept.step is not None else ""}">'
            f"{html.escape(kept.text(final))}{also}</div>")


def comparison_error(snap: Any) -> str | None:
    """The error of a final comparison that failed (`{"kind": "error"}` in comparison.jsonl), or None."""
    failed = next((r for r in reversed(snap.comparison) if isinstance(r, dict) and r.get("kind") == "error"), None)
    if failed is None:
        return None
    return str(failed.get("error") or "unknown error")


def comparison_error_html(snap: Any) -> str:
    """The failed comparison's error as an error box (`#compare-error`), or ""."""
    error = comparison_error(snap)
    if error is None:
        return ""
    return (f'<div class="sqe-err-box" id="compare-error">The final comparison failed: {html.escape(error)} '
            "(its episodes are not scored: a crash is not a 0% success).</div>")
