"""The public app's guards: who may train (`owner`: `AccessPolicy`, `OwnerGate`, the login throttle), which values a
page may send (`inputs`: names, text, sizes) and which HTTP requests reach Gradio at all (`http_guard`).

The dashboard's lowest folder: imports nothing else from `dashboard` (only `sqlenv`).
"""
