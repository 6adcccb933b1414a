"""The run record: the one torch-free contract between a training run and whoever reads it (the CLI, the notebook,
the dashboard).

- `schema`: the phase names and their order, defined here once.

Imports nothing from the rest of `training` and no ML package (torch, transformers, trl).
"""
