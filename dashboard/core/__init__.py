"""What the tabs share: the app's context (`context`: the runner, the run cache, where data lives; `datasets`), the
training runner (`runner`), a run's files as bounded snapshots (`run_data`, `run_sample`), progress and remaining
time (`progress`, over `measured`: configs/measured.json), the charts (`charts`, `policy_chart`), transcripts as
HTML (`transcripts`), a run's results as tables (`results`), notes on a run (`run_notes`), the formatting of
numbers, percents and durations (`formatting`), and where configs and runs live (`paths`, `storage`).

Imports `dashboard.access` and nothing of a tab, the page or the server: a module two tabs need lives here.
"""
