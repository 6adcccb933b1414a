"""The README's Python example runs as written on the built-in dataset and answers correctly."""

from __future__ import annotations

import contextlib
import io
import re

from conftest import REPO_ROOT


def test_readme_python_example_runs_and_is_correct():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(blocks[0], "README.md", "exec"), namespace)
    env = namespace["env"]
    assert namespace["obs"].done
    assert env.transcript()["outcome"] == "correct"


def test_readme_names_the_two_setup_commands_that_the_makefile_defines():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, flags=re.M)
