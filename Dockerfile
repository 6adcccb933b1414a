# SQLEnv as an OpenEnv server (a Hugging Face Docker Space, or any container host).
#
#   docker build -t sqlenv .
#   docker run -p 8000:8000 -e SQLENV_PROXY_HOPS=0 sqlenv   # http://localhost:8000/health, /docs, /web; /ws
#   (SQLENV_PROXY_HOPS=0: no proxy in front here; the image's 1 is for a Space, see below)
#
# It serves the built-in dataset, generated at build time (deterministic, offline). To serve a prepared Spider
# dataset, mount it and override the command:
#   docker run -p 8000:8000 -e SQLENV_PROXY_HOPS=0 -v $PWD/data/spider10:/data/spider10 sqlenv \
#       python -m sqlenv serve --dataset /data/spider10 --host 0.0.0.0 --port 8000
#
# Not built in this repository's CI (no Docker engine there); tests/test_server.py runs the CMD below.
FROM python:3.11-slim

# SQLENV_PROXY_HOPS=1: on a Space every request reaches the container through Hugging Face's reverse proxy, so
# the TCP peer is the proxy for every client, and the per-client session limit (--max-sessions-per-client) would
# be one limit for all clients together. With 1 the client is the last X-Forwarded-For entry, the one the proxy
# appended; entries left of it are the client's own claims and are never read. We found nothing in HF's documentation
# on how many entries its proxies append: 1 assumes one. Too few is safe (clients share a limit again),
# too many is not (the entry read would be the client's claim): were HF found to append two, say 2. Run with no
# proxy in front (plain docker run -p), set SQLENV_PROXY_HOPS=0, or any client names its address by the header.
# Not with FORWARDED_ALLOW_IPS (the server refuses both).
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SQLENV_DATA_DIR=/app/data \
    SQLENV_PROXY_HOPS=1

WORKDIR /app
# The core package and the server extra only (no torch, TRL or the dashboard).
COPY pyproject.toml README.md ./
COPY sqlenv ./sqlenv
RUN pip install ".[server]" && python -m sqlenv data build-builtin

# Spaces run containers as user 1000; the server only reads /app.
RUN useradd --create-home --uid 1000 user
USER user

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')" || exit 1
CMD ["python", "-m", "sqlenv", "serve", "--dataset", "builtin", "--split", "train", "--host", "0.0.0.0", "--port", "8000", "--web"]
