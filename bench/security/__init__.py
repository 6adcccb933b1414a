"""Hostile inputs, measured (docs/SECURITY.md): the soak, the SQL functions' worst times, what a statement or a
visitor's input makes a server or the dashboard hold, and the public servers under hostile connections."""
