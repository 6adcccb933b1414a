"""Episodes per second of `--policy openai` with one episode in flight against eight, on a local endpoint.

One invocation: a model is served on 127.0.0.1 by `python -m training.generation.openai_server` (a child process, which
decodes concurrent requests in one batch as serving engines do), and the same evaluation — the same episodes,
`sqlenv.evaluation.concurrent.evaluate_concurrently` with `OpenAIPolicy` — runs once per `--concurrency` value,
in this process, after a short warm-up. By default the model is the built-in tiny model warm-started here for
`--sft-steps` (a few seconds), so that it answers in tool calls and ends episodes as a trained model does; an
untrained model would write `--max-tokens` of noise every turn.

    python bench/decoding/openai_eval.py [--episodes 200] [--concurrency 1,8] [--model builtin:tiny] [--sft-steps 400]
                                [--threads 1] [--device cpu]

Figures per concurrency: episodes/s, requests/s, mean request latency and the mean episode's steps; the last line
is one JSON object with `ratio` = episodes/s at the highest concurrency over the lowest. The client and the
server share the machine's cores; say what `uptime` showed (printed before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))  # serverproc: the server-in-a-subprocess helper tests and benches share

from serverproc import ServerProcess  # noqa: E402

from sqlenv.evaluation.concurrent import evaluate_concurrently  # noqa: E402
from sqlenv.environment import SQLEnvironment  # noqa: E402
from sqlenv.evaluation.openai_policy import EndpointSettings, OpenAIPolicy  # noqa: E402


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def warm_started_model(folder: Path, steps: int, device: str | None) -> Path:
    """The built-in tiny model after `steps` SFT steps on oracle episodes, saved in `folder`."""
    from training.models import load_model_and_tokenizer
    from training.warm_start import SFTSettings, run_sft

    model, tokenizer = load_model_and_tokenizer("builtin:tiny", device=device)
    run_sft(model, tokenizer, SFTSettings(max_steps=steps, batch_size=4, learning_rate=3e-3, episodes=400,
                                          logging_steps=max(1, steps)))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_eval(settings: EndpointSettings, dataset: str, split: str, budget: int, episodes: int, seed: int,
             concurrency: int) -> dict:
    make_env = lambda: SQLEnvironment.from_dataset(dataset, split, step_budget=budget)  # noqa: E731
    started = time.perf_counter()
    result = evaluate_concurrently(make_env, lambda: OpenAIPolicy(settings), n_episodes=episodes, seed=seed,
                                   concurrency=concurrency)
    wall = time.perf_counter() - started
    usage = [e.get("usage") or {} for e in result.episodes]
    requests = sum(u.get("requests", 0) for u in usage)
    latency = sum(u.get("latency_s", 0.0) for u in usage)
    return {"concurrency": concurrency, "episodes": result.n_episodes, "errors": result.n_errors,
            "wall_s": round(wall, 3), "episodes_per_s": round(result.n_episodes / wall, 3),
            "requests_per_s": round(requests / wall, 3), "latency_s_per_request": round(latency / max(1, requests), 4),
            "avg_steps": round(result.avg_steps, 2), "success_rate": result.success_rate,
            "tool_calls": sum(u.get("tool_calls", 0) for u in usage)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per concurrency (default 200)")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated values (default 1,8)")
    parser.add_argument("--model", default="builtin:tiny", help="served model (default builtin:tiny, warm-started)")
    parser.add_argument("--sft-steps", type=int, default=400,
                        help="SFT steps of the built-in tiny model before serving it (default 400: it describes, queries and answers; 0 = untrained)")
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--split", default="eval")
    parser.add_argument("--budget", type=int, default=6, help="step budget (default 6)")
    parser.add_argument("--max-tokens", type=int, default=64, help="most tokens per turn (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch CPU threads (default 1)")
    parser.add_argument("--device", default=None, help="the server's device (default: cuda when available)")
    args = parser.parse_args()
    levels = sorted({int(x) for x in args.concurrency.split(",") if x.strip()})
    print(f"load before: {_load()}")

    with tempfile.TemporaryDirectory(prefix="sqlenv-openai-bench-") as tmp:
        model = args.model
        if model == "builtin:tiny" and args.sft_steps > 0:
            started = time.perf_counter()
            model = str(warm_started_model(Path(tmp) / "tiny-sft", args.sft_steps, args.device))
            print(f"warm-started the tiny model: {args.sft_steps} SFT steps in {time.perf_counter() - started:.1f} s")
        command = [sys.executable, "-m", "training.generation.openai_server", "--model", model, "--served-name", "bench",
                   "--port", "{port}", "--threads", str(args.threads), "--max-batch", str(max(levels))]
        if args.device:
            command += ["--device", args.device]
        with ServerProcess(command=command) as server:
            settings = EndpointSettings(server.url + "/v1", "bench", max_tokens=args.max_tokens,
                                        api_key_env="SQLENV_BENCH_NO_KEY")  # never send a real key here
            run_eval(settings, args.dataset, args.split, args.budget, min(4, args.episodes), args.seed + 10_000,
                     max(levels))  # warm-up: imports, first batches, caches
            rows = []
            for level in levels:
                row = run_eval(settings, args.dataset, args.split, args.budget, args.episodes, args.seed, level)
                rows.append(row)
                print(f"concurrency {level:>3}: {row['episodes_per_s']:7.2f} episodes/s  "
                      f"{row['requests_per_s']:7.2f} requests/s  "
                      f"{row['latency_s_per_request'] * 1000:7.1f} ms/request  "
                      f"{row['avg_steps']:.2f} steps/episode  {row['tool_calls']} tool calls  {row['errors']} errors")
    print(f"load after: {_load()}")
    low, high = rows[0], rows[-1]
    ratio = round(high["episodes_per_s"] / low["episodes_per_s"], 3) if low["episodes_per_s"] else None
    print(json.dumps({"bench": "openai_eval", "model": args.model, "sft_steps": args.sft_steps,
                      "episodes": args.episodes, "budget": args.budget, "max_tokens": args.max_tokens,
                      "server_threads": args.threads, "device": args.device or "auto", "results": rows,
                      "ratio": ratio,
                      "ratio_between": [low["concurrency"], high["concurrency"]]}))


if __name__ == "__main__":
    main()
