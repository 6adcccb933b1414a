"""The SQLEnv dashboard (Gradio): train with live charts, compare random vs trained, play, browse runs.

One folder per tab, each building its widgets and wiring them to the shared core, never importing another tab:
`train/` (the form, the live status bar and charts), `compare/` (a run's policies side by side), `play/` (a person
plays an episode), `runs/` (every run: the table, a run's detail, config diff, overlay, resume, push to the Hub).
Below them `core/` (what two tabs share: the app context, the training runner, run snapshots, progress, charts,
transcripts, results tables, formatting) and `access/` (the public app's guards). Apart: `page` (the tabs on one
page), `server` (serving it: `python app.py` at the repository root runs `dashboard.server.main`) and `style` (the
CSS and theme). tests/test_layers.py checks the direction: access ← core ← tabs ← page ← server.
"""
