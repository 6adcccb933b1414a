"""The SQLEnv dashboard (Gradio): train with live charts, compare random vs trained, play, browse runs.

`dashboard.app.build_app()` builds the Blocks; `python app.py` at the repository root launches it. UI modules
(one per tab) only read run directories and talk to `dashboard.runner.TrainingRunner`, which owns training.
"""
