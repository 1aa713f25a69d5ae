"""The research commands of ``solaris``: the transfer report (``solaris report transfer``), the
event-time replay of a log through the live system (``solaris replay``: ``jobs/replay.py``),
the demo (that replay on the embedded synthetic world), the closed loop (``solaris
simulate``) and the estimate before a replay (``solaris estimate``).

Each is a ``solaris.cli.Command``, registered by name in ``pyproject.toml`` (entry-point group
``solaris.commands``); the ``solaris`` command line looks them up when it builds its parser.
The product's command line (``solaris/cli.py``) imports nothing of them: neither this module
nor the replay, the closed loop, the estimate or the reports they run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jobs import replay
from solaris import atomic
from solaris.artifact_store import local_artifacts
from solaris.cli import Bar, Command, add_common, config_from_args, load_data
from solaris.config import parse_overrides
from solaris.errors import SolarisError


def cmd_report(args: argparse.Namespace) -> int:
    from solaris.eval.render import coverage_plot, to_json, transfer_table
    from solaris.eval.ablations import ablation_steps, run_ablations
    from solaris.eval.transfer import TransferExperiment, run_transfer, transfer_steps

    cfg = config_from_args(args, {"report.seeds": args.seeds} if args.seeds else None)
    ds = load_data(cfg, args.fetch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.compare_fm:
        return _compare_fms(args, cfg, ds, out)
    ab_seeds = (args.ablation_seeds or cfg.report.seeds) if args.ablations else 0
    bar = Bar(transfer_steps(cfg, ds) + ablation_steps(ab_seeds), f"transfer {ds.name}")
    try:
        report = run_transfer(cfg, ds, progress=bar)
        if args.ablations:
            report["ablations"] = run_ablations(TransferExperiment(cfg, ds, bar), ab_seeds)
    finally:
        bar.close()
    atomic.save_text(out / "transfer.json", to_json(report))
    png = coverage_plot(report, out / "transfer_coverage.png")
    print(transfer_table(report))
    print(f"wrote {out / 'transfer.json'} and {png}")
    return 0


def _compare_fms(args: argparse.Namespace, cfg, ds, out: Path) -> int:
    """``report transfer --compare-fm``: the report of the config's FM and of each other
    FM (a config file whose ``fm`` section replaces the config's) on the same seeds."""
    import yaml

    from solaris.config import with_overrides
    from solaris.eval.render import coverage_plot, to_json, transfer_table
    from solaris.eval.transfer import compare_fms, transfer_steps

    cfgs = {cfg.fm.version: cfg}
    for path in args.compare_fm:
        fm = (yaml.safe_load(Path(path).read_text()) or {}).get("fm")
        if not isinstance(fm, dict):
            raise SolarisError(f"--compare-fm {path}: no fm section there")
        other = with_overrides(cfg, {f"fm.{k}": v for k, v in fm.items()})
        if other.fm.version in cfgs:
            raise SolarisError(f"--compare-fm {path}: fm.version={other.fm.version!r} is "
                               "already in the comparison (give each FM its own version)")
        cfgs[other.fm.version] = other
    bar = Bar(len(cfgs) * transfer_steps(cfg, ds), f"transfer {ds.name}, {len(cfgs)} FMs")
    try:
        report = compare_fms(cfgs, ds, progress=bar)
    finally:
        bar.close()
    atomic.save_text(out / "transfer.json", to_json(report))
    for label, rep in report["fms"].items():
        print(f"== FM {label}")
        print(transfer_table(rep))
        coverage_plot(rep, out / f"transfer_coverage_{label}.png")
    for pair, d in report["fm_bce_difference"].items():
        print(f"FM test BCE difference {pair}: {d['mean_diff']:.4f} (95% CI "
              f"{d['ci_low']:.4f}..{d['ci_high']:.4f})")
    print(f"wrote {out / 'transfer.json'} and a coverage plot per FM")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    return replay.run_from_args(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    """The closed loop: every arm ranks the window's requests itself and a ground truth labels
    what it shows (``solaris.replay.closed_loop``): the synthetic world's click model, or on
    MovieLens a like-model fitted on every period (``solaris.data.rating_truth``), by which
    the periods before the window are relabelled before the models train."""
    from tqdm import tqdm

    from solaris.replay.closed_loop import (SHOWN, LoopOptions, prepare, report_table,
                                            run_world, write_outputs)
    from solaris.artifacts import served_unlike_trained
    from solaris.train.artifacts import train_artifacts

    cfg = config_from_args(args)
    if cfg.data.dataset == "generic":
        raise SolarisError("--dataset generic: a closed loop needs a ground truth; use "
                           "synthetic or movielens")
    ds = load_data(cfg, getattr(args, "fetch", False))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    truth = None
    if cfg.data.dataset == "movielens":
        from solaris.data.rating_truth import relabelled

        if args.truth and not Path(args.truth).exists():
            raise SolarisError(f"--truth {args.truth}: no such file")
        truth, ds = relabelled(ds, args.truth or out / "ground_truth.npz", args.seed)
    art = local_artifacts(args.artifacts) if args.artifacts else out / "artifacts"
    if not (art / "manifest.json").exists():
        if args.artifacts:
            raise SolarisError(f"--artifacts {art}: no manifest.json there")
        print(f"training artifacts (seed {args.seed}) on the periods before the window")
        train_artifacts(cfg, ds, art, seed=args.seed, evaluation=True)
    shown = args.shown if args.shown is not None else SHOWN[cfg.data.dataset]
    opts = LoopOptions(shown=shown, explore=args.explore, seed=args.seed,
                       arms=tuple(args.arms), candidates=args.candidates,
                       **({} if args.knn_every_h is None else {"knn_every_h": args.knn_every_h}))
    from solaris.artifacts import Artifacts

    if (why := served_unlike_trained(Artifacts.open(art).manifest, cfg)):
        print(f"note: {why}")
    ctx = prepare(cfg, ds, art, opts, truth=truth)
    bar = tqdm(total=ctx.lg.num_requests * len(opts.arms), desc="closed loop", unit="req",
               dynamic_ncols=True)
    try:
        report, logs = run_world(ctx, opts, progress=bar.update)
    finally:
        bar.close()
    report["artifacts"] = str(art)
    report["dataset"] = ds.name
    if truth is not None:
        report["ground_truth"] = truth.info
    write_outputs(out, ctx, logs, report)
    print(report_table(report))
    print(f"wrote {out / 'closed_loop.json'}, {out / 'arms.npz'} and {report['plots'][0]}")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """Before deploying: the online TR, coverage and FM evaluations per 1,000 requests of a
    replay window predicted from the data before it, with the shipped artifacts
    (``solaris.replay.predict``); beside a finished replay's figures with ``--replay``."""
    from solaris.config import with_overrides
    from solaris.eval.render import to_json
    from solaris.replay.plots import estimate_plot
    from solaris.replay.predict import compare, predict, prediction_table

    art = local_artifacts(args.artifacts)  # a URI: this node's verified copy
    if not (art / "manifest.json").exists():
        raise SolarisError(f"--artifacts {art}: no manifest.json there (train with "
                           "`solaris train`)")
    online = None
    if args.replay is not None:
        path = Path(args.replay)
        path = path / "replay.json" if path.is_dir() else path
        if not path.is_file():
            raise SolarisError(f"--replay {args.replay}: no replay.json there")
        online = json.loads(path.read_text())
    ds = load_data(config_from_args(args), getattr(args, "fetch", False))
    from solaris.artifacts import Artifacts

    cfg = with_overrides(Artifacts.open(art).config, parse_overrides(args.set or []))
    bar = Bar(3 + (args.backtest is not None), "estimate")
    try:
        pred = predict(art, ds, start_ts=args.start, num_candidates=args.candidates,
                       seed=args.seed, cfg=cfg, backtest=args.backtest, say=bar)
    finally:
        bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"dataset": ds.name, "artifacts": str(art), "prediction": pred}
    if online is not None:
        report["online"] = {k: online.get(k) for k in (
            "tr_online", "tr_online_raw", "tr_online_base_calibrated", "coverage",
            "fm_evals_per_1k_requests", "window_start")}
        report["check"] = compare(pred, online)
    report["plots"] = [str(estimate_plot(pred, out / "estimate.png", online))]
    atomic.save_text(out / "estimate.json", to_json(report))
    print(prediction_table(pred, report.get("check")))
    print(f"wrote {out / 'estimate.json'} and {report['plots'][0]}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The quickstart's main job: the event-time replay of the embedded synthetic data through
    the live system (Serve, cache shards, queue, FM workers, KNN job), with its report."""
    from solaris.data.profiles import DEMO_REQUESTS, DEMO_SIZE, SERVING

    ns = replay.build_parser().parse_args(["--dataset", "synthetic", "--out", str(args.out),
                                           "--rollover-at", "0.5"])
    world = [f"data.synthetic.profile={args.profile}"] + [
        f"data.synthetic.{k}={v}" for k, v in DEMO_SIZE[args.profile].items()]
    serving = SERVING[args.profile]
    world += [f"{k}={v}" for k, v in serving.items()]
    ns.config, ns.set = args.config, world + list(args.set or [])  # the user's --set wins
    ns.lag_s = serving.get("schedule.lag_s", ns.lag_s)  # the replay's own schedule options
    ns.budget = serving.get("schedule.budget_per_hour", ns.budget)
    ns.port, ns.verbose = args.port, args.verbose
    ns.max_requests = DEMO_REQUESTS[args.profile]
    print("SOLARIS demo: generating the embedded synthetic dataset, training the FM, its "
          "encoder and the vertical models on the periods before the replay window, then "
          "replaying the window through the live system (Ray Serve over HTTP, cache shards, "
          "precompute queue, FM workers, KNN rebuilds)")
    return replay.run_from_args(ns)


# -- the commands' options ---------------------------------------------------------------
def _report_arguments(rep: argparse.ArgumentParser) -> None:
    rsub = rep.add_subparsers(dest="report", required=True)
    tr = rsub.add_parser("transfer", help="offline transfer report (temporal teacher protocol)")
    add_common(tr)
    tr.add_argument("--seeds", type=int, help="seeds (default: report.seeds)")
    tr.add_argument("--out", required=True, type=Path)
    tr.add_argument("--ablations", action="store_true", help="also run the ablations")
    tr.add_argument("--ablation-seeds", type=int, help="seeds for the ablations")
    tr.add_argument("--compare-fm", action="append", metavar="CONFIG", default=[],
                    help="another FM beside the config's, on the same seeds: a config file "
                    "whose fm section replaces the config's (repeatable)")


def _simulate_arguments(sim: argparse.ArgumentParser) -> None:
    add_common(sim)
    sim.add_argument("--out", type=Path, default=Path("runs/simulate"))
    sim.add_argument("--seed", type=int, default=0,
                     help="training seed and the ground truth's random numbers")
    sim.add_argument("--artifacts",
                     help="trained artifacts to serve, a directory or pyarrow.fs URI "
                     "(default: OUT/artifacts, trained if absent)")
    sim.add_argument("--shown", type=int,
                     help="top-ranked candidates shown (default 6 synthetic, 10 movielens)")
    sim.add_argument("--candidates", type=int, default=100,
                     help="candidates per request (movielens: the replay's retrieval)")
    sim.add_argument("--truth", type=Path,
                     help="movielens: a fitted ground truth (default: OUT/ground_truth.npz, "
                          "fitted if absent)")
    sim.add_argument("--explore", type=int, default=1, help="uniform exploration slots")
    sim.add_argument("--knn-every-h", type=float,
                     help="event hours between user-KNN rebuilds from each arm's own log "
                          "(default 72, as the replay's; 0: only the build at the window start)")
    sim.add_argument("--arms", nargs="+", default=["vm", "solaris", "fm", "oracle"],
                     choices=["vm", "solaris", "fm", "oracle"])


def _estimate_arguments(est: argparse.ArgumentParser) -> None:
    add_common(est)
    est.add_argument("--artifacts", required=True,
                     help="the artifacts to serve (solaris train / a replay's OUT/artifacts; "
                     "a directory or pyarrow.fs URI)")
    est.add_argument("--out", type=Path, default=Path("runs/estimate"))
    est.add_argument("--start", type=int,
                     help="the window's first event time (default: the artifacts' test cut)")
    est.add_argument("--candidates", type=int, default=100,
                     help="candidates per request of logs without candidate lists")
    est.add_argument("--seed", type=int, help="the request log's seed (default: the "
                     "artifacts' training seed, as the replay uses)")
    est.add_argument("--backtest", type=Path, metavar="DIR",
                     help="serve the validation period with artifacts trained before it "
                          "(into DIR) instead of the shipped ones, which were selected on it")
    est.add_argument("--replay", type=Path,
                     help="a finished replay (OUT or its replay.json) to set beside")


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    add_common(demo, dataset=False)
    demo.add_argument("--out", type=Path, default=Path("runs/demo"))
    demo.add_argument("--profile", choices=["feed", "classic"], default="feed",
                      help="the synthetic world (solaris/data/profiles.py): feed, users back "
                           "several times a day meeting most of their candidates again "
                           "(default), or classic, a handful of requests per user a month")
    demo.add_argument("--port", type=int, default=8000, help="Serve's HTTP port (loopback)")


# -- the commands, by the names pyproject.toml registers them under -------------------------
REPORT = Command("reports", _report_arguments, cmd_report)
REPLAY = Command("event-time replay of a log through the live system (jobs/replay.py)",
                 replay.add_arguments, cmd_replay)
SIMULATE = Command("closed loop: each arm ranks, a ground truth (the synthetic world's click "
                   "model, or a like-model fitted on MovieLens) labels what it shows",
                   _simulate_arguments, cmd_simulate)
ESTIMATE = Command("predict a replay window's online TR, coverage and FM cost from the data "
                   "before it (the window is not read)", _estimate_arguments, cmd_estimate)
DEMO = Command("end-to-end demo: the replay on the embedded synthetic data", _demo_arguments,
               cmd_demo)
