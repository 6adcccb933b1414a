"""GRPO training for SQLEnv with TRL.

The folder is the architecture:

- the run: `config` (TrainConfig, plain data) → `plan` (RunPlan: the world checked and resolved once) → `phases`
  (load, zero-shot eval, warm start, base eval, GRPO, comparison) played by `train.run_training`; `cli` (`python -m
  training.train`), the run directory's format and writers (`run_dir`, `callbacks`), `runs` (`python -m training.runs
  list`), `gpu` (the GPU readout a run stores);
- `models/`: loading a model (`builtin:tiny` with its `tokenizer`, Hub ids, local folders, LoRA adapters, `gguf`
  files such as `smollm2-135m`);
- `warm_start/`: SFT on a teacher's episodes (`trainer`: the warm start's SFTTrainer);
- `grpo/`: the GRPOTrainer (`build_trainer`), the environment as TRL's `environment_factory` (`trl_env`), the batched
  `rollout`, the reward functions (`rewards`);
- `generation/`: the model playing episodes (`chat`, `decoding`, `episodes`, `model_policy`) and serving them
  (`openai_server`).

Importing this package is cheap (no torch): heavy modules are imported where they are used, so the dashboard
can read run directories without loading an ML stack.
"""
