"""The environment as a model sees it, below everything that trains or plays a model:

- `source.EpisodeSource`: the questions an environment plays (a split's questions file, its databases, the step
  budget), parsed once and shared;
- `trl_env`: `SQLEnvTRL`, the environment with the model's tools (TRL's `environment_factory`), `tool_methods` /
  `tool_schemas` in TRL's order, `train_rows` (GRPO's prompts);
- `teacher`: the teacher's episodes through `SQLEnvTRL` as chat conversations (the warm start's examples, the built-in
  tiny model's tokenizer corpus).

Imports `sqlenv` and `training.config` only (no torch at import): the model loader, the chat renderer, GRPO and the
warm start all stand on it.
"""
