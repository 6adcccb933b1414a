"""GRPO training for SQLEnv with TRL.

The folder is the architecture, in the order data flows (tests/test_layers.py's `TRAINING_UNITS` declares what each
part may import, lazy imports included, and finds no cycle):

- the run: `config` (TrainConfig, plain data) → `plan` (RunPlan: the world checked and resolved once; `device`: the
  device, precision and CPU threads) → `phases` (load, zero-shot eval, warm start, base eval, GRPO, comparison) played
  by `train.run_training`; `cli` (`python -m training.train`), `runs` (`python -m training.runs list`), `evals`,
  `panel` + `validation` (the validation panel, `keep_best`), `callbacks` (the trainer hooks only), `distributed`
  (which rank this is), `gpu` (the GPU readout a run stores);
- `run/`: the run record, the one contract with the dashboard and torch-free: its `schema` (the phases in order,
  statuses, run ids), `directory` (reader and writer), `recorder` (the one writer during a run), `results`,
  `listing`, `health`, `kept_weights`;
- `environment/`: the environment as a model sees it (`EpisodeSource`, `SQLEnvTRL`: TRL's `environment_factory`, the
  teacher's conversations);
- `models/`: loading a model (`builtin:tiny` with its `tokenizer`, Hub ids, local folders, LoRA adapters, `gguf`
  files such as `smollm2-135m`);
- `warm_start/`: SFT on a teacher's episodes (`trainer`: the warm start's SFTTrainer);
- `grpo/`: the GRPOTrainer (`build_trainer`), the batched `rollout`, the reward functions (`rewards`);
- `generation/`: the model playing episodes (`chat`, `decoding`, `episodes`, `model_policy`) and serving them
  (`openai_server`).

Importing this package is cheap (no torch): heavy modules are imported where they are used, so the dashboard
can read run directories without loading an ML stack.
"""

import os as _os

# OpenMP (torch's CPU threads) spins while a thread waits for the others: libgomp's default spin lasts long enough
# that, beside another CPU job, a 2-thread step of SmolLM2 took 12.6 s (15.6 CPU-s) instead of 4.7 s idle; with a
# spin of 10,000 it took 9.5 s (9.9 CPU-s), and idle the same 4.8 s (`python bench/learning/cpu_threads.py`).
# Read by libgomp when torch loads, so it applies where `training` is imported first (the CLI, the dashboard's
# runs, the benches).
_os.environ.setdefault("GOMP_SPINCOUNT", "10000")
