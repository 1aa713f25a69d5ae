"""The ``solaris`` command line: data generation, training, the transfer report, the demo."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from solaris import atomic
from solaris.artifact_store import local_artifacts
from solaris.config import parse_overrides
from solaris.errors import SolarisError

log = logging.getLogger("solaris")


def _config(args: argparse.Namespace, extra: dict[str, Any] | None = None):
    from solaris.config import load_config

    ov = dict(extra or {})
    if getattr(args, "dataset", None):
        ov["data.dataset"] = args.dataset
    if getattr(args, "data_dir", None):
        ov["data.data_dir"] = str(args.data_dir)
    ov.update(parse_overrides(getattr(args, "set", None) or []))
    return load_config(getattr(args, "config", None), ov)


class _Bar:
    """A tqdm bar that advances one step per reported stage."""

    def __init__(self, total: int, desc: str):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)

    def __call__(self, msg: str) -> None:
        self.bar.set_postfix_str(msg[:60])
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _load(cfg, fetch: bool):
    from solaris.data.load import load_dataset

    return load_dataset(cfg.data, fetch=fetch)


def cmd_report(args: argparse.Namespace) -> int:
    from solaris.eval.render import coverage_plot, to_json, transfer_table
    from solaris.eval.ablations import ablation_steps, run_ablations
    from solaris.eval.transfer import TransferExperiment, run_transfer, transfer_steps

    cfg = _config(args, {"report.seeds": args.seeds} if args.seeds else None)
    ds = _load(cfg, args.fetch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.compare_fm:
        return _compare_fms(args, cfg, ds, out)
    ab_seeds = (args.ablation_seeds or cfg.report.seeds) if args.ablations else 0
    bar = _Bar(transfer_steps(cfg, ds) + ablation_steps(ab_seeds), f"transfer {ds.name}")
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
    bar = _Bar(len(cfgs) * transfer_steps(cfg, ds), f"transfer {ds.name}, {len(cfgs)} FMs")
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


def cmd_train(args: argparse.Namespace) -> int:
    from solaris.train.artifacts import fm_warnings, train_artifacts, train_steps

    cfg = _config(args)
    ds = _load(cfg, args.fetch)
    bar = _Bar(train_steps(ds), f"train {ds.name}")
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

    cfg = _config(args, {"data.synthetic.target_interactions": args.interactions,
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

    ds = _load(_config(args), getattr(args, "fetch", False))
    path = export_generic(ds, args.out, string_ids=args.string_ids)
    kind = "impression" if ds.requests is not None else "interaction"
    print(f"wrote {ds.name} as a generic {kind} log: {path} "
          f"({ds.interactions.num_rows} interactions"
          + ("" if ds.requests is None else f", {ds.requests.num_rows} requests") + ")")
    return 0


def _replay_module():
    """``jobs/replay.py`` (it drives Ray; imported only when a replay runs)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from jobs import replay

    return replay


def cmd_replay(args: argparse.Namespace) -> int:
    return _replay_module().run_from_args(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    """The closed loop: every arm ranks the window's requests itself and a ground truth labels
    what it shows (``solaris.replay.closed_loop``): the synthetic world's click model, or on
    MovieLens a like-model fitted on every period (``solaris.data.rating_truth``), by which
    the periods before the window are relabelled before the models train."""
    from tqdm import tqdm

    from solaris.replay.closed_loop import (SHOWN, LoopOptions, prepare, report_table,
                                            run_world, write_outputs)
    from solaris.train.artifacts import served_unlike_trained, train_artifacts

    cfg = _config(args)
    if cfg.data.dataset == "generic":
        raise SolarisError("--dataset generic: a closed loop needs a ground truth; use "
                           "synthetic or movielens")
    ds = _load(cfg, getattr(args, "fetch", False))
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
    ds = _load(_config(args), getattr(args, "fetch", False))
    from solaris.artifacts import Artifacts

    cfg = with_overrides(Artifacts.open(art).config, parse_overrides(args.set or []))
    bar = _Bar(3 + (args.backtest is not None), "estimate")
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

    replay = _replay_module()
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


def cmd_check_fm(args: argparse.Namespace) -> int:
    """``solaris check-fm``: every probe of ``solaris.models.check`` on an FM class; exit 1
    naming each broken promise."""
    from solaris.models.check import check_fm

    cfg = _config(args)
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="solaris", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and Ray's own logs on the console")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser, dataset: bool = True) -> None:
        sp.add_argument("--config", help="YAML config (see configs/default.yaml)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config field, e.g. --set fm.emb_dim=32")
        if dataset:
            sp.add_argument("--dataset", choices=["synthetic", "movielens", "generic"])
            sp.add_argument("--data-dir", type=Path,
                            help="MovieLens-100K dir (RecBole or GroupLens format) or generic YAML")
            sp.add_argument("--fetch", action="store_true",
                            help="movielens without --data-dir: fetch it into the cache dir")

    rep = sub.add_parser("report", help="reports")
    rsub = rep.add_subparsers(dest="report", required=True)
    tr = rsub.add_parser("transfer", help="offline transfer report (temporal teacher protocol)")
    common(tr)
    tr.add_argument("--seeds", type=int, help="seeds (default: report.seeds)")
    tr.add_argument("--out", required=True, type=Path)
    tr.add_argument("--ablations", action="store_true", help="also run the ablations")
    tr.add_argument("--ablation-seeds", type=int, help="seeds for the ablations")
    tr.add_argument("--compare-fm", action="append", metavar="CONFIG", default=[],
                    help="another FM beside the config's, on the same seeds: a config file "
                    "whose fm section replaces the config's (repeatable)")
    tr.set_defaults(fn=cmd_report)

    t = sub.add_parser("train", help="train FM, encoder and one serving VM per task")
    common(t)
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
    common(d, dataset=False)
    d.add_argument("--out", required=True, type=Path)
    d.add_argument("--interactions", type=int, default=60_000)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(fn=cmd_data)

    ex = sub.add_parser("export", help="write a dataset as a generic log (impressions or "
                        "interactions, side tables, mapping.yaml)")
    common(ex)
    ex.add_argument("--out", required=True, type=Path)
    ex.add_argument("--string-ids", action="store_true",
                    help="user and item ids as opaque strings whose order is not the codes' "
                    "(what a team's log often holds); the rows and codes are the same")
    ex.set_defaults(fn=cmd_export)

    rp = sub.add_parser("replay", help="event-time replay of a log through the live system "
                        "(jobs/replay.py)")
    _replay_module().add_arguments(rp)
    rp.set_defaults(fn=cmd_replay)

    sim = sub.add_parser("simulate", help="closed loop: each arm ranks, a ground truth (the "
                         "synthetic world's click model, or a like-model fitted on MovieLens) "
                         "labels what it shows")
    common(sim)
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
    sim.set_defaults(fn=cmd_simulate)

    est = sub.add_parser("estimate", help="predict a replay window's online TR, coverage and "
                         "FM cost from the data before it (the window is not read)")
    common(est)
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
    est.set_defaults(fn=cmd_estimate)

    demo = sub.add_parser("demo", help="end-to-end demo: the replay on the embedded synthetic "
                          "data")
    common(demo, dataset=False)
    demo.add_argument("--out", type=Path, default=Path("runs/demo"))
    demo.add_argument("--profile", choices=["feed", "classic"], default="feed",
                      help="the synthetic world (solaris/data/profiles.py): feed, users back "
                           "several times a day meeting most of their candidates again "
                           "(default), or classic, a handful of requests per user a month")
    demo.add_argument("--port", type=int, default=8000, help="Serve's HTTP port (loopback)")
    demo.set_defaults(fn=cmd_demo)

    chk = sub.add_parser("check-fm", help="probe an FM class against the interface and the "
                         "input contract on a small synthetic world (exit 1 naming each "
                         "broken promise)")
    common(chk, dataset=False)
    chk.add_argument("fm", nargs="?", metavar="MODULE:CLASS",
                     help="the FM class (default: the config's fm.cls); the config's fm "
                     "section gives its kwargs and version")
    chk.add_argument("--seed", type=int, default=0, help="the world's and the weights' seed")
    chk.set_defaults(fn=cmd_check_fm)
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
    sys.exit(main())
