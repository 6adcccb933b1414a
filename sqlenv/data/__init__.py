"""Datasets: questions with their gold SQL and SQLite files, prepared once into a directory and named.

- `datasets`: prepared datasets by name (`builtin`, `spider10`, a path): where they live and how a name resolves;
- `dataset_dir`: a prepared directory's layout, `DatasetInfo`, loading its questions, swapping a new build in place;
- `builtin/`: the offline built-in dataset, generated deterministically from seeded schemas and templates;
- `spider`: Spider 1.0: prepare a dataset from its directory, download the official archive;
- `difficulty`: Spider's hardness levels (easy / medium / hard / extra) from a sqlglot parse.

May import: the core's `types` only (a `Question` is what a dataset holds).
"""
