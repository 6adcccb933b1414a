"""`python -m sqlenv data …`: build the built-in dataset, prepare Spider, download Spider, list datasets.

    python -m sqlenv data build-builtin
    python -m sqlenv data prepare spider --source ../shared/spider --preset spider10 --out data/spider10
    python -m sqlenv data prepare spider --preset spider_dev        # Spider's own train / dev split
    python -m sqlenv data download spider --out ../shared/spider
    python -m sqlenv data list
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from sqlenv.cli.arguments import CLIError, integer, one_line


def add_parser(commands: Any) -> None:
    """Add `data` and its four subcommands to the top parser's `commands`."""
    data = commands.add_parser("data", help="build, prepare, download and list datasets")
    data_cmds = data.add_subparsers(dest="data_command", metavar="{build-builtin,prepare,download,list}", required=True)

    build = data_cmds.add_parser("build-builtin", help="generate the built-in offline dataset")
    build.add_argument("--out", default=None, help="output directory (default: <data root>/builtin)")
    build.add_argument("--seed", type=integer, default=0, help="generation seed (default 0)")
    build.set_defaults(run=build_builtin)

    prepare_cmd = data_cmds.add_parser("prepare", help="prepare a dataset from a source corpus")
    prepare_cmd.add_argument("source_kind", choices=["spider"], help="the corpus (only spider)")
    prepare_cmd.add_argument("--source", default=None,
                             help="Spider 1.0 directory (default: $SQLENV_SPIDER_DIR or ../shared/spider)")
    group = prepare_cmd.add_mutually_exclusive_group()
    group.add_argument("--preset", choices=["spider10", "spider_dev"], default=None,
                       help="spider10: 10 databases re-split 70/30; spider_dev: Spider's own split (train_spider.json "
                            "for train, all of dev.json for eval)")
    group.add_argument("--db-ids", default=None, help="comma-separated Spider db ids, or 'all'")
    prepare_cmd.add_argument("--out", default=None,
                             help="output directory (default: <data root>/<preset or 'spider'>)")
    prepare_cmd.add_argument("--seed", type=integer, default=0, help="split seed (default 0)")
    prepare_cmd.set_defaults(run=prepare)

    download_cmd = data_cmds.add_parser("download", help="download a source corpus")
    download_cmd.add_argument("source_kind", choices=["spider"], help="the corpus (only spider)")
    download_cmd.add_argument("--url", default=None, help="archive URL (default: the official Spider 1.0 archive)")
    download_cmd.add_argument("--out", required=True, help="directory to extract into")
    download_cmd.set_defaults(run=download)

    data_cmds.add_parser("list", help="list prepared datasets").set_defaults(run=list_command)


def build_builtin(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    from sqlenv.data.builtin import build_builtin as build
    from sqlenv.data.datasets import data_root

    target = Path(args.out) if args.out else data_root() / "builtin"
    info = build(target, seed=args.seed)
    print(f"built-in dataset written to {info.root}", file=out)
    _print_dataset_line(info, out)
    return 0


def prepare(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    from sqlenv.data.datasets import data_root
    from sqlenv.data.spider import default_spider_dir, prepare_spider

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
        raise CLIError(one_line(exc)) from None
    print(f"prepared {info.name!r} in {info.root}", file=out)
    _print_dataset_line(info, out)
    return 0


def download(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    from sqlenv.data.spider import download_spider

    kwargs = {"url": args.url} if args.url else {}
    try:
        path = download_spider(out=Path(args.out), **kwargs)
    except ValueError as exc:
        raise CLIError(one_line(exc)) from None
    print(f"Spider extracted to {path}", file=out)
    return 0


def list_command(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    from sqlenv.data.datasets import data_root, list_datasets

    infos = list_datasets()
    print(f"datasets under {data_root()}:", file=out)
    names = set()
    for info in infos:
        names.add(info.name)
        _print_dataset_line(info, out)
    if "builtin" not in names:
        print("  builtin          (built on first use, or: python -m sqlenv data build-builtin)", file=out)
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
