"""A measured GRPO step: a Qwen3-0.6B-shaped model through the real training entry point, several variants in one run.

    python bench/gpu/gpu_step.py                      # CUDA: the full Qwen3-0.6B shape; CPU: the scaled-down shape
    python bench/gpu/gpu_step.py --shape tiny         # scaled-down shape (CPU-sized), same code path
    python bench/gpu/gpu_step.py --model builtin:tiny # the real built-in tiny model (trained tokenizer, 0.6M params)

Each variant is one `training.train.run_training` run (the CLI's, dashboard's and notebook's entry point) of a few
GRPO steps on the built-in dataset — num_generations 4, step budget 10, no SFT, no evals — varying:

- fine-tuning: `full` (every weight) or `lora` (r=16 adapter on all linear layers);
- generation: `generate` (transformers' `generate`, TRL's default) or `continuous` (TRL's
  `use_transformers_continuous_batching`, through the `grpo` pass-through).

The model is built here, with no download: Qwen/Qwen3-0.6B's config values (vocab 151936, hidden 1024, 28 layers,
16 query / 8 key-value heads of 128, MLP 3072, tied embeddings) with random weights, saved in bf16 to a temporary
directory beside the built-in tiny model's tokenizer, and loaded through the same `from_pretrained` path as any local
model. Training runs in the run's precision: on a GPU bf16 autocast over fp32 master weights (`precision="auto"`).
A random model rarely emits its end-of-turn token, so every turn runs to `--max-turn-tokens` and no tool call is
parsed: each episode is one full-length turn, the worst case for generation.

Per variant it prints progress lines, then the figures: seconds per step (median of the steps after the first, which
includes warm-up), generated tokens per second of step (model tokens of all completions / step seconds: generation
is most of a step), and peak GPU memory (`torch.cuda.max_memory_allocated`; on CPU the figure is missing: null). The
last line is one JSON object with every variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: Qwen/Qwen3-0.6B's config.json values (the architecture, not the weights).
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
                 attention_bias=False, attention_dropout=0.0)
#: The same family scaled down to run on a CPU in seconds (same vocabulary: the LM head's cost is kept).
TINY_SHAPE = dict(QWEN3_06B, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=8192)


def build_model(shape: dict, folder: Path, seed: int = 0) -> Path:
    """A random-init Qwen3 model of `shape` with the built-in tiny tokenizer, saved (bf16) to `folder`."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from training.models import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir(seed=seed)))
    config = Qwen3Config(**shape, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return folder


def run_variant(model: str, name: str, args: argparse.Namespace, runs_dir: Path) -> dict:
    import torch

    from training.config import TrainConfig
    from training.train import run_training

    fine_tuning, generation = name.split("+")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    steps: list[dict] = []

    def listener(event: str, payload: dict) -> None:
        if event == "metrics" and payload.get("phase") == "grpo":
            steps.append(payload)
            print(f"  {name} step {payload['step']}: {payload.get('step_time', 0):.2f} s, "
                  f"{payload.get('completions/mean_length', 0):.0f} tokens per completion", flush=True)

    config = TrainConfig(
        model=model, dataset="builtin", max_steps=args.steps, num_generations=args.num_generations,
        per_device_train_batch_size=args.num_generations, step_budget=args.step_budget,
        max_completion_length=args.max_completion_length, max_turn_tokens=args.max_turn_tokens,
        learning_rate=1e-6, sft=False, compare_base=False, comparison_episodes=0, eval_every=0, eval_episodes=0,
        trace_every=0, plot_every=1, save_steps=0, seed=0, output_dir=str(runs_dir / name.replace("+", "-")),
        lora={"r": 16, "alpha": 32} if fine_tuning == "lora" else None,
        grpo={"use_transformers_continuous_batching": True} if generation == "continuous" else {},
        device=args.device, precision=args.precision,
        cpu_threads=args.cpu_threads,
    )
    started = time.perf_counter()
    error = None
    try:
        run_training(config, listener=listener)
    except Exception as exc:  # noqa: BLE001 - one failing variant must not hide the others' figures
        error = f"{type(exc).__name__}: {exc}"[:500]
        print(f"  {name} failed: {error}", flush=True)
    wall = time.perf_counter() - started
    times = [s["step_time"] for s in steps if isinstance(s.get("step_time"), (int, float))]
    timed = times[1:] or times  # the first step warms up (allocator, kernels, caches)
    batch = args.num_generations
    tokens = [s.get("completions/mean_length", 0) * batch for s in steps]
    tok_per_s = [t / s for t, s in zip(tokens[1:] or tokens, timed) if s > 0]
    return {
        "variant": name, "fine_tuning": fine_tuning, "generation": generation, "steps": len(steps),
        "seconds_per_step": round(statistics.median(timed), 3) if timed else None,
        "first_step_seconds": round(times[0], 3) if times else None,
        "generated_tokens_per_s": round(statistics.median(tok_per_s), 1) if tok_per_s else None,
        "tokens_per_step": round(statistics.median(tokens), 1) if tokens else None,
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "wall_seconds": round(wall, 1), "error": error,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=("qwen3-0.6b", "tiny"), default=None,
                        help="model shape (default: qwen3-0.6b on CUDA, tiny otherwise)")
    parser.add_argument("--model", default=None, help="train this model instead of a shaped random one "
                        "(e.g. builtin:tiny)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per variant (default 3)")
    parser.add_argument("--variants", default="full+generate,full+continuous,lora+generate,lora+continuous")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--step-budget", type=int, default=10)
    parser.add_argument("--max-turn-tokens", type=int, default=256)
    parser.add_argument("--max-completion-length", type=int, default=1024)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--cpu-threads", type=int, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    cuda = torch.cuda.is_available()
    shape_name = args.shape or ("qwen3-0.6b" if cuda else "tiny")
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"device: {device}; torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    if not cuda:
        print("no CUDA GPU here: the GPU figures (peak memory) are missing; "
              f"{'the shape is scaled down' if shape_name == 'tiny' else 'the full shape on CPU is slow'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sqlenv-gpu-step-") as scratch:
        scratch = Path(scratch)
        if args.model:
            model, shape_name = args.model, args.model
        else:
            t0 = time.perf_counter()
            model = str(build_model(QWEN3_06B if shape_name == "qwen3-0.6b" else TINY_SHAPE, scratch / "model"))
            print(f"built {shape_name} (random init) in {time.perf_counter() - t0:.1f} s", flush=True)
        results = []
        for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
            print(f"variant {name} ...", flush=True)
            result = run_variant(model, name, args, scratch / "runs")
            print(f"variant {name}: {json.dumps(result)}", flush=True)
            results.append(result)
    print(json.dumps({"bench": "gpu_step", "device": device, "shape": shape_name, "steps": args.steps,
                      "num_generations": args.num_generations, "step_budget": args.step_budget,
                      "max_turn_tokens": args.max_turn_tokens, "variants": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
