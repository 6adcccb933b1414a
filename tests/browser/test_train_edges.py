"""The Train tab's rough edges, in a real browser: a run with every phase (warm start, base eval, GRPO, final
eval) on a tiny config, watched from Start to the end.

The status bar names the phase that runs (never "GRPO step 0" through the warm start) and its remaining time; the
learning-signal chart gives each phase its own step axis with readable log ticks and a legend clear of the axis
titles; the success chart says how many episodes an eval plays; Start is usable again once the run ends; the
model picker's entries are readable whole; a known dataset that is not prepared names the command that prepares
it. One app server (its own runs and data) for the module; screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import json
import re

import pytest

from app_server import serve  # tests/, the root conftest's folder, is on sys.path

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Every phase, each short: a 100-step warm start (SFT steps take milliseconds; long enough for the page to show it
# running, and its loss falls from ~7 to ~1, so the log axis spans a decade) with an eval every 50 steps, 2-episode
# base and final evals, 4 GRPO steps on 3-action episodes with an eval of 2 episodes every 2 steps. (300 steps cost
# the training child ~25 CPU-seconds more and checked nothing more.)
EDGE_CONFIG = {
    "model": "builtin:tiny", "dataset": "builtin", "step_budget": 3, "num_generations": 2,
    "per_device_train_batch_size": 2, "max_steps": 4, "max_completion_length": 48, "max_turn_tokens": 16,
    "plot_every": 1, "trace_every": 2, "eval_every": 2, "eval_episodes": 2, "comparison_episodes": 2,
    "compare_base": True, "device": "cpu", "cpu_threads": 1,
    "sft": {"enabled": True, "max_steps": 100, "batch_size": 4, "eval_every": 50},
}


@pytest.fixture(scope="module")
def app(chromium_path):
    pytest.importorskip("playwright.sync_api")
    with serve(config=EDGE_CONFIG, log_name="train-edges") as server:
        yield server


def _status(page, name: str) -> str:
    return page.locator("#train-status").get_attribute(f"data-{name}") or ""


def _tick_labels(page, chart: str, axis_class: str) -> list[str]:
    """The tick labels plotly drew for one axis (`ytick`, `y2tick`, ...) of the chart in `#chart`."""
    return page.evaluate(
        "([chart, cls]) => [...document.querySelectorAll(`#${chart} g.${cls} text`)].map(t => t.textContent)",
        [chart, axis_class])


def _boxes_overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def test_a_run_from_start_to_end(app, page, screenshot):
    page.goto(app["url"])
    page.locator("#train-start").click()
    page.wait_for_function("() => document.querySelector('#train-form-message')?.dataset.kind === 'ok'")
    page.wait_for_function("() => document.querySelector('#train-status')?.dataset.run.startsWith('run-')")
    run_id = _status(page, "run")

    # The warm start: the status bar says so, with its own steps, and never "GRPO step 0".
    page.wait_for_function(
        "() => document.querySelector('#train-phases [data-phase=sft]')?.dataset.state === 'current' &&"
        " /warm start \\(SFT\\) step [1-9]/.test(document.querySelector('#train-progress-text')?.innerText)",
        timeout=180_000)
    text = page.locator("#train-progress-text").inner_text()
    assert "GRPO step 0" not in text and "phase 2 of 5" in text, text
    phases = page.locator("#train-phases").inner_text()
    assert re.search(r"load model.*warm start \(SFT, 100 steps\).*base eval \(2 episodes\).*GRPO \(4 steps\).*"
                     r"final eval \(2 episodes\)", phases), phases
    assert page.locator("#train-phases [data-phase='loading model']").get_attribute("data-state") == "done"
    screenshot(page, "train_edges_warm_start")

    # GRPO: its own panel and step axis in the learning-signal chart, beside the warm start's.
    page.wait_for_function("() => document.querySelector('#train-status')?.dataset.plottedPhase === 'grpo'",
                           timeout=300_000)
    page.wait_for_function(
        "() => (document.querySelector('#chart-reward .js-plotly-plot')?.data || [])"
        ".some(t => t.name === 'reward (mean)' && t.xaxis === 'x2')")
    titles = page.evaluate("() => [...document.querySelectorAll('#chart-reward .g-xtitle text, "
                           "#chart-reward .g-x2title text')].map(t => t.textContent)")
    assert titles == ["warm start (SFT) step", "GRPO step"], titles
    # The loss axis reads as numbers in order (not plotly's bare "10 5 2 1 5 2 0.1 5").
    loss_ticks = _tick_labels(page, "chart-reward", "ytick")
    values = [float(t) for t in loss_ticks]
    assert len(values) >= 2 and values == sorted(values) and len(set(values)) == len(values), loss_ticks
    screenshot(page, "train_edges_grpo")
    # No x-axis title runs into the legend, in any Train-tab chart, and the legend is not cut off at the bottom:
    # measured in one script, so that a chart redrawn meanwhile cannot be half read.
    boxes = page.evaluate("""() => ['chart-reward', 'chart-success', 'chart-health'].map(id => {
        const box = e => {
            const r = e.getBoundingClientRect();
            return {x: r.x, y: r.y, width: r.width, height: r.height};
        };
        const chart = document.querySelector('#' + id);
        const titles = chart.querySelectorAll('.g-xtitle text, .g-x2title text');
        return {id, legend: box(chart.querySelector('g.legend')), svg: box(chart.querySelector('svg.main-svg')),
                titles: [...titles].map(t => [t.textContent, box(t)])};
    })""")
    for chart in boxes:
        for text, title in chart["titles"]:
            assert not _boxes_overlap(title, chart["legend"]), (chart["id"], text, title, chart["legend"])
        legend, svg = chart["legend"], chart["svg"]
        assert legend["y"] + legend["height"] <= svg["y"] + svg["height"] + 1, (chart["id"], legend, svg)

    # The run ends: every phase ticked, and Start usable (and looking it) without a reload.
    page.wait_for_function("() => document.querySelector('#train-status')?.dataset.status === 'completed'",
                           timeout=300_000)
    page.wait_for_function("() => [...document.querySelectorAll('#train-phases [data-phase]')]"
                           ".every(p => p.dataset.state === 'done')")
    # The evals say their size: the success chart's legend and the status bar's phases.
    legend = page.locator("#chart-success g.legend").text_content()
    assert "eval split (2 episodes)" in legend and "train split (2 episodes)" in legend, legend
    start = page.locator("#train-start")
    assert start.is_enabled()
    # The pointer still rests on Start, where it clicked: hovered, it must not look like Gradio's disabled button
    # (which shares the hover fill, under a grey-out): not paler than at rest, fully opaque.
    start.hover()
    page.wait_for_timeout(400)  # the theme's 0.2 s transition
    hovered = _look(page)
    page.mouse.move(5, 5)
    page.wait_for_timeout(400)
    resting = _look(page)
    assert hovered["opacity"] == resting["opacity"] == 1.0 and hovered["cursor"] == "pointer", (hovered, resting)
    assert hovered["luminance"] <= resting["luminance"], (hovered, resting)
    screenshot(page, "train_edges_completed")
    start.click()  # and it starts another run
    page.wait_for_function(
        f"() => document.querySelector('#train-status')?.dataset.run !== '{run_id}' &&"
        " document.querySelector('#train-status')?.dataset.run !== ''")
    page.locator("#train-stop").click()
    page.wait_for_function(
        "() => ['stopped', 'completed', 'failed'].includes(document.querySelector('#train-status')?.dataset.status)",
        timeout=180_000)
    page.wait_for_function("() => !document.querySelector('#train-start').disabled")
    # A run stopped early marks the phase it ended in, and does not tick the phases it never ran.
    if _status(page, "status") == "stopped":
        page.wait_for_function("() => document.querySelector('#train-phases [data-state=ended]') !== null")
        assert page.locator("#train-phases [data-phase=comparison]").get_attribute("data-state") != "done" or \
            page.locator("#train-phases [data-phase=grpo]").get_attribute("data-state") == "ended"
    screenshot(page, "train_edges_stopped")
    status = json.loads((app["runs"] / run_id / "status.json").read_text())
    assert status["status"] == "completed"


def _look(page) -> dict:
    """Start's opacity, cursor and background luminance (0 black .. 1 white), as the browser paints it."""
    return page.evaluate("""() => {
        const s = getComputedStyle(document.querySelector('#train-start'));
        const [r, g, b] = s.backgroundColor.match(/[0-9.]+/g).map(Number);
        return {opacity: +s.opacity, cursor: s.cursor, luminance: (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255};
    }""")


def test_model_picker_entries_are_readable_whole(app, page, screenshot):
    page.goto(app["url"])
    box = page.locator("#cfg-model input")
    box.click()
    page.locator("#cfg-model [role=option]").first.wait_for()
    # Neither cut short nor wrapped onto a second line: every entry as tall as the shortest one's single line.
    clipped = page.evaluate("""() => {
        const options = [...document.querySelectorAll('#cfg-model [role=option]')];
        const line = Math.min(...options.map(o => o.getBoundingClientRect().height));
        return options.filter(o => o.getBoundingClientRect().height > line + 1 || o.scrollWidth > o.clientWidth + 1 ||
            [...o.querySelectorAll('*')].some(c => c.scrollWidth > c.clientWidth + 1)).map(o => o.innerText);
    }""")
    assert clipped == []
    screenshot(page, "train_edges_model_list")
    for option in page.locator("#cfg-model [role=option]").all_inner_texts():
        box.click()
        box.fill(option.strip()[:12])
        page.locator(f'#cfg-model [role=option][aria-label="{option.strip()}"]').click()
        # The chosen entry shows whole in the box itself.
        assert page.evaluate("() => { const i = document.querySelector('#cfg-model input');"
                             " return i.scrollWidth <= i.clientWidth + 1; }"), option


def test_an_unprepared_dataset_names_the_command_that_prepares_it(app, page):
    page.goto(app["url"])
    box = page.locator("#cfg-dataset input")
    box.fill("spider_dev")
    box.press("Enter")
    page.locator("#train-start").click()
    page.wait_for_function("() => document.querySelector('#train-form-message')?.dataset.kind === 'error'")
    message = page.locator("#train-form-message").inner_text()
    assert "python -m sqlenv data prepare spider --preset spider_dev" in message, message
