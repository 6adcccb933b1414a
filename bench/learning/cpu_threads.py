"""Torch threads on a shared CPU: a SmolLM2 training step at 1 and 2 threads, OpenMP spinning or passive, idle or
beside another CPU job — the measurement behind the CPU runs' thread default.

    python bench/learning/cpu_threads.py                       # every variant, on the cores as they are
    python bench/learning/cpu_threads.py --with-load           # the same while a busy loop holds one core (another job)
    python bench/learning/cpu_threads.py --model builtin:tiny --tokens 256 --reps 5

Each variant runs in a fresh process (OpenMP reads `OMP_WAIT_POLICY` when torch loads): the model's forward and
backward over `--tokens` tokens, `--reps` times after one warm-up; wall and CPU seconds per step (median). On a
2-core machine with one other job, torch's default (active) waiting at 2 threads spins on a core the other job
needs: issue 45 measured a SmolLM2 SFT step at 90 s wall there, 25 s at 1 thread. Passive waiting sleeps instead.
The machine's 1-minute load is printed with each figure. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: (threads, policy): OMP_WAIT_POLICY ACTIVE / PASSIVE, "default" (unset: libgomp spins a while, then sleeps), or
#: "spin<N>" (unset, GOMP_SPINCOUNT=N: a shorter spin before sleeping).
VARIANTS = [(1, "ACTIVE"), (2, "ACTIVE"), (1, "PASSIVE"), (2, "PASSIVE"), (2, "default"), (2, "spin10000")]


def child(model_name: str, tokens: int, reps: int, threads: int) -> dict:
    import torch

    sys.path.insert(0, str(REPO))
    from training.models import load_model_and_tokenizer

    torch.set_num_threads(threads)
    model, _ = load_model_and_tokenizer(model_name, seed=0, device="cpu")
    model.train()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0))
    walls, cpus = [], []
    for rep in range(reps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        if rep:  # the first is a warm-up
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "load_1min": os.getloadavg()[0]}


def busy_loop() -> subprocess.Popen:
    """Another CPU job: one process spinning on one core until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=700, help="tokens of the step's sequence (default %(default)s)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--with-load", action="store_true", help="a busy loop holds one core meanwhile")
    parser.add_argument("--variants", default=None, help="comma-separated THREADS:POLICY (default: all of VARIANTS)")
    parser.add_argument("--child", nargs=2, metavar=("THREADS", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.tokens, args.reps, int(args.child[0]))))
        return 0
    variants = VARIANTS if not args.variants else [(int(v.split(":")[0]), v.split(":")[1])
                                                     for v in args.variants.split(",")]
    loader = busy_loop() if args.with_load else None
    results = []
    try:
        for threads, policy in variants:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env["OMP_NUM_THREADS"] = str(threads)
            if policy.startswith("spin"):
                env["GOMP_SPINCOUNT"] = policy[4:]
            elif policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--tokens", str(args.tokens),
                                  "--reps", str(args.reps), "--child", str(threads), policy],
                                 env=env, capture_output=True, text=True, check=True)
            figure = json.loads(out.stdout.strip().splitlines()[-1])
            figure.update(threads=threads, wait_policy=policy)
            results.append(figure)
            print(f"{threads} thread(s), OMP_WAIT_POLICY={policy}: {figure['wall_s']:.2f} s wall, "
                  f"{figure['cpu_s']:.2f} CPU-s a step (load {figure['load_1min']:.1f})", flush=True)
    finally:
        if loader is not None:
            loader.kill()
    print(json.dumps({"model": args.model, "tokens": args.tokens, "with_load": args.with_load,
                      "cores": os.cpu_count(), "variants": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
