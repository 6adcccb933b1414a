# SQLEnv as an OpenEnv server (a Hugging Face Docker Space, or any container host).
#
#   docker build -t sqlenv .
#   docker run -p 8000:8000 sqlenv   # http://localhost:8000/health, /docs, /web; /ws
#
# It serves the built-in dataset, generated at build time (deterministic, offline). To serve a prepared Spider
# dataset, mount it and override the command:
#   docker run -p 8000:8000 -v $PWD/data/spider10:/data/spider10 sqlenv \
#       python -m sqlenv serve --dataset /data/spider10 --host 0.0.0.0 --port 8000
#
# Not built in this repository's CI (no Docker engine there); tests/test_server.py runs the CMD below.
FROM python:3.11-slim

# Client addresses (the per-client session limit, --max-sessions-per-client): no SQLENV_PROXY_HOPS here, so the
# server trusts X-Forwarded-For only where the platform says a proxy is in front. On a Space (SPACE_ID and
# SYSTEM=spaces in its environment) every request comes through Hugging Face's reverse proxy, and the client is the
# last X-Forwarded-For entry, the one the proxy appended (one hop); anywhere else (plain docker run -p) it is the TCP
# peer and the header is ignored: the image once set SQLENV_PROXY_HOPS=1 everywhere, and with no proxy in front one
# address named 64 others by the header and took every session (issue 59). Behind a proxy of your own, set
# SQLENV_PROXY_HOPS to the number that append to the header (never more), or FORWARDED_ALLOW_IPS (not both). The
# server's start log says which source it uses.
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SQLENV_DATA_DIR=/app/data

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
