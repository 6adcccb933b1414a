"""`python -m sqlenv play`: one episode in the terminal, one action per line (stdin may be piped).

    python -m sqlenv play --dataset builtin --split eval
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from sqlenv.cli.arguments import CLIError, integer, positive_int
from sqlenv.cli.environments import env_factory

PLAY_HELP = """\
Type one action per line:
  DESCRIBE <table>     columns, keys and row count
  SAMPLE <table>       the first rows
  QUERY <sql>          one read-only SELECT
  ANSWER <value>       ends the episode (lists: a, b, c; tables: rows 'a | 1\\nb | 2' with a typed \\n, or JSON)
  help                 this text;  quit   give up and see the gold answer"""


def add_parser(commands: Any) -> None:
    """Add `play` to the top parser's `commands`."""
    play = commands.add_parser("play", help="play one episode in the terminal")
    play.add_argument("--dataset", default="builtin", help="dataset name or path (default: builtin)")
    play.add_argument("--split", default=None, help="split (default: eval if the dataset has it, else its first)")
    play.add_argument("--question-id", default=None, help="play this question (default: drawn from --seed)")
    play.add_argument("--seed", type=integer, default=None, help="seed that draws the question")
    play.add_argument("--budget", type=positive_int, default=15, help="step budget (default 15)")
    play.set_defaults(run=run)


def _format_layers(layers: Any) -> str:
    data = layers.to_dict() if hasattr(layers, "to_dict") else dict(layers)
    return ", ".join(f"{k} {data.get(k, 0.0):+.3f}" for k in ("operational", "progress", "terminal"))


def run(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    """Play one episode reading actions from `inp`; echoes each action when `inp` is not a terminal."""
    from sqlenv.types import SQLAction

    make_env, info, split = env_factory(args.dataset, args.split, args.budget)
    env = make_env()
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
    from sqlenv.scoring.verifier import format_answer

    print(f"gold SQL: {q.gold_sql}", file=out)
    print(f"gold answer: {format_answer(q.gold_answer, q.answer_type)}", file=out)
    return 0
