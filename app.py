"""SQLEnv dashboard: `python app.py` (offline default: built-in data, builtin:tiny model).

Also the HuggingFace Space entry point (sdk gradio, app_file app.py): on a Space GRADIO_SERVER_NAME is
0.0.0.0. Options: --host, --port (or GRADIO_SERVER_NAME / GRADIO_SERVER_PORT), --runs-dir, --data-dir.
"""

from dashboard.app import main

if __name__ == "__main__":
    main()
