"""`python -m sqlenv …` (also the `sqlenv` console script): datasets, an interactive episode, evaluation, the server.

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

One module per subcommand (`data`, `play`, `eval`, `serve`): each adds its parser (`add_parser`) and runs it (`run`);
`arguments` holds the value types and the one-line error, `environments` turns a named dataset and split into
environments. Wherever a dataset is named, `builtin`, a name prepared under `data/` ($SQLENV_DATA_DIR) or the path
of a prepared dataset directory works. Bad input of any kind (arguments, datasets, splits, paths) is reported as
one line on stderr with exit code 2 — never a traceback.

May import: the rest of `sqlenv` (inside the commands, so `--help` and bad arguments stay fast), never ML code.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence, TextIO

from sqlenv.cli import data, play, serve
from sqlenv.cli import eval as eval_command
from sqlenv.cli.arguments import EXIT_USAGE, PROG, CLIError, Parser, one_line

__all__ = ["main", "build_parser", "CLIError", "PROG", "EXIT_USAGE"]

COMMANDS = (data, play, eval_command, serve)


def build_parser() -> argparse.ArgumentParser:
    """The top parser: each command module adds its own subcommand, which names its `run` function."""
    parser = Parser(prog=PROG, description="SQLEnv: a sandboxed SQL-exploration environment.")
    commands = parser.add_subparsers(dest="command", metavar="{data,play,eval,serve}", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 failure, 2 bad input).

    Args:
        argv: the arguments (default: `sys.argv[1:]`).
        stdin: what `play` reads actions from (default: `sys.stdin`).
        stdout: where results are printed (default: `sys.stdout`); errors always go to `sys.stderr`.
    """
    args = build_parser().parse_args(argv)
    out = stdout or sys.stdout
    inp = stdin or sys.stdin
    try:
        return args.run(args, out, inp)
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
        print(f"{PROG}: error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 1
