"""`python -m sqlenv eval`: a baseline policy, or a model behind an OpenAI-compatible endpoint, played on a split.

    python -m sqlenv eval --dataset builtin --split eval --policy oracle --episodes 50 --seed 0 [--json]
    python -m sqlenv eval --dataset spider_dev --policy random --out runs/evaluations/random-spider-dev
    python -m sqlenv eval --policy openai --base-url http://127.0.0.1:8000/v1 --model NAME --concurrency 8

Episode i plays `reset(seed=seed + i)`, or with `--episodes all` every question of the split once. The table gives
success and EX with 95% intervals per hardness and per database; `--out` saves what the dashboard's Compare tab reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from sqlenv.cli.arguments import (CLIError, integer, json_object, nonnegative_float, nonnegative_int, one_line,
                                  positive_float, positive_int)
from sqlenv.cli.environments import env_factory


def episode_count(text: str) -> int | str:
    """`--episodes`: a positive count, or `all`."""
    if text.strip().lower() == "all":
        return "all"
    return positive_int(text)


def add_parser(commands: Any) -> None:
    """Add `eval` to the top parser's `commands`."""
    ev = commands.add_parser("eval", help="evaluate a baseline policy or a model behind an OpenAI-compatible endpoint")
    ev.add_argument("--dataset", default="builtin", help="dataset name or path (default: builtin)")
    ev.add_argument("--split", default="eval", help="split (default: eval)")
    ev.add_argument("--policy", choices=["oracle", "random", "openai"], default="oracle",
                    help="policy (default: oracle); openai: a model behind an OpenAI-compatible endpoint")
    ev.add_argument("--episodes", type=episode_count, default=None,
                    help="number of episodes drawn by seed, or 'all': every question of the split once (default 50; "
                         "'all' on the eval split of datasets whose protocol scores all of it, such as spider_dev)")
    ev.add_argument("--seed", type=integer, default=0, help="episode i plays reset(seed=seed+i) (default 0)")
    ev.add_argument("--budget", type=positive_int, default=15, help="step budget (default 15)")
    ev.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ev.add_argument("--transcripts", default=None, help="also write every episode transcript to this JSONL file")
    ev.add_argument("--out", default=None,
                    help="save the evaluation (evaluation.json + episodes.jsonl) in this directory; under "
                         "runs/evaluations/ the dashboard's Compare tab can add it as a column")
    endpoint = ev.add_argument_group("--policy openai (needs sqlenv[openai])")
    endpoint.add_argument("--base-url", default=None, help="the API root, e.g. http://127.0.0.1:8000/v1")
    endpoint.add_argument("--model", default=None, help="the model name the endpoint serves")
    endpoint.add_argument("--api-key-env", default="OPENAI_API_KEY",
                          help="environment variable holding the API key (default OPENAI_API_KEY; unset = no key)")
    endpoint.add_argument("--concurrency", type=positive_int, default=1,
                          help="episodes in flight at once, each with its own environment (default 1)")
    endpoint.add_argument("--timeout", type=positive_float, default=60.0,
                          help="seconds per request before it is retried (default 60)")
    endpoint.add_argument("--max-retries", type=nonnegative_int, default=2,
                          help="retries of a failed request, with exponential backoff (default 2)")
    endpoint.add_argument("--temperature", type=nonnegative_float, default=0.0,
                          help="sampling temperature (default 0: greedy)")
    endpoint.add_argument("--max-tokens", type=positive_int, default=512, help="most tokens per turn (default 512)")
    endpoint.add_argument("--tool-schemas", choices=["training", "openai"], default="training",
                          help="training (default): the tool schemas exactly as training renders them; openai: "
                               "without their non-standard 'return' entry, for endpoints that refuse it")
    endpoint.add_argument("--chat-template-kwargs", type=json_object, default=None,
                          help="""JSON template variables sent with each request, e.g. '{"enable_thinking": false}' """
                               "(vLLM, transformers serve; default: none)")
    ev.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    """Play the episodes with the chosen policy; print a table (or `--json`), save them with `--out`."""
    from sqlenv.evaluation.evaluate import all_questions, evaluate
    from sqlenv.evaluation.policies import OraclePolicy, RandomPolicy

    endpoint = _endpoint_settings(args)  # bad flags before the dataset is opened
    make_env, info, split = env_factory(args.dataset, args.split, args.budget)
    episodes = args.episodes
    if episodes is None:  # the dataset's protocol: spider_dev scores every dev question, as published results do
        protocol = (getattr(info, "meta", None) or {}).get("eval_episodes")
        episodes = "all" if protocol == "all" and split == "eval" else 50
    if args.out:
        _check_eval_out(Path(args.out))
    progress = None
    if not args.json and sys.stderr.isatty():
        def progress(done: int, total: int, _t: dict) -> None:
            sys.stderr.write(f"\r{done}/{total} episodes")
            sys.stderr.flush()
            if done == total:
                sys.stderr.write("\n")
    env = make_env()
    try:
        question_ids = all_questions(env) if episodes == "all" else None
        n_episodes = None if episodes == "all" else episodes
        wall_s = 0.0
        if endpoint is not None:
            started = time.perf_counter()
            result = _evaluate_endpoint(endpoint, make_env, n_episodes, args.seed, args.concurrency, progress,
                                        question_ids)
            wall_s = time.perf_counter() - started
        else:
            policy = OraclePolicy() if args.policy == "oracle" else RandomPolicy(seed=args.seed)
            result = evaluate(env, policy, n_episodes=n_episodes, seed=args.seed, progress_callback=progress,
                              question_ids=question_ids)
    finally:
        env.close()
    served = {}
    if endpoint is not None:  # what was evaluated, and how fast; never the key
        served = {"endpoint": endpoint.describe(), "concurrency": args.concurrency,
                  "usage": _total_usage(result.episodes, wall_s)}
    if args.transcripts:
        path = Path(args.transcripts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            for ep in result.episodes:
                fh.write(json.dumps(ep, default=str) + "\n")
    question_order = "all" if episodes == "all" else "seeded"
    if args.out:
        from sqlenv.evaluation.saved import save_evaluation

        try:
            save_evaluation(result, args.out, dataset=info.name, split=split, step_budget=args.budget,
                            question_order=question_order, extra=served)
        except (ValueError, OSError) as exc:
            raise CLIError(one_line(exc)) from None
    summary = result.to_dict(include_episodes=False)
    summary.update({"dataset": info.name, "split": split, "step_budget": args.budget,
                    "question_order": question_order, **served})
    if args.json:
        print(json.dumps(summary), file=out)
        return 0
    print(f"dataset {info.name} · split {split} · policy {result.policy} · {result.n_episodes} episodes"
          f"{' (every question once)' if episodes == 'all' else ''} · seed {args.seed} · budget {args.budget}",
          file=out)
    ex = result.execution_accuracy
    rows = [
        ("success rate", f"{result.success_rate:.1%}"),
        ("execution acc", f"{ex:.1%}" if ex is not None else "–"),
        ("avg reward", f"{result.avg_reward:.3f}"),
        ("avg steps", f"{result.avg_steps:.2f}"),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(result.outcomes().items()))),
    ]
    for label, value in rows:
        print(f"  {label:<13} {value}", file=out)
    cells = summary["breakdown"]
    print(_breakdown_table("hardness", {"all": cells["overall"], **cells["hardness"]}), file=out)
    print(_breakdown_table("database", cells["database"]), file=out)
    if endpoint is not None:
        usage = summary["usage"]
        print(f"  {'usage':<13} {usage['requests']} requests, {usage['prompt_tokens']} prompt + "
              f"{usage['completion_tokens']} completion tokens, {usage['latency_s_per_request']:.3f} s per request, "
              f"{usage['episodes_per_s']:.2f} episodes/s", file=out)
        if usage["requests"] and not usage["tool_calls"]:
            print(f"  {'warning':<13} the model made no tool calls; its text was read as actions", file=out)
    if result.n_errors:
        first = next(ep for ep in result.episodes if ep.get("outcome") == "error")
        print(f"  {'errors':<13} {result.n_errors} (first: {first.get('error')})", file=out)
    if args.transcripts:
        print(f"  transcripts   {args.transcripts}", file=out)
    if args.out:
        print(f"  saved         {args.out}", file=out)
    return 0


def _check_eval_out(path: Path) -> None:
    """Refuse a bad --out before playing (an evaluation can take minutes)."""
    from sqlenv.evaluation.saved import is_saved_evaluation

    if path.exists() and not is_saved_evaluation(path) and (not path.is_dir() or any(path.iterdir())):
        raise CLIError(f"{path} exists and is not a saved evaluation; choose another --out")


def _pct(rate: float | None, ci: list | None) -> str:
    if rate is None:
        return "–"
    return f"{rate:6.1%} [{ci[0]:.0%}–{ci[1]:.0%}]" if ci else f"{rate:6.1%}"


def _breakdown_table(title: str, cells: dict) -> str:
    """One line per cell: episodes, success and EX with their 95% intervals."""
    width = max([len(title)] + [len(str(k)) for k in cells]) + 2
    lines = [f"  {title:<{width}} {'episodes':>8}  {'success [95% CI]':<22} {'EX [95% CI]':<22}"]
    for key, cell in cells.items():
        lines.append(f"  {str(key):<{width}} {cell['n']:>8}  {_pct(cell['success_rate'], cell['success_ci']):<22} "
                     f"{_pct(cell['execution_accuracy'], cell['execution_ci']):<22}")
    return "\n".join(lines)


def _endpoint_settings(args: argparse.Namespace):
    """The `--policy openai` settings from the flags (None for the other policies); bad flags are CLIErrors."""
    endpoint_flags = ("base_url", "model")
    if args.policy != "openai":
        given = [f"--{name.replace('_', '-')}" for name in endpoint_flags if getattr(args, name) is not None]
        if args.concurrency != 1:
            given.append("--concurrency")
        if given:
            raise CLIError(f"{', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} to --policy openai")
        return None
    missing = [f"--{name.replace('_', '-')}" for name in endpoint_flags if not getattr(args, name)]
    if missing:
        raise CLIError(f"--policy openai needs {' and '.join(missing)}")
    from sqlenv.evaluation.openai_policy import EndpointSettings

    try:
        return EndpointSettings(base_url=args.base_url, model=args.model, api_key_env=args.api_key_env,
                                timeout=args.timeout, max_retries=args.max_retries, temperature=args.temperature,
                                max_tokens=args.max_tokens, tool_schemas=args.tool_schemas,
                                chat_template_kwargs=args.chat_template_kwargs)
    except ValueError as exc:
        raise CLIError(one_line(exc)) from None


def _evaluate_endpoint(endpoint: Any, make_env: Any, n_episodes: int | None, seed: int, concurrency: int,
                       progress: Any, question_ids: list[str] | None = None):
    """Play the episodes with `OpenAIPolicy`, `concurrency` at a time (episode i: seed + i, or `question_ids[i]`);
    an unusable endpoint is a CLIError."""
    from sqlenv.evaluation.concurrent import evaluate_concurrently
    from sqlenv.evaluation.openai_policy import EndpointError, OpenAIPolicy

    try:
        return evaluate_concurrently(make_env, lambda: OpenAIPolicy(endpoint), n_episodes=n_episodes, seed=seed,
                                     concurrency=concurrency, progress_callback=progress, question_ids=question_ids)
    except EndpointError as exc:
        raise CLIError(one_line(exc)) from None


def _total_usage(episodes: list[dict], wall_s: float) -> dict[str, Any]:
    """Requests, tokens and latency summed over the episodes' "usage"; seconds per request and episodes per second
    of the whole evaluation (`wall_s`, all workers together)."""
    keys = ("requests", "prompt_tokens", "completion_tokens", "total_tokens", "tool_calls", "text_turns")
    total: dict[str, Any] = {key: sum(int((ep.get("usage") or {}).get(key, 0)) for ep in episodes) for key in keys}
    latency = sum(float((ep.get("usage") or {}).get("latency_s", 0.0)) for ep in episodes)
    total["latency_s_per_request"] = round(latency / total["requests"], 4) if total["requests"] else 0.0
    total["wall_s"] = round(wall_s, 4)
    total["episodes_per_s"] = round(len(episodes) / wall_s, 4) if wall_s > 0 else 0.0
    return total
