"""SQLEnv dashboard: `python app.py` (offline default: built-in data, builtin:tiny model).

Also the HuggingFace Space entry point (sdk gradio, app_file app.py): on a Space GRADIO_SERVER_NAME is
0.0.0.0. Options: --host, --port (or GRADIO_SERVER_NAME / GRADIO_SERVER_PORT), --runs-dir, --data-dir.
Training controls are open on 127.0.0.1 only; elsewhere they need the owner: SQLENV_ADMIN_PASSWORD, or on a
Space the Hub sign-in (hf_oauth) of its author or SQLENV_ADMIN_USERS (dashboard/access/owner.py, README).
"""

if __name__ == "__main__":
    # Imported here, not at the top: each training run is a spawned process that imports this file again (as
    # __mp_main__), and it needs none of the web app.
    from dashboard.server import main

    main()
