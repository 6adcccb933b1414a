"""The dashboard's look, in one place: its CSS (the page's frame, transcripts, status boxes, tables) and its Gradio
theme. Classes are prefixed `sqe-`; `dashboard.core.transcripts` and the tabs write HTML that uses them.
"""

from __future__ import annotations

import gradio as gr

__all__ = ["CSS", "THEME"]

CSS = """
.sqe-card { border: 1px solid #e2e8f0; border-radius: 10px; padding: 12px 14px; background: #fff; }
.sqe-title { font-weight: 700; font-size: 1.05em; margin-bottom: 6px; }
.sqe-question { font-size: 1.05em; font-weight: 600; color: #1e293b; margin-bottom: 2px; }
.sqe-meta, .sqe-muted { color: #64748b; font-size: 0.88em; }
.sqe-steps { width: 100%; border-collapse: collapse; margin: 8px 0; font-size: 0.86em; table-layout: fixed; }
.sqe-steps th { text-align: left; color: #475569; font-weight: 600; padding: 4px; }
.sqe-steps th:nth-child(1) { width: 2.2em; }
.sqe-steps th:nth-child(5) { width: 2.8em; }
.sqe-steps th:nth-child(2) { width: 34%; }
.sqe-steps th:nth-child(4) { width: 9.5em; }
.sqe-arg { margin-top: 3px !important; color: #0f172a; }
.sqe-rew .sqe-chip { display: block; width: fit-content; }
table.sqe-steps, .sqe-steps tr { border: 0 !important; }
.sqe-steps td { border-bottom: 1px solid #eef2f7 !important; }
.sqe-steps th { border-bottom: 2px solid #e2e8f0 !important; }
.sqe-steps th, .sqe-steps td { border-left: 0 !important; border-right: 0 !important; border-top: 0 !important; }
.sqe-steps td { vertical-align: top; padding: 4px; }
.sqe-steps pre, .sqe-inline { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: 0.92em;
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace; background: none; padding: 0; border: 0; }
.sqe-obs { max-height: 11em; overflow: auto; color: #334155; }
.sqe-err { color: #b91c1c; }
.sqe-n { text-align: center; color: #64748b; }
.sqe-act { display: inline-block; padding: 1px 6px; border-radius: 5px; font-weight: 700; font-size: 0.85em;
  background: #e0e7ff; color: #3730a3; }
.sqe-act-query { background: #dcfce7; color: #166534; }
.sqe-act-answer { background: #fef3c7; color: #92400e; }
.sqe-act-sample { background: #e0f2fe; color: #075985; }
.sqe-chip { display: inline-block; margin: 1px 3px 1px 0; padding: 0 5px; border-radius: 4px;
  background: #f1f5f9; font-family: ui-monospace, monospace; font-size: 0.86em; }
.sqe-zero { color: #94a3b8; }
.sqe-total { font-family: ui-monospace, monospace; font-weight: 700; font-size: 0.9em; }
/* Compact transcripts: three side by side (Compare: random, warm start, trained) leave each about 370 px, where the
   wide layout's fixed columns squeezed the observations to a word per line. (Gradio drops @container rules from
   custom CSS, so the page asks for this layout by class.) */
.sqe-compact .sqe-steps { font-size: 0.8em; }
.sqe-compact .sqe-steps th:nth-child(1) { width: 1.6em; }
.sqe-compact .sqe-steps th:nth-child(2) { width: 30%; }
.sqe-compact .sqe-steps th:nth-child(4) { width: 6.8em; }
.sqe-compact .sqe-steps th:nth-child(5) { width: 2.2em; }
.sqe-compact .sqe-chip { padding: 0 3px; white-space: nowrap; font-size: 0.8em; }
.sqe-badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 0.8em; font-weight: 700; }
.sqe-ok { background: #dcfce7; color: #166534; }
.sqe-bad { background: #fee2e2; color: #991b1b; }
.sqe-warn { background: #fef3c7; color: #92400e; }
.sqe-verdict { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center; padding: 6px 0;
  border-top: 1px solid #e2e8f0; }
.sqe-gold { background: #f8fafc; border-radius: 8px; padding: 6px 10px; margin-top: 4px; font-size: 0.9em; }
.sqe-gold > div { display: flex; gap: 8px; align-items: baseline; }
.sqe-status { font-size: 0.95em; display: flex; flex-direction: column; gap: 6px; }
.sqe-progress { height: 8px; background: #e2e8f0; border-radius: 999px; overflow: hidden; }
.sqe-progress > div { height: 100%; background: linear-gradient(90deg, #6366f1, #4f46e5); }
.sqe-err-box { color: #991b1b; background: #fef2f2; border: 1px solid #fecaca; border-radius: 8px;
  padding: 6px 10px; }
.sqe-invalid { outline: 2px solid #dc2626 !important; outline-offset: -2px; border-radius: 6px; }
.sqe-invalid [data-testid="block-info"] { color: #b91c1c !important; }
/* Table headers wrap between words only: Gradio's break-word lets the auto layout squeeze a column below its
   longest header word ("hardnes / s" over short cells like "all"); with normal wrapping that word is the minimum. */
.table-wrap .header-cell span.wrap { overflow-wrap: normal !important; word-break: normal !important; }
.sqe-ok-box { color: #166534; background: #f0fdf4; border: 1px solid #bbf7d0; border-radius: 8px;
  padding: 6px 10px; }
.sqe-warn-box { color: #92400e; background: #fffbeb; border: 1px solid #fde68a; border-radius: 8px;
  padding: 6px 10px; }

.gradio-container { max-width: 1500px !important; }
#sqe-header h1 { margin-bottom: 0; }
#sqe-header p { margin-top: 2px; color: #64748b; }
#owner-bar { align-items: center; }
"""


# System fonts only: the app must look right offline (no Google Fonts request).
# Gradio paints a hovered primary button and a disabled one with the same "hover" fill, which Soft makes a pale
# indigo: Start under a resting pointer (where it stays after a click, through the whole run) looked disabled, and
# a reload, which drops the hover, "fixed" it. A darker hover fill reads as hover; disabled keeps Gradio's grey-out.
THEME = gr.themes.Soft(
    primary_hue="indigo",
    font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
).set(button_primary_background_fill_hover="*primary_600", button_primary_background_fill_hover_dark="*primary_700")
