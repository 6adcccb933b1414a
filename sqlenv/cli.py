"""`python -m sqlenv …` (also the `sqlenv` console script): datasets, an interactive episode, evaluation.

    python -m sqlenv data build-builtin
    python -m sqlenv data prepare spider --source ../shared/spider --preset spider10 --out data/spider10
    python -m sqlenv data download spider --out ../shared/spider
    python -m sqlenv data list
    python -m sqlenv play --dataset builtin --split eval
    python -m sqlenv data prepare spider --preset spider_dev        # Spider's own train / dev split
    python -m sqlenv eval --dataset builtin --split eval --policy oracle --episodes 50 --seed 0 [--json]
    python -m sqlenv eval --dataset spider_dev --policy random --out runs/evaluations/random-spider-dev
    python -m sqlenv eval --policy openai --base-url http://127.0.0.1:8000/v1 --model NAME --concurrency 8
    python -m sqlenv serve --dataset builtin --split train --host 127.0.0.1 --port 8000   # needs sqlenv[server]

Wherever a dataset is named, `builtin`, a name prepared under `data/` ($SQLENV_DATA_DIR) or the path of a
prepared dataset directory works. Bad input of any kind (arguments, datasets, splits, paths) is reported as
one line on stderr with exit code 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

PROG = "sqlenv"
EXIT_USAGE = 2


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage block) so scripts and humans see just what is wrong."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}")
    return value


def _episodes(text: str) -> int | str:
    if text.strip().lower() == "all":
        return "all"
    return _positive_int(text)


def _nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _nonnegative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="SQLEnv: a sandboxed SQL-exploration environment.")
    commands = parser.add_subparsers(dest="command", metavar="{data,play,eval,serve}", required=True)

    # data ------------------------------------------------------------------------------------------
    data = commands.add_parser("data", help="build, prepare, download and list datasets")
    data_cmds = data.add_subparsers(dest="data_command", metavar="{build-builtin,prepare,download,list}", required=True)

    build = data_cmds.add_parser("build-builtin", help="generate the built-in offline dataset")
    build.add_argument("--out", default=None, help="output directory (default: <data root>/builtin)")
    build.add_argument("--seed", type=_int, default=0, help="generation seed (default 0)")

    prepare = data_cmds.add_parser("prepare", help="prepare a dataset from a source corpus")
    prepare.add_argument("source_kind", choices=["spider"], help="the corpus (only spider)")
    prepare.add_argument("--source", default=None,
                         help="Spider 1.0 directory (default: $SQLENV_SPIDER_DIR or ../shared/spider)")
    group = prepare.add_mutually_exclusive_group()
    group.add_argument("--preset", choices=["spider10", "spider_dev"], default=None,
                       help="spider10: 10 databases re-split 70/30; spider_dev: Spider's own split (train_spider.json "
                            "for train, all of dev.json for eval)")
    group.add_argument("--db-ids", default=None, help="comma-separated Spider db ids, or 'all'")
    prepare.add_argument("--out", default=None, help="output directory (default: <data root>/<preset or 'spider'>)")
    prepare.add_argument("--seed", type=_int, default=0, help="split seed (default 0)")

    download = data_cmds.add_parser("download", help="download a source corpus")
    download.add_argument("source_kind", choices=["spider"], help="the corpus (only spider)")
    download.add_argument("--url", default=None, help="archive URL (default: the official Spider 1.0 archive)")
    download.add_argument("--out", required=True, help="directory to extract into")

    data_cmds.add_parser("list", help="list prepared datasets")

    # play ------------------------------------------------------------------------------------------
    play = commands.add_parser("play", help="play one episode in the terminal")
    play.add_argument("--dataset", default="builtin", help="dataset name or path (default: builtin)")
    play.add_argument("--split", default=None, help="split (default: eval if the dataset has it, else its first)")
    play.add_argument("--question-id", default=None, help="play this question (default: drawn from --seed)")
    play.add_argument("--seed", type=_int, default=None, help="seed that draws the question")
    play.add_argument("--budget", type=_positive_int, default=15, help="step budget (default 15)")

    # eval ------------------------------------------------------------------------------------------
    ev = commands.add_parser("eval", help="evaluate a baseline policy or a model behind an OpenAI-compatible endpoint")
    ev.add_argument("--dataset", default="builtin", help="dataset name or path (default: builtin)")
    ev.add_argument("--split", default="eval", help="split (default: eval)")
    ev.add_argument("--policy", choices=["oracle", "random", "openai"], default="oracle",
                    help="policy (default: oracle); openai: a model behind an OpenAI-compatible endpoint")
    ev.add_argument("--episodes", type=_episodes, default=None,
                    help="number of episodes drawn by seed, or 'all': every question of the split once (default 50; "
                         "'all' on the eval split of datasets whose protocol scores all of it, such as spider_dev)")
    ev.add_argument("--seed", type=_int, default=0, help="episode i plays reset(seed=seed+i) (default 0)")
    ev.add_argument("--budget", type=_positive_int, default=15, help="step budget (default 15)")
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
    endpoint.add_argument("--concurrency", type=_positive_int, default=1,
                          help="episodes in flight at once, each with its own environment (default 1)")
    endpoint.add_argument("--timeout", type=_positive_float, default=60.0,
                          help="seconds per request before it is retried (default 60)")
    endpoint.add_argument("--max-retries", type=_nonnegative_int, default=2,
                          help="retries of a failed request, with exponential backoff (default 2)")
    endpoint.add_argument("--temperature", type=_nonnegative_float, default=0.0,
                          help="sampling temperature (default 0: greedy)")
    endpoint.add_argument("--max-tokens", type=_positive_int, default=512, help="most tokens per turn (default 512)")
    endpoint.add_argument("--tool-schemas", choices=["training", "openai"], default="training",
                          help="training (default): the tool schemas exactly as training renders them; openai: "
                               "without their non-standard 'return' entry, for endpoints that refuse it")
    endpoint.add_argument("--chat-template-kwargs", type=_json_object, default=None,
                          help="""JSON template variables sent with each request, e.g. '{"enable_thinking": false}' """
                               "(vLLM, transformers serve; default: none)")

    # serve -----------------------------------------------------------------------------------------
    srv = commands.add_parser("serve", help="serve the environment over HTTP/WebSocket (OpenEnv; needs sqlenv[server])")
    srv.add_argument("--dataset", default="builtin", help="dataset name or path (default: builtin)")
    srv.add_argument("--split", default="train", help="split served (default: train)")
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; 0.0.0.0 in a container)")
    srv.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    srv.add_argument("--budget", type=_positive_int, default=15,
                     help="step budget when a reset asks for none (default 15)")
    srv.add_argument("--max-sessions", type=_positive_int, default=64,
                     help="most concurrent WebSocket sessions (default 64)")
    srv.add_argument("--session-timeout", type=_positive_float, default=600.0,
                     help="seconds an idle session is kept before the server closes it (default 600)")
    srv.add_argument("--request-timeout", type=_positive_float, default=10.0,
                     help="seconds a connection has to send a request head, and a POST its body, before the server "
                          "closes it (default 10)")
    srv.add_argument("--web", action="store_true", help="also serve OpenEnv's playground page at /web")
    srv.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="warning",
                     help="uvicorn log level (default warning)")
    return parser


# ---------------------------------------------------------------------------------------------------
# helpers


def _resolve(name_or_path: str):
    from sqlenv.datasets import resolve_dataset

    try:
        return resolve_dataset(name_or_path)
    except ValueError as exc:  # DatasetNotFoundError is a ValueError
        raise CLIError(_one_line(exc)) from None


def _make_env(dataset: str, split: str | None, budget: int):
    make_env, info, split = _env_factory(dataset, split, budget)
    return make_env(), info, split


def _env_factory(dataset: str, split: str | None, budget: int):
    """(a function returning a new environment on the split, dataset info, split), bad input checked once."""
    from functools import partial

    from sqlenv.environment import SQLEnvironment

    info = _resolve(dataset)
    splits = list(getattr(info, "splits", []) or [])
    if split is None:
        split = "eval" if "eval" in splits else (splits[0] if splits else "eval")
    try:
        questions_path = info.questions_path(split)
    except ValueError as exc:
        raise CLIError(_one_line(exc)) from None
    if not Path(questions_path).exists():
        raise CLIError(f"dataset {info.name!r} has no split {split!r} (missing {questions_path})")
    return partial(SQLEnvironment, questions_path=questions_path, db_dir=info.db_dir, step_budget=budget), info, split


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------------
# data


def _cmd_build_builtin(args: argparse.Namespace, out: TextIO) -> int:
    from sqlenv.builtin import build_builtin
    from sqlenv.datasets import data_root

    target = Path(args.out) if args.out else data_root() / "builtin"
    info = build_builtin(target, seed=args.seed)
    print(f"built-in dataset written to {info.root}", file=out)
    _print_dataset_line(info, out)
    return 0


def _cmd_prepare(args: argparse.Namespace, out: TextIO) -> int:
    from sqlenv.datasets import data_root
    from sqlenv.spider import default_spider_dir, prepare_spider

    source = Path(args.source) if args.source else default_spider_dir()
    if not source.is_dir():
        raise CLIError(f"Spider source directory not found: {source}")
    if not (source / "tables.json").exists():
        raise CLIError(f"{source} does not look like Spider 1.0 (no tables.json)")
    db_ids: Any = None
    if args.db_ids:
        db_ids = "all" if args.db_ids.strip().lower() == "all" else [d.strip() for d in args.db_ids.split(",") if d.strip()]
        if not db_ids:
            raise CLIError("--db-ids is empty")
    if db_ids is None and args.preset is None:
        raise CLIError("say which databases: --preset spider10 or --db-ids a,b,... (or 'all')")
    target = Path(args.out) if args.out else data_root() / (args.preset or "spider")
    try:
        info = prepare_spider(source, target, db_ids=db_ids, preset=args.preset, seed=args.seed)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise CLIError(_one_line(exc)) from None
    print(f"prepared {info.name!r} in {info.root}", file=out)
    _print_dataset_line(info, out)
    return 0


def _cmd_download(args: argparse.Namespace, out: TextIO) -> int:
    from sqlenv.spider import download_spider

    kwargs = {"url": args.url} if args.url else {}
    try:
        path = download_spider(out=Path(args.out), **kwargs)
    except ValueError as exc:
        raise CLIError(_one_line(exc)) from None
    print(f"Spider extracted to {path}", file=out)
    return 0


def _dataset_meta(root: Path) -> dict:
    try:
        return json.loads((Path(root) / "dataset.json").read_text())
    except (OSError, ValueError):
        return {}


def _print_dataset_line(info: Any, out: TextIO) -> None:
    meta = getattr(info, "meta", None) or _dataset_meta(info.root)
    counts = getattr(info, "counts", None) or meta.get("counts") or {}
    splits = list(getattr(info, "splits", None) or meta.get("splits") or [])
    split_text = ", ".join(f"{s} {counts[s]}" if s in counts else s for s in splits)
    source = getattr(info, "source", "") or meta.get("source", "")
    print(f"  {info.name:<16} {source:<10} {split_text:<44} {info.root}", file=out)


def _cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    from sqlenv.datasets import data_root, list_datasets

    infos = list_datasets()
    print(f"datasets under {data_root()}:", file=out)
    names = set()
    for info in infos:
        names.add(info.name)
        _print_dataset_line(info, out)
    if "builtin" not in names:
        print("  builtin          (built on first use, or: python -m sqlenv data build-builtin)", file=out)
    return 0


# ---------------------------------------------------------------------------------------------------
# play

PLAY_HELP = """\
Type one action per line:
  DESCRIBE <table>     columns, keys and row count
  SAMPLE <table>       the first rows
  QUERY <sql>          one read-only SELECT
  ANSWER <value>       ends the episode (lists: a, b, c; tables: rows 'a | 1\\nb | 2' with a typed \\n, or JSON)
  help                 this text;  quit   give up and see the gold answer"""


def _format_layers(layers: Any) -> str:
    data = layers.to_dict() if hasattr(layers, "to_dict") else dict(layers)
    return ", ".join(f"{k} {data.get(k, 0.0):+.3f}" for k in ("operational", "progress", "terminal"))


def _cmd_play(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    from sqlenv.types import SQLAction

    env, info, split = _make_env(args.dataset, args.split, args.budget)
    if args.question_id is not None:
        known = {q.question_id for q in env.questions}
        if args.question_id not in known:
            raise CLIError(f"no question {args.question_id!r} in {info.name}/{split} ({len(known)} questions)")
        obs = env.reset(question_id=args.question_id)
    else:
        obs = env.reset(seed=args.seed)
    q = env.question
    interactive = inp.isatty()
    print(f"dataset {info.name} / {split} · question {q.question_id} · database {q.database_name} · "
          f"difficulty {q.difficulty} · answer type {q.answer_type}", file=out)
    print(f"\nQuestion: {obs.question}\n\n{obs.schema_info}\n", file=out)
    print(f"Budget: {obs.budget_remaining} steps.  Type 'help' for the actions.", file=out)

    while not obs.done:
        if interactive:
            out.write("> ")
            out.flush()
        line = inp.readline()
        if not line:  # end of input
            print("\n(end of input)", file=out)
            break
        line = line.strip()
        if not line:
            continue
        word, _, rest = line.partition(" ")
        if word.lower() in {"quit", "exit", "q"}:
            break
        if word.lower() in {"help", "?"}:
            print(PLAY_HELP, file=out)
            continue
        if word.lower() == "schema":
            print(obs.schema_info, file=out)
            continue
        if not interactive:
            print(f"> {line}", file=out)
        argument = rest.strip()
        if word.upper() == "ANSWER":
            argument = argument.replace("\\n", "\n")  # one terminal line can still hold a multi-row table answer
        obs = env.step(SQLAction(word, argument))
        if obs.error:
            print(f"error: {obs.error}", file=out)
        if obs.result:
            print(obs.result, file=out)
        print(f"[reward {obs.reward:+.3f} ({_format_layers(obs.reward_layers)}) · "
              f"step {obs.step_count} · budget left {obs.budget_remaining}]", file=out)

    transcript = env.transcript()
    print("\n=== episode over ===", file=out)
    print(f"outcome: {transcript.get('outcome')}  ·  total reward {float(transcript.get('total_reward', 0.0)):.3f}", file=out)
    breakdown = transcript.get("reward_breakdown") or {}
    if breakdown:
        print("breakdown: " + ", ".join(f"{k} {float(v):.3f}" for k, v in breakdown.items()), file=out)
    from sqlenv.verifier import format_answer

    print(f"gold SQL: {q.gold_sql}", file=out)
    print(f"gold answer: {format_answer(q.gold_answer, q.answer_type)}", file=out)
    return 0


# ---------------------------------------------------------------------------------------------------
# eval


def _cmd_eval(args: argparse.Namespace, out: TextIO) -> int:
    from sqlenv.evaluation import all_questions, evaluate
    from sqlenv.policies import OraclePolicy, RandomPolicy

    endpoint = _endpoint_settings(args)  # bad flags before the dataset is opened
    make_env, info, split = _env_factory(args.dataset, args.split, args.budget)
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
        from sqlenv.saved_evaluation import save_evaluation

        try:
            save_evaluation(result, args.out, dataset=info.name, split=split, step_budget=args.budget,
                            question_order=question_order, extra=served)
        except (ValueError, OSError) as exc:
            raise CLIError(_one_line(exc)) from None
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
    from sqlenv.saved_evaluation import is_saved_evaluation

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
    from sqlenv.openai_policy import EndpointSettings

    try:
        return EndpointSettings(base_url=args.base_url, model=args.model, api_key_env=args.api_key_env,
                                timeout=args.timeout, max_retries=args.max_retries, temperature=args.temperature,
                                max_tokens=args.max_tokens, tool_schemas=args.tool_schemas,
                                chat_template_kwargs=args.chat_template_kwargs)
    except ValueError as exc:
        raise CLIError(_one_line(exc)) from None


def _evaluate_endpoint(endpoint: Any, make_env: Any, n_episodes: int | None, seed: int, concurrency: int,
                       progress: Any, question_ids: list[str] | None = None):
    """Play the episodes with `OpenAIPolicy`, `concurrency` at a time (episode i: seed + i, or `question_ids[i]`);
    an unusable endpoint is a CLIError."""
    from sqlenv.concurrent_evaluation import evaluate_concurrently
    from sqlenv.openai_policy import EndpointError, OpenAIPolicy

    try:
        return evaluate_concurrently(make_env, lambda: OpenAIPolicy(endpoint), n_episodes=n_episodes, seed=seed,
                                     concurrency=concurrency, progress_callback=progress, question_ids=question_ids)
    except EndpointError as exc:
        raise CLIError(_one_line(exc)) from None


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


# ---------------------------------------------------------------------------------------------------


def _cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    info = _resolve(args.dataset)  # bad input first: the server stack takes seconds to import
    try:
        info.questions_path(args.split)
    except ValueError as exc:
        raise CLIError(_one_line(exc)) from None
    try:
        from sqlenv.server.app import serve
        from sqlenv.server.environment import ServerConfig
    except ImportError as exc:
        raise CLIError(_one_line(exc)) from None
    try:
        config = ServerConfig.from_dataset(info.root, split=args.split, step_budget=args.budget)
    except ValueError as exc:
        raise CLIError(_one_line(exc)) from None
    serve(config, host=args.host, port=args.port, max_sessions=args.max_sessions, web=args.web,
          log_level=args.log_level, session_timeout_s=args.session_timeout, request_timeout_s=args.request_timeout)
    return 0


# ---------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 failure, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    out = stdout or sys.stdout
    inp = stdin or sys.stdin
    try:
        if args.command == "data":
            handler = {
                "build-builtin": _cmd_build_builtin,
                "prepare": _cmd_prepare,
                "download": _cmd_download,
                "list": _cmd_list,
            }[args.data_command]
            return handler(args, out)
        if args.command == "play":
            return _cmd_play(args, out, inp)
        if args.command == "eval":
            return _cmd_eval(args, out)
        if args.command == "serve":
            return _cmd_serve(args, out)
    except CLIError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback; SQLENV_DEBUG=1 shows it
        if os.environ.get("SQLENV_DEBUG"):
            raise
        print(f"{PROG}: error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command!r}")
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
