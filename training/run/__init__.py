"""The run record: the one torch-free contract between a training run and whoever reads it (the CLI, the notebook,
the dashboard). The phases, the trainer hooks (`training.callbacks`), the evals and the dashboard all go through it.

- `schema`: the phase names and their order, the statuses, the record files, run ids and the runs folder: defined
  here once;
- `secrets`: what counts as a credential in a run's config (refused by the config, redacted by readers);
- `directory`: the run directory's format, its reader and writer (`RunDir`, `resolve_run`, bounded JSON/JSONL reads,
  `live_status`);
- `recorder`: `RunRecorder`, the one writer during a run, which also tells a listener; `error_message`;
- `results` (which measure a run's headline shows), `listing` (`list_runs`: a row per run), `health` (the signs of a
  collapse, in words), `kept_weights` (which weights a run kept, in words).

Imports nothing from the rest of `training` and no ML package (torch, transformers, trl): tests/test_layers.py
checks both.
"""
