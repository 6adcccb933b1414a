"""The question sampler in simulation: how many GRPO groups have mixed success, uniform draws vs `question_sampler=mixed`.

    nice python bench/learning/question_sampler.py                      # built-in train questions, 4 seeds
    nice python bench/learning/question_sampler.py --dataset spider10 --seeds 8

No model: each question gets a synthetic success rate, and a group of G episodes is G coin flips. The rate is one per
coarsest key of `question_groups` (a template on the built-in data, a database on Spider) plus a per-question
scatter (sd 0.15), in two scenarios:

- `static`: rates drawn once from Beta(0.3, 0.3) (most keys nearly always or never answered, as for a small model);
- `learning`: each key's rate rises along a logistic from 0 to a ceiling drawn from Beta(2, 1), its onset uniform
  in [-10, 60] steps: the policy learns one kind of question after another.

Both play 40 generation batches with TRL's lag (batch k + 1 is drawn before batch k's outcomes come back), at the
default run's shape (8 questions x 8 episodes) and the SmolLM2 CPU recipe's (4 x 4). A real run's rates move with the
policy, which no simulation captures: the figure to trust is a run's own `groups_mixed_success_frac`. The last line is
one JSON object: the mean fraction of mixed groups per scenario and shape, uniform and mixed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = ((8, 8), (4, 4))  # (questions, episodes) per generation batch
STEPS = 40


def play(ids: list[str], groups: dict, sampler: str, scenario: str, questions: int, generations: int,
         seed: int) -> float:
    """The mean fraction of mixed groups over `STEPS` generation batches."""
    import torch

    from training.grpo.sampler import QuestionStats, mixed_success_fraction

    rng = random.Random(seed)
    key = {q: groups[q][-1] for q in ids}
    keys = sorted(set(key.values()))
    scatter = {q: rng.gauss(0, 0.15) for q in ids}
    if scenario == "static":
        level = {k: rng.betavariate(0.3, 0.3) for k in keys}

        def rate(q, step):
            return min(1.0, max(0.0, level[key[q]] + scatter[q]))
    else:
        onset = {k: rng.uniform(-10, 60) for k in keys}
        ceiling = {k: rng.betavariate(2, 1) for k in keys}

        def rate(q, step):
            learnt = ceiling[key[q]] / (1 + math.exp(-(step - onset[key[q]]) / 4))
            return min(1.0, max(0.0, learnt + scatter[q] / 2))
    stats = QuestionStats(ids, generations, groups)
    generator = torch.Generator().manual_seed(seed)
    pending, fractions = [], []
    for step in range(STEPS + 1):
        if sampler == "mixed":
            pending.append(stats.draw(questions, generator))
        else:
            pending.append(torch.randperm(len(ids), generator=generator)[:questions].tolist())
        if len(pending) < 2:
            continue
        rows = pending.pop(0)
        played, outcomes = [], []
        for row in rows:
            p = rate(ids[row], step)
            played += [ids[row]] * generations
            outcomes += [rng.random() < p for _ in range(generations)]
        fractions.append(mixed_success_fraction(outcomes, generations))
        stats.record(played, outcomes)
    return sum(fractions) / len(fractions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="builtin", help="a dataset name or prepared directory (default builtin)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--seeds", type=int, default=4, help="runs per scenario and shape (default 4)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")

    from sqlenv.data.datasets import resolve_dataset
    from training.grpo.sampler import question_groups

    path = resolve_dataset(args.dataset).questions_path(args.split)
    groups = question_groups(path)
    ids = list(groups)
    print(f"{len(ids)} questions of {args.dataset}/{args.split}, "
          f"{len({g[-1] for g in groups.values()})} coarsest keys, {args.seeds} seeds", flush=True)
    figures = {}
    start = time.perf_counter()
    for scenario in ("static", "learning"):
        for questions, generations in SHAPES:
            row = {}
            for sampler in ("uniform", "mixed"):
                runs = [play(ids, groups, sampler, scenario, questions, generations, seed)
                        for seed in range(args.seeds)]
                row[sampler] = round(sum(runs) / len(runs), 3)
            name = f"{scenario}_{questions}x{generations}"
            figures[name] = row
            print(f"{name:>16}: mixed groups {row['uniform']:.0%} uniform, {row['mixed']:.0%} mixed", flush=True)
    figures["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps({"dataset": args.dataset, "seeds": args.seeds, "steps": STEPS, **figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
