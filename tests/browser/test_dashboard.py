"""The dashboard in a real browser: train live, reattach after reload, stop, compare, browse runs, play.

One app server and one Chromium for the module; the tests run in file order (training first, so Compare and
Runs can open the run it made). Screenshots go to artifacts/screenshots/ (gitignored).
"""

from __future__ import annotations

import json
import re

import pytest

from health_records import write_grpo_run  # tests/, the root conftest's folder, is on sys.path
from page_actions import open_tab, pick
from training.run.directory import RunDir

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_ID = re.compile(r"^run-")


def status_attr(page, name: str) -> str:
    return page.locator("#train-status").get_attribute(name) or ""


def plotted_points(page, elem_id: str) -> int:
    """Number of x values in the plotly traces drawn inside `#elem_id` (0 when nothing is plotted yet)."""
    return page.evaluate(
        """(id) => {
            const plot = document.querySelector('#' + id + ' .js-plotly-plot');
            if (!plot || !plot.data) return 0;
            return plot.data.filter(t => t.name === 'reward (mean)').reduce((n, t) => n + (t.x ? t.x.length : 0), 0);
        }""",
        elem_id,
    )


# ----------------------------------------------------------------------------------------------- Train
def test_invalid_form_value_names_the_field(dashboard, page, screenshot):
    page.goto(dashboard["url"])
    page.locator("#cfg-learning_rate textarea, #cfg-learning_rate input").first.fill("fast please")
    page.locator("#train-start").click()
    message = page.locator("#train-form-message")
    message.wait_for()
    assert message.get_attribute("data-kind") == "error"
    assert "Learning rate" in message.inner_text() and "learning_rate" in message.inner_text()
    # Invalid per TrainConfig itself (num_generations < 2): its message, pointed at the field.
    page.locator("#cfg-learning_rate textarea, #cfg-learning_rate input").first.fill("")
    page.locator("#cfg-num_generations input").fill("1")
    page.locator("#train-start").click()
    page.wait_for_function(
        "() => (document.querySelector('#train-form-message')||{}).innerText?.includes('num_generations')"
    )
    assert "sqe-invalid" in (page.locator("#cfg-num_generations").get_attribute("class") or "")
    assert "sqe-invalid" not in (page.locator("#cfg-learning_rate").get_attribute("class") or "")
    assert status_attr(page, "data-status") == "none"  # nothing started
    screenshot(page, "train_invalid_field")


def test_train_live_reload_reattach_and_stop(dashboard, browser, page, screenshot):
    page.goto(dashboard["url"])
    page.locator("#train-start").click()
    page.wait_for_function("() => document.querySelector('#train-form-message')?.dataset.kind === 'ok'")
    run_id = page.locator("#train-status").get_attribute("data-run")
    assert RUN_ID.match(run_id), run_id

    # The reward chart gains points while the run trains (SFT warm-start first, then GRPO steps).
    page.wait_for_function(
        "() => +(document.querySelector('#train-status')?.dataset.plottedStep || 0) >= 1", timeout=180_000
    )
    first = plotted_points(page, "chart-reward")
    assert first >= 1
    page.wait_for_function(
        f"() => +(document.querySelector('#train-status')?.dataset.plottedStep || 0) >= "
        f"{int(status_attr(page, 'data-plotted-step')) + 2}",
        timeout=120_000,
    )
    assert plotted_points(page, "chart-reward") > first
    screenshot(page, "train_live")

    # A second Start is refused and names the active run.
    page.locator("#train-start").click()
    page.wait_for_function(
        f"() => {{ const m = document.querySelector('#train-form-message');"
        f" return m?.dataset.kind === 'error' && m.innerText.includes('{run_id}'); }}"
    )
    assert "still training" in page.locator("#train-form-message").inner_text()

    # Reload: the page holds no state, it reattaches to the live run and keeps plotting.
    page.reload()
    page.wait_for_function(f"() => document.querySelector('#train-status')?.dataset.run === '{run_id}'")
    assert status_attr(page, "data-status") == "running"
    page.wait_for_function("() => +(document.querySelector('#train-status')?.dataset.plottedStep || 0) >= 1")
    # Plotly draws after the status bar updates: wait for the drawn trace, then check it.
    page.wait_for_function(
        "() => (document.querySelector('#chart-reward .js-plotly-plot')?.data || [])"
        ".some(t => t.name === 'reward (mean)' && t.x && t.x.length >= 1)"
    )
    assert plotted_points(page, "chart-reward") >= 1

    # A second browser (fresh context = another person) sees the same run.
    other = browser.new_context(viewport={"width": 1200, "height": 900}).new_page()
    other.goto(dashboard["url"])
    other.wait_for_function(f"() => document.querySelector('#train-status')?.dataset.run === '{run_id}'")
    other.context.close()

    # Stop: the run ends within a step, is marked stopped, and the status says so.
    page.locator("#train-stop").click()
    page.wait_for_function(
        "() => ['stopped', 'completed'].includes(document.querySelector('#train-status')?.dataset.status)",
        timeout=120_000,
    )
    # After the weights are saved the stopped run still plays a short random-vs-trained comparison.
    page.wait_for_function("() => document.querySelector('#train-status')?.dataset.phase === 'done'",
                           timeout=120_000)
    status = json.loads((dashboard["runs"] / run_id / "status.json").read_text())
    assert status["status"] == "stopped", status
    assert (dashboard["runs"] / run_id / "final").is_dir()
    screenshot(page, "train_stopped")
    dashboard["run_id"] = run_id


# ------------------------------------------------------------------------------------------------ Play
def gold_question(data_dir, split="eval"):
    """A question and its gold, read from the dataset's own files (the way a person would look it up)."""
    questions = json.loads((data_dir / "builtin" / f"questions_{split}.json").read_text())
    return next(q for q in questions if q["answer_type"] == "integer" and "JOIN" not in q["gold_sql"].upper())


def play_step(page, action: str, argument: str) -> None:
    before = page.locator("#play-budget").get_attribute("data-budget")
    page.locator("#play-action").get_by_label(action, exact=True).check()
    page.locator("#play-argument textarea").fill(argument)
    page.locator("#play-step").click()
    page.wait_for_function(
        f"() => document.querySelector('#play-budget')?.dataset.budget !== '{before}'"
    )


def test_play_an_episode_to_a_correct_answer(dashboard, page, screenshot):
    from sqlenv.scoring.verifier import format_answer

    page.goto(dashboard["url"])
    open_tab(page, "Play")
    q = gold_question(dashboard["data"])
    pick(page, "play-question-pick", q["question_id"] + " —")
    page.locator("#play-new").click()
    page.locator("#play-question").wait_for()
    assert q["question_text"] in page.locator("#play-question").inner_text()

    # Bad input shows the environment's own error, costs a step, and the episode goes on.
    play_step(page, "QUERY", "SELEC nonsense FROM nowhere")
    assert page.locator("#play-observation .sqe-err").count() == 1
    play_step(page, "DESCRIBE", "")
    assert "DESCRIBE needs a table name" in page.locator("#play-observation").inner_text()

    table = q["tables_involved"][0]
    play_step(page, "DESCRIBE", table)
    assert table in page.locator("#play-question .sqe-schema").inner_text()
    play_step(page, "QUERY", q["gold_sql"])
    obs = page.locator("#play-observation").inner_text()
    assert "prog" in obs  # the step reward shows its layers
    play_step(page, "ANSWER", format_answer(q["gold_answer"], q["answer_type"]))
    verdict = page.locator("#play-verdict")
    verdict.wait_for()
    assert verdict.get_attribute("data-outcome") == "correct"
    assert q["gold_sql"].split()[0] in page.locator("#play-gold-sql").inner_text()
    assert page.locator("#play-budget").get_attribute("data-budget") == "10"  # 15 - 5 steps
    screenshot(page, "play_correct")


def test_play_sessions_are_separate(dashboard, browser):
    """Two people playing at once never see each other's episode."""
    pages = [browser.new_context(viewport={"width": 1280, "height": 900}).new_page() for _ in range(2)]
    try:
        for p in pages:
            p.goto(dashboard["url"])
            open_tab(p, "Play")
            p.locator("#play-new").click()
            p.locator("#play-question").wait_for()
        play_step(pages[0], "SAMPLE", "nonexistent_table")
        assert pages[1].locator("#play-budget").get_attribute("data-budget") == "15"
        assert pages[0].locator("#play-budget").get_attribute("data-budget") == "14"
    finally:
        for p in pages:
            p.context.close()


def test_compare_shows_random_vs_trained_for_the_run(dashboard, page, screenshot):
    run_id = dashboard.get("run_id")
    if not run_id:
        pytest.skip("needs the run of test_train_live_reload_reattach_and_stop")
    page.goto(dashboard["url"])
    open_tab(page, "Compare")
    pick(page, "compare-run", run_id)
    page.wait_for_function("() => document.querySelector('#compare-random .sqe-card') !== null")
    assert "Random baseline" in page.locator("#compare-random").inner_text()
    assert "Trained model" in page.locator("#compare-trained").inner_text()
    # Both sides show the verdict against the same gold answer.
    assert page.locator("#compare-random .sqe-gold").inner_text() == page.locator("#compare-trained .sqe-gold").inner_text()
    summary = page.locator("#compare-summary").inner_text()
    assert "random" in summary and "trained" in summary
    screenshot(page, "compare")


def test_compare_adds_a_saved_evaluation_column(dashboard, builtin, page, screenshot):
    """A run's tables by policy and hardness, and a column added from a saved evaluation on the same questions."""
    from sqlenv.environment import SQLEnvironment
    from sqlenv.evaluation.evaluate import evaluate
    from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy
    from sqlenv.evaluation.saved import save_evaluation
    from training.run.directory import RunDir

    with SQLEnvironment(builtin.questions_path("eval"), builtin.db_dir) as env:
        randoms = evaluate(env, RandomPolicy(seed=7), n_episodes=6, seed=7)
        oracle = evaluate(env, OraclePolicy(), n_episodes=6, seed=7)
    run = RunDir.create(dashboard["runs"], "cmp-columns")  # a finished run's comparison, as train.py writes it
    run.write_config({"model": "builtin:tiny", "dataset": "builtin", "eval_split": "eval"})
    run.write_status("completed", step=1, total_steps=1)
    for i, (r, t) in enumerate(zip(randoms.episodes, randoms.episodes)):
        run.append("comparison", {"kind": "pair", "index": i, "seed": 7 + i, "question_id": r["question_id"],
                                  "random": r, "trained": t})
    save_evaluation(oracle, dashboard["runs"] / "evaluations" / "oracle-6", dataset="builtin", split="eval",
                    step_budget=15, question_order="seeded")
    page.goto(dashboard["url"])
    open_tab(page, "Compare")
    pick(page, "compare-run", "cmp-columns")
    page.wait_for_function("() => document.querySelector('#compare-hardness')?.innerText.includes('random EX')")
    pick(page, "compare-add", "evaluation: oracle-6")
    page.wait_for_function("() => document.querySelector('#compare-summary')?.innerText.includes('evaluation: oracle-6')")
    summary = page.locator("#compare-summary").inner_text()
    assert "100%" in summary and "EX 95% CI" in summary
    hardness = page.locator("#compare-hardness").inner_text()
    assert "evaluation: oracle-6 EX" in hardness and "100%" in hardness
    assert page.locator("#compare-database").inner_text().count("%") >= 3
    screenshot(page, "compare_columns")


def test_runs_lists_the_run_and_survives_broken_ones(dashboard, page, screenshot):
    run_id = dashboard.get("run_id")
    if not run_id:
        pytest.skip("needs the run of test_train_live_reload_reattach_and_stop")
    runs = dashboard["runs"]
    (runs / "zz-corrupt").mkdir(exist_ok=True)
    (runs / "zz-corrupt" / "status.json").write_text("{half a status")
    (runs / "zz-corrupt" / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5, "time": 1}\n{"step": 2, "rew')
    (runs / "zz-empty").mkdir(exist_ok=True)
    page.goto(dashboard["url"])
    open_tab(page, "Runs")
    table = page.locator("#runs-table")
    page.wait_for_function("(id) => document.querySelector('#runs-table')?.innerText.includes(id)", arg=run_id)
    text = table.inner_text()
    assert "corrupt" in text and "missing" in text and "stopped" in text
    pick(page, "runs-pick", run_id)
    page.wait_for_function(f"() => document.querySelector('#runs-detail-status')?.dataset.run === '{run_id}'")
    assert page.locator("#runs-config").inner_text().count("builtin:tiny") >= 1
    page.wait_for_function("() => document.querySelector('#runs-trace .sqe-card') !== null")
    screenshot(page, "runs_detail")
    # The corrupt run opens as corrupt: its readable metric line is still plotted, nothing crashes.
    pick(page, "runs-pick", "zz-corrupt")
    page.wait_for_function("() => document.querySelector('#runs-detail-status')?.dataset.status === 'corrupt'")
    # Overlay two runs.
    pick(page, "runs-overlay", run_id)
    pick(page, "runs-overlay", "zz-corrupt")
    page.get_by_role("tab", name="Overlay", exact=True).click()
    page.wait_for_function(
        "() => (document.querySelector('#runs-overlay-reward .js-plotly-plot')?.data || []).length === 2"
    )
    screenshot(page, "runs_overlay")


def _start_an_unloadable_run(page) -> None:
    box = page.locator("#cfg-model input")
    box.fill("/no/such/model-dir")
    box.press("Enter")
    page.locator("#train-start").click()
    page.wait_for_function("() => document.querySelector('#train-form-message')?.dataset.kind === 'ok'")
    page.wait_for_function("() => document.querySelector('#train-status')?.dataset.status === 'failed'",
                           timeout=120_000)


def test_unloadable_model_fails_the_run_with_its_message(dashboard, page, screenshot):
    page.goto(dashboard["url"])
    page.wait_for_function("() => document.querySelector('#train-status') !== null")
    _start_an_unloadable_run(page)
    message = page.locator("#train-status .sqe-err-box").inner_text()
    assert "/no/such/model-dir" in message
    screenshot(page, "train_failed_model")
    # The app keeps serving: the Play tab still starts an episode.
    open_tab(page, "Play")
    page.locator("#play-new").click()
    page.locator("#play-question").wait_for()


def test_a_collapsing_run_warns_in_the_status_bar(dashboard, page, screenshot):
    """The status bar says in words what `training.run.health` reads as a collapse. The Train tab's run (the failed run
    above, or one this test fails the same way) is given a GRPO run's records through `RunRecorder`, as training
    writes them: entropy running away, a grad-norm spike, validation losing 10 questions of 40 for 1 gained."""
    page.goto(dashboard["url"])
    page.wait_for_function("() => document.querySelector('#train-status') !== null")
    if not RUN_ID.match(status_attr(page, "data-run")):
        _start_an_unloadable_run(page)
    write_grpo_run(RunDir(dashboard["runs"] / status_attr(page, "data-run")), collapse=True)
    page.wait_for_function("() => document.querySelector('#train-health') !== null")
    assert page.locator("#train-health").get_attribute("data-signs") == \
        "validation_drop entropy_runaway grad_norm_spike"
    text = page.locator("#train-health").inner_text()
    assert "Signs of a collapse" in text
    assert "Validation success fell from 45% at step 0 to 22% at step 20: 10 of 40 questions lost, 1 gained" in text
    assert "The sampled entropy is running away" in text and "The grad norm spiked to 0.4 at step 16" in text
    # The Policy chart draws the same records, validation success as markers, its legend clear of the axis title.
    page.wait_for_function("() => (document.querySelector('#chart-policy .js-plotly-plot')?.data || [])"
                           ".some(t => t.name === 'validation success' && t.x.length === 5)")
    legend = page.locator("#chart-policy g.legend").bounding_box()
    title = page.locator("#chart-policy .g-xtitle text").bounding_box()
    assert title["y"] + title["height"] <= legend["y"], (title, legend)
    screenshot(page, "train_collapse_warning")
