"""Run config diff (the Runs tab's Config diff): flattened dotted keys, values of run A vs run B, equal configs said
so; the view reads only listed runs, through the run cache (secret-named values redacted)."""

from __future__ import annotations

import json

import pytest

from dashboard.runs.config_diff import ABSENT, config_diff_view, diff_configs, diff_table, flatten, show_value
from dashboard.core.run_data import RunCache
from training.config import TrainConfig
from training.run.directory import REDACTED, RunDir


def test_nested_sections_flatten_to_dotted_keys():
    config = {"model": "builtin:tiny", "grpo": {"loss_type": "dr_grpo"}, "lora": {},
              "sft": {"enabled": True, "args": {"lr_scheduler_kwargs": {"num_decay_steps": 1000}},
                      "teacher_mistakes": ["guess"]}}
    assert flatten(config) == {"model": "builtin:tiny", "grpo.loss_type": "dr_grpo",
                               "sft.enabled": True, "sft.args.lr_scheduler_kwargs.num_decay_steps": 1000,
                               "sft.teacher_mistakes": ["guess"]}


def test_only_differing_fields_with_absent_keys_and_json_types():
    a = {"run_id": "a", "output_dir": "runs/a", "learning_rate": 5e-4, "max_steps": 40, "seed": 1,
         "grpo": {"loss_type": "grpo", "beta": 0.0}, "sft": {"enabled": True, "args": {"warmup_steps": 10}},
         "compare_base": True, "note": "1"}
    b = {"run_id": "b", "output_dir": "runs/b", "learning_rate": 1e-3, "max_steps": 40.0, "seed": 1,
         "grpo": {"loss_type": "dr_grpo", "beta": 0.0}, "sft": {"enabled": True}, "compare_base": 1,
         "note": 1, "cpu_threads": None}
    rows = diff_configs(a, b)
    shown = {r.key: (show_value(r.a, r.a_present), show_value(r.b, r.b_present)) for r in rows}
    assert shown == {
        "compare_base": ("true", "1"),  # a bool is not the number 1
        "cpu_threads": (ABSENT, "null"),  # absent is not null
        "grpo.loss_type": ('"grpo"', '"dr_grpo"'),
        "learning_rate": ("0.0005", "0.001"),
        "note": ('"1"', "1"),  # strings quoted, as the config file writes them
        "sft.args.warmup_steps": ("10", ABSENT),
    }
    assert [r.key for r in rows] == sorted(shown)  # max_steps 40 == 40.0; run_id/output_dir name the run only
    assert diff_configs(a, dict(a, run_id="other", output_dir="elsewhere")) == []
    table = diff_table(rows, "A: a", "B: b")
    assert list(table.columns) == ["field", "A: a", "B: b"] and len(table) == len(rows)


def write_run(root, run_id, config, status="completed"):
    run = RunDir.create(root, run_id)
    run.write_config(config)
    run.write_status(status, step=1, total_steps=1)
    return run


def test_the_view_diffs_two_real_run_configs_and_says_when_they_are_equal(tmp_path):
    base = TrainConfig(max_steps=40, comparison_episodes=20)
    plain = base.with_overrides({"run_id": "plain", "output_dir": str(tmp_path / "plain")}).to_dict()
    twin = base.with_overrides({"run_id": "twin", "output_dir": str(tmp_path / "twin")}).to_dict()
    tuned = base.with_overrides({"run_id": "tuned", "learning_rate": 1e-3, "grpo": {"loss_type": "dr_grpo"},
                                 "sft": {"enabled": True, "max_steps": 300}}).to_dict()
    for run_id, config in (("plain", plain), ("twin", twin), ("tuned", tuned)):
        write_run(tmp_path, run_id, json.loads(json.dumps(config, default=str)))
    cache = RunCache(tmp_path)

    message, table = config_diff_view(cache, "plain", "twin")
    assert "have the same config" in message and 'data-differ="0"' in message and table.empty

    message, table = config_diff_view(cache, "plain", "tuned")
    rows = {row["field"]: (row["A: plain"], row["B: tuned"]) for _, row in table.iterrows()}
    assert rows["learning_rate"][1] == "0.001"
    assert rows["grpo.loss_type"] == (ABSENT, '"dr_grpo"')  # `grpo: {}` passes nothing through: no row of its own
    assert rows["sft.enabled"] == ("null", "true") and rows["sft.max_steps"] == ("-1", "300")
    assert "run_id" not in rows and "output_dir" not in rows
    assert f'data-differ="{len(rows)}"' in message and f"{len(rows)} of " in message


def test_the_view_shows_secrets_redacted_and_reads_only_listed_runs(tmp_path):
    runs, outside = tmp_path / "runs", tmp_path / "elsewhere"
    write_run(runs, "a", {"model": "builtin:tiny", "grpo": {"hub_token": "hf_SECRET_A"}})
    write_run(runs, "b", {"model": "builtin:tiny", "grpo": {"hub_token": "hf_SECRET_B"}, "seed": 3})
    escaped = write_run(outside, "escaped", {"model": "OUTSIDE", "seed": 9})
    (runs / "link").symlink_to(escaped.path, target_is_directory=True)
    write_run(runs / "models", "cached", {"model": "NOT-A-RUN"})  # runs/models/ is the model cache, not a run
    (runs / "models" / "config.json").write_text(json.dumps({"model": "NOT-A-RUN"}))
    cache = RunCache(runs)

    message, table = config_diff_view(cache, "a", "b")
    text = message + table.to_csv()
    assert "hf_SECRET" not in text and "seed" in text
    # Both tokens are redacted the same way, so they do not even read as a difference.
    assert "grpo.hub_token" not in list(table["field"]) and REDACTED not in text

    write_run(runs, "c", {"model": "builtin:tiny", "grpo": {}})
    message, table = config_diff_view(cache, "a", "c")
    assert dict(zip(table["field"], table["A: a"]))["grpo.hub_token"] == json.dumps(REDACTED)
    assert "hf_SECRET" not in message + table.to_csv()

    for name in ("../elsewhere/escaped", str(outside / "escaped"), "link", "models", "evaluations", "nope", "",
                 "x" * 5000, None, ["a"]):
        message, table = config_diff_view(cache, "a", name)
        assert table.empty and "OUTSIDE" not in message and "NOT-A-RUN" not in message, name
        if name:
            assert "sqe-err-box" in message, name


# Issue 35: credentials under other names, recognised by their values (`training.run.secrets.is_secret_value`).
HUB_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
VALUE_SECRETS = {"hf_auth": HUB_TOKEN, "Authorization": "Bearer " + HUB_TOKEN, "hub_model_id": HUB_TOKEN,
                 "label_names": ["labels", "Bearer " + HUB_TOKEN]}


def test_a_credential_is_refused_in_a_config_and_redacted_in_a_run_by_its_value(tmp_path):
    """`sft.args.hf_auth: "hf_..."` and `sft.args.Authorization: "Bearer hf_..."` were neither refused by
    TrainConfig nor redacted on Run detail and Config diff: secrets were recognised by key words alone."""
    from training.config import ConfigError

    for key, value in VALUE_SECRETS.items():
        with pytest.raises(ConfigError, match="looks like a secret") as refused:
            TrainConfig.from_dict({"sft": {"args": {key: value}}})
        assert f"sft.args.{key}" in str(refused.value) and HUB_TOKEN not in str(refused.value)
    with pytest.raises(ConfigError, match="looks like a secret"):
        TrainConfig.from_dict({"grpo": {"generation_kwargs": {"stop": ["Bearer " + HUB_TOKEN]}}})
    kept = TrainConfig.from_dict({"sft": {"args": {"hub_model_id": "me/sqlenv-sft", "label_names": ["labels"]}}})
    assert kept.sft.args["hub_model_id"] == "me/sqlenv-sft"  # names and words are not secrets

    # A run written before (or by hand) with them: every reader shows them redacted.
    write_run(tmp_path, "leaky", {"model": "builtin:tiny", "sft": {"args": dict(VALUE_SECRETS, max_length=512)}})
    write_run(tmp_path, "clean", {"model": "builtin:tiny", "sft": {"args": {"max_length": 512}}})
    cache = RunCache(tmp_path)
    shown = cache.snapshot("leaky").config["sft"]["args"]
    assert shown == {"hf_auth": REDACTED, "Authorization": REDACTED, "hub_model_id": REDACTED,
                     "label_names": ["labels", REDACTED], "max_length": 512}
    message, table = config_diff_view(cache, "leaky", "clean")
    text = message + table.to_csv()
    assert HUB_TOKEN not in text and "Bearer" not in text and "sft.args.Authorization" in list(table["field"])
