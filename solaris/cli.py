"""The ``solaris`` command line: data generation, training, export, the FM check, and the
commands registered by name (the demo, the replay, the closed loop, the estimate, the
transfer report).

The product's commands are defined here. The research commands live above the core and are
registered in ``pyproject.toml`` (entry-point group ``solaris.commands``: a command name and
the ``module:object`` of its ``Command``); this module looks them up by name when it builds
its parser and imports none of them itself, so the core never imports the jobs or the app.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from solaris.config import parse_overrides
from solaris.errors import SolarisError
from solaris.registry import entries

log = logging.getLogger("solaris")


def config_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None):
    """The config tree of a command's ``--config``, ``--dataset``, ``--data-dir`` and
    ``--set`` (``extra``: overrides under the user's ``--set``)."""
    from solaris.config import load_config

    ov = dict(extra or {})
    if getattr(args, "dataset", None):
        ov["data.dataset"] = args.dataset
    if getattr(args, "data_dir", None):
        ov["data.data_dir"] = str(args.data_dir)
    ov.update(parse_overrides(getattr(args, "set", None) or []))
    return load_config(getattr(args, "config", None), ov)


class Bar:
    """A tqdm bar that advances one step per reported stage."""

    def __init__(self, total: int, desc: str):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)

    def __call__(self, msg: str) -> None:
        self.bar.set_postfix_str(msg[:60])
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def load_data(cfg, fetch: bool):
    """The config's dataset (``fetch``: MovieLens into the cache dir where missing)."""
    from solaris.data.load import load_dataset

    return load_dataset(cfg.data, fetch=fetch)


def cmd_train(args: argparse.Namespace) -> int:
    from solaris.train.artifacts import fm_warnings, train_artifacts, train_steps

    cfg = config_from_args(args)
    ds = load_data(cfg, args.fetch)
    bar = Bar(train_steps(ds), f"train {ds.name}")
    try:
        manifest = train_artifacts(cfg, ds, args.out, seed=args.seed, coverage=args.coverage,
                                   progress=bar, base_dir=args.keep_vm_alone)
    finally:
        bar.close()
    for task, v in manifest["vms"].items():
        print(f"{task}: VM test BCE {v['test_bce']:.4f} AUC {v['test_auc']:.4f}, "
              f"VM alone {v['vm_alone_test_bce']:.4f}, FM {v['fm_test_bce']:.4f}")
    for line in fm_warnings(manifest):
        print(line)
    print(f"wrote artifacts of version {manifest['version']} to {args.out}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from solaris.data.synthetic import generate_to_parquet

    cfg = config_from_args(args, {"data.synthetic.target_interactions": args.interactions,
                                  "data.synthetic.seed": args.seed})
    bar = tqdm(total=cfg.data.synthetic.target_interactions, unit="rows", desc="generating")
    last = [0]

    def tick(n: int) -> None:
        bar.update(n - last[0])
        last[0] = n

    try:
        info = generate_to_parquet(cfg.data.synthetic, args.out, progress=tick)
    finally:
        bar.close()
    print(json.dumps(info, indent=2, default=str))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A dataset (synthetic, MovieLens or generic) written as a generic log directory: an
    impression log where it has requests, else an interaction log, the side tables and the
    mapping YAML that `--dataset generic --data-dir OUT` loads back to the same dataset."""
    from solaris.data.export import export_generic

    ds = load_data(config_from_args(args), getattr(args, "fetch", False))
    path = export_generic(ds, args.out, string_ids=args.string_ids)
    kind = "impression" if ds.requests is not None else "interaction"
    print(f"wrote {ds.name} as a generic {kind} log: {path} "
          f"({ds.interactions.num_rows} interactions"
          + ("" if ds.requests is None else f", {ds.requests.num_rows} requests") + ")")
    return 0


def cmd_check_fm(args: argparse.Namespace) -> int:
    """``solaris check-fm``: every probe of ``solaris.models.check`` on an FM class; exit 1
    naming each broken promise."""
    from solaris.models.check import check_fm

    cfg = config_from_args(args)
    path = args.fm or cfg.fm.cls
    report = check_fm(path, cfg, seed=args.seed)
    for p in report.problems:
        print(f"FAIL  {p}")
    for name in report.passed:
        print(f"ok    {name}")
    if report.ok:
        print(f"{path}: every probe held; reads users it never saw (reads_unseen_users): "
              f"{'yes' if report.reads_unseen_users else 'no'}")
        return 0
    print(f"{path}: {len(report.problems)} problem(s); the inputs' coding: "
          "docs/reference/fm-inputs.md")
    return 1


def add_common(sp: argparse.ArgumentParser, dataset: bool = True) -> None:
    """The options most commands share: ``--config`` and ``--set``; with ``dataset``, the
    dataset's ``--dataset``, ``--data-dir`` and ``--fetch`` (read by ``config_from_args``)."""
    sp.add_argument("--config", help="YAML config (see configs/default.yaml)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a config field, e.g. --set fm.emb_dim=32")
    if dataset:
        sp.add_argument("--dataset", choices=["synthetic", "movielens", "generic"])
        sp.add_argument("--data-dir", type=Path,
                        help="MovieLens-100K dir (RecBole or GroupLens format) or generic YAML")
        sp.add_argument("--fetch", action="store_true",
                        help="movielens without --data-dir: fetch it into the cache dir")


@dataclass(frozen=True)
class Command:
    """A command registered under ``COMMANDS``: its one-line help, what adds its options (and
    its own sub-commands) to its parser, and what runs it (the exit code)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS = "solaris.commands"  # the entry-point group: command name = "module:Command"


def registered() -> dict[str, tuple[str, Command]]:
    """The commands the installed packages register under ``COMMANDS``, by name, each with
    the module that defines it. An entry that is not a ``Command`` is an error naming it."""
    out = {}
    for ep in entries(COMMANDS).values():
        cmd = ep.load()
        if not isinstance(cmd, Command):
            raise SolarisError(f"command {ep.name!r} ({ep.value}): not a solaris.cli.Command")
        out[ep.name] = (ep.module, cmd)
    return out


def build_parser() -> argparse.ArgumentParser:
    """Every command: the product's, then the registered ones (``registered``) by name."""
    p = argparse.ArgumentParser(prog="solaris", description=__doc__.split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and Ray's own logs on the console")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train FM, encoder and one serving VM per task")
    add_common(t)
    t.add_argument("--out", required=True, type=Path)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--coverage", type=float, default=0.5,
                   help="pair coverage the manifest's test figure is measured at")
    t.add_argument("--keep-vm-alone", metavar="ARTIFACTS",
                   help="a new FM version: keep the VMs alone of these artifacts (a directory "
                   "or pyarrow.fs URI) and retrain only what reads the FM (FM, encoder, "
                   "corrections)")
    t.set_defaults(fn=cmd_train)

    d = sub.add_parser("data", help="generate synthetic data to Parquet (streams in chunks)")
    add_common(d, dataset=False)
    d.add_argument("--out", required=True, type=Path)
    d.add_argument("--interactions", type=int, default=60_000)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(fn=cmd_data)

    ex = sub.add_parser("export", help="write a dataset as a generic log (impressions or "
                        "interactions, side tables, mapping.yaml)")
    add_common(ex)
    ex.add_argument("--out", required=True, type=Path)
    ex.add_argument("--string-ids", action="store_true",
                    help="user and item ids as opaque strings whose order is not the codes' "
                    "(what a team's log often holds); the rows and codes are the same")
    ex.set_defaults(fn=cmd_export)

    chk = sub.add_parser("check-fm", help="probe an FM class against the interface and the "
                         "input contract on a small synthetic world (exit 1 naming each "
                         "broken promise)")
    add_common(chk, dataset=False)
    chk.add_argument("fm", nargs="?", metavar="MODULE:CLASS",
                     help="the FM class (default: the config's fm.cls); the config's fm "
                     "section gives its kwargs and version")
    chk.add_argument("--seed", type=int, default=0, help="the world's and the weights' seed")
    chk.set_defaults(fn=cmd_check_fm)

    commands = registered()
    for name, (_, cmd) in commands.items():
        if name in sub.choices:
            raise SolarisError(f"command {name!r}: registered under {COMMANDS}, but the "
                               "product has a command of that name")
        sp = sub.add_parser(name, help=cmd.help)
        cmd.add_arguments(sp)
        sp.set_defaults(fn=cmd.run)
    if not commands:
        p.epilog = (f"No commands are registered under {COMMANDS}: install the package "
                    "(pip install -e .) for the demo, the replay and the other research "
                    "commands.")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except SolarisError as e:
        print(f"solaris: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # ``python -m solaris.cli``: run the imported module's ``main``, not this ``__main__``
    # copy, whose ``Command`` is not the class the registered commands are instances of
    from solaris.cli import main as cli_main

    sys.exit(cli_main())
