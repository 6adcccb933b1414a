"""A plotly chart that updates in place: the Train tab's live charts.

`gr.Plot` re-creates its chart on every new value: Gradio's frontend keys the plot on the value, so each update
tears the old chart down and draws a fresh one (twice: `Plotly.react` on mount, again as its props settle),
modebar and all. With three charts refreshed every GRPO step that was most of the browser's CPU while a page
watched a run (bench/serving/dashboard_tax.py), on the same cores as the training. A `LivePlot` is a `gr.HTML` whose
template is one empty div that never changes; its `js_on_load` draws the figure with `Plotly.react` and
redraws it in place when the value (the figure's JSON) changes, which plotly does incrementally. Zoom and
hidden legend items survive updates (`uirevision`).

Plotly itself comes from the `plotly` package's bundled `plotly.min.js`, served by the app (`allowed_paths`),
so the page works offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from dashboard.core.charts import CHART_HEIGHT, Figure


def plotly_js_path() -> Path | None:
    """The plotly.js bundle shipped inside the `plotly` Python package (None when it is not installed)."""
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def _head() -> str | None:
    path = plotly_js_path()
    return f'<script src="/gradio_api/file={path}"></script>' if path else None


# Runs once per chart when it mounts; `watch` calls `draw` again whenever the value changes. The plotly used is
# pinned on first use so a second copy loaded later (gr.Plot's, on another tab) never touches these charts.
_JS = """
const draw = () => {
  const P = window.__sqePlotly || (window.__sqePlotly = window.Plotly);
  const div = element.querySelector('.sqe-live-plot');
  if (!P || !div || !props.value) return;
  let fig;
  try { fig = JSON.parse(props.value); } catch (e) { return; }
  const layout = Object.assign({}, fig.layout, {autosize: true, uirevision: 'live'});
  P.react(div, fig.data || [], layout, Object.assign({responsive: true, displaylogo: false}, fig.config || {}));
};
draw();
watch('value', draw);
"""


def live_value(fig: Figure) -> str:
    """A figure as a LivePlot value (its JSON)."""
    return json.dumps(fig, allow_nan=False, default=str)


def LivePlot(fig: Figure, elem_id: str) -> gr.HTML:  # noqa: N802 - a component constructor
    """A chart drawn from `fig` that updates in place when an event returns `live_value(new_fig)`."""
    return gr.HTML(
        live_value(fig),
        html_template='<div class="sqe-live-plot"></div>',
        js_on_load=_JS,
        head=_head(),
        elem_id=elem_id,
        min_height=CHART_HEIGHT,
        padding=False,
    )
