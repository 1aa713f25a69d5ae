"""Closed-loop evaluation: each arm chooses what is shown, a ground-truth model labels it.

The open-loop replay scores a fixed log: what was shown and labelled was decided by someone
else's ranker. Here the requests (users, times, surfaces) and their candidates are the
window's, identical across arms, but each arm ranks them with its own model, shows its top
``shown`` plus ``explore`` slot(s) drawn uniformly from the ranks below (logged with their
propensity), and only what it shows is labelled -- by the ground truth (the synthetic world's
own click model, ``solaris.data.synthetic_truth``; on MovieLens a like-model fitted on every
period, ``solaris.data.rating_truth``), with random numbers fixed per (request, item) so
every arm meets the same noise. The labels go into the arm's own history store (as
``POST /feedback`` writes them), so later requests read the arm's own past.

Arms (all in process, through the serving code: ``VMScorer``, ``HistoryStore``,
``PairStore``, ``enrich_local``, the FM workers' ``PrecomputeWorker``):

* ``vm``: the VM alone. Its cache is still filled, looked up and logged but not used: this is
  the *shadow* arm, on which coverage and the speculation policies are measured (a ranker that
  favours covered items cannot inflate them);
* ``solaris``: the served (residual) VM on its own cache's inputs;
* ``fm``: the served VM with the FM's pair embedding computed inline for every candidate
  (``InlineFM``, reading the arm's own history): the upper bound;
* ``oracle``: the FM inline on the candidates that had a SOLARIS input (a pair-slot tier the
  ranking VM serves, ``delivered``: a tier at its scale 0 is not delivered), the VM alone
  elsewhere: what perfect embeddings at the achieved coverage would give.

The speculation schedule is the key-level simulation (``simulate_pair_coverage``, which
reproduces the live queue's pair coverage): the verifier ranks by the VM alone, whose scores
read no history, so which pairs are computed and when is the same in every arm; each arm's
vectors are computed from its own history as of the speculating request. KNN tables are
built as of the window start; every ``knn_every_h`` event hours the user table is rebuilt
from the arm's own interaction log (``arm_interactions``, ``user_knn_from_log``: what the
KNN job builds from it, as the live closed loop runs it), the item table (the FM's item
embeddings) stays.

numpy, torch and the serving core; no Ray.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from solaris import atomic
from solaris.cache.store import PairStore
from solaris.config import SolarisConfig
from solaris.data.rating_truth import RatingTruth
from solaris.data.schema import ITEM, SEQ, SURFACE, TS, USER, interaction_schema
from solaris.data.synthetic_truth import Arrivals, SessionTruth, uniforms
from solaris.knn.neighbours import NeighbourTable
from solaris.online.enrich import enrich_local
from solaris.online.scales import PAIR
from solaris.errors import ConfigError
from solaris.eval.metrics import point_ci
from solaris.history import HistoryStore
from solaris.replay.coverage import ceiling_mask
from solaris.simulate.coverage import simulate_pair_coverage
from solaris.simulate.log import RequestLog
from solaris.replay.schedule import knn_due
from solaris.tiers import Tier

ARMS = ("vm", "solaris", "fm", "oracle")
SHOWN = {"synthetic": 6, "movielens": 10}  # top-ranked candidates shown, by dataset
_CLICK, _CONV, _EXPLORE = 0, 1, 2  # uniform streams


@dataclass(frozen=True)
class LoopOptions:
    shown: int = 6  # top-ranked candidates shown per request
    explore: int = 1  # extra slots drawn uniformly from the ranks below ``shown``
    seed: int = 0  # the ground truth's random numbers and the schedule's
    arms: tuple[str, ...] = ARMS
    candidates: int = 100  # candidates per request where the arrivals are built from a log
    # the shadow arm also scores every candidate as SOLARIS and the FM inline would have (on
    # its own history and cache), for the off-policy estimates (``solaris.replay.offpolicy``)
    counterfactual: bool = True
    # the user KNN table is rebuilt every this many event hours from each arm's own log, as
    # the live system's KNN job is (``solaris.replay.schedule.knn_due``; 0: only the build
    # at the window start)
    knn_every_h: float = 72.0

    def __post_init__(self) -> None:
        if not (self.knn_every_h >= 0 and math.isfinite(self.knn_every_h)):
            raise ConfigError(f"knn_every_h={self.knn_every_h!r}: must be a finite number >= 0")
        if self.shown < 1:
            raise ConfigError(f"shown={self.shown!r}: must be >= 1")
        if self.explore < 0:
            raise ConfigError(f"explore={self.explore!r}: must be >= 0")
        if self.candidates < 1:
            raise ConfigError(f"candidates={self.candidates!r}: must be >= 1")
        bad = [a for a in self.arms if a not in ARMS]
        if bad or "vm" not in self.arms:
            raise ConfigError(f"arms={self.arms!r}: a subset of {ARMS} holding 'vm'")


def arrivals_log(arr: Arrivals, tasks: tuple[str, ...]) -> tuple[RequestLog, np.ndarray]:
    """The arrivals as a request log in replay order (ts, user, request id), no labels yet,
    and each log row's position in ``arr``."""
    order = np.lexsort((arr.request_id, arr.user, arr.ts))
    r, c = arr.candidates.shape
    lg = RequestLog(user=arr.user[order], ts=arr.ts[order], surface=arr.surface[order],
                    candidates=arr.candidates[order],
                    labels=np.full((r, c, len(tasks)), np.nan, np.float32), tasks=tasks)
    return lg, order


def delivered(tiers: np.ndarray, pair_scales: np.ndarray) -> np.ndarray:
    """(C,) bool: the candidates for which the ranking VM had a SOLARIS input -- a looked-up
    pair-slot tier (``tiers``, ``Tier`` codes) whose scale in ``pair_scales`` (the VM's pair
    row of scales, by tier code) is above 0. A tier at scale 0 is not delivered: the VM reads
    nothing of it."""
    tiers = np.asarray(tiers)
    on = np.asarray(pair_scales)[np.clip(tiers, 0, len(pair_scales) - 1)] > 0
    return (tiers > Tier.NONE) & on


def choose_shown(scores: np.ndarray, shown: int, explore: int, u: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(positions (k + e,), propensities (k + e,)) of what a request shows: the top ``shown``
    by ``scores`` (ties: earlier position), then ``explore`` slots drawn uniformly without
    replacement from the ranks below, using the uniforms ``u`` (explore,); their propensity is
    the chance of that draw, 1 for the top slots."""
    c = len(scores)
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    k = min(shown, c)
    rest = list(order[k:].tolist())
    picked, prop = [], []
    for j in range(min(explore, len(rest))):
        i = min(int(u[j] * len(rest)), len(rest) - 1)
        prop.append(1.0 / len(rest))
        picked.append(rest.pop(i))
    pos = np.concatenate([order[:k], np.asarray(picked, np.int64)]).astype(np.int64)
    return pos, np.concatenate([np.ones(k), np.asarray(prop, np.float64)])


@dataclass
class ArmLog:
    """What one arm showed and what happened, per log row (R, S) with S = shown + explore."""

    pos: np.ndarray  # candidate positions shown
    item: np.ndarray
    propensity: np.ndarray
    p_arm: np.ndarray  # the arm's predicted click probability of what it showed
    p_true: np.ndarray  # the ground truth's click probability
    click: np.ndarray  # bool
    conv: np.ndarray  # bool
    tier: np.ndarray  # int8 pair-slot tier of the shown items as looked up (-1: no lookup)
    agg: np.ndarray  # bool aggregate present
    fm_evals: int = 0
    knn_as_of: list = field(default_factory=list)  # event times its user table was rebuilt at
    # the shadow arm's counterfactual scores of every candidate (R, C): what the served VM
    # on this arm's cache ("solaris") and with the FM inline ("fm") would have ranked by, and
    # the truth's click probabilities ("p_true")
    cf: dict[str, np.ndarray] = field(default_factory=dict)

    def record(self, i: int, pos: np.ndarray, prop: np.ndarray, shown: np.ndarray,
               scores: np.ndarray, p_true: np.ndarray, click: np.ndarray, conv: np.ndarray,
               tiers: np.ndarray | None, agg: np.ndarray | None) -> None:
        """Row ``i``: what was shown (positions, propensities, items), the arm's ``scores``
        of all candidates, the truth's probabilities and labels, and, where the arm looked
        its cache up, the candidates' ``tiers`` and aggregate presence (``agg``)."""
        n = len(pos)
        self.pos[i, :n], self.item[i, :n], self.propensity[i, :n] = pos, shown, prop
        self.p_arm[i, :n], self.p_true[i, :n] = scores[pos], p_true
        self.click[i, :n], self.conv[i, :n] = click, conv
        if tiers is not None:
            self.tier[i, :n], self.agg[i, :n] = tiers[pos], agg[pos]

    def save(self) -> dict[str, np.ndarray]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if isinstance(getattr(self, f.name), np.ndarray)}
        return {**out, **{f"cf_{k}": v for k, v in self.cf.items()}}


@dataclass
class LoopContext:
    """Everything the arms share: the window's log, the VM, the FM, the schedule's writes."""

    cfg: SolarisConfig
    lg: RequestLog
    request_id: np.ndarray  # (R,) per log row
    arr_pos: np.ndarray  # (R,) position of each log row in the arrivals
    base: np.ndarray  # (R, C) the VM alone's probabilities (what the verifier ranks by)
    scorer: object  # VMScorer
    make_inline: Callable[[HistoryStore], object]  # history -> InlineFM
    make_worker: Callable[[HistoryStore], object]  # history -> PrecomputeWorker
    # a fresh ground truth per arm: SessionTruth or RatingTruth (probs, observe)
    make_truth: Callable[[], SessionTruth | RatingTruth]
    seed_history: tuple  # (users, items, surfaces, labels, ts) before the window
    knn: tuple[NeighbourTable | None, NeighbourTable | None]
    writes: dict[str, np.ndarray]
    fm_evals: int
    version: str
    dim: int
    enrich: object = None  # EnrichConfig the router looks up with (tiers at scale 0 off)
    info: dict = field(default_factory=dict)
    start: float = 0.0  # the window start: the first KNN build's time
    log0: pa.Table | None = None  # the interaction log before the window: every arm's starts so
    # (arm log, its rows so far, as_of) -> the user table the KNN job builds then from that
    # arm's own interaction log (``arm_interactions``)
    rebuild_user_knn: Callable[[ArmLog, np.ndarray, float], NeighbourTable] | None = None


def run_arm(ctx: LoopContext, arm: str, opts: LoopOptions,
            progress: Callable[[int], None] | None = None) -> ArmLog:
    """One arm over the whole window, request by request in event order."""
    from solaris.simulate.served import put_writes, select_slots, worker_vectors
    from solaris.online.scoring import ScoreRequest

    cfg, lg = ctx.cfg, ctx.lg
    r, c = lg.candidates.shape
    s_n = opts.shown + opts.explore
    hist = HistoryStore(cfg.history)
    hist.replay_log(*ctx.seed_history)
    store = None if arm == "fm" else PairStore(dataclasses.replace(cfg.cache, dim=ctx.dim))
    worker = ctx.make_worker(hist) if store is not None else None
    cf = opts.counterfactual and arm == "vm"
    inline = ctx.make_inline(hist) if arm in ("fm", "oracle") or cf else None
    truth = ctx.make_truth()
    # the serving arms look up what the router does (a tier at scale 0 in every VM of the
    # version is not looked up); the shadow arm every tier the cache could serve
    enrich = cfg.enrich if arm == "vm" or ctx.enrich is None else ctx.enrich
    wr = ctx.writes
    vis = wr["visible_at"]
    user_knn, item_knn = ctx.knn
    pair_scales = ctx.scorer.scales()[PAIR]  # the ranking VM's, by tier (the oracle's cover)
    out = empty_log(r, s_n)
    if cf:
        out.cf = {k: np.zeros((r, c), np.float32) for k in ("solaris", "fm", "p_true")}
    nxt = 0
    explore_u = explore_uniforms(ctx, opts)
    every = opts.knn_every_h * 3600.0
    next_knn = (ctx.start + every if every > 0 and store is not None
                and ctx.rebuild_user_knn is not None else math.inf)
    for i in range(r):
        t = float(lg.ts[i])
        user, items, surface = int(lg.user[i]), lg.candidates[i], int(lg.surface[i])
        if (as_of := knn_due(t, next_knn, every)) is not None:  # this arm's own log
            user_knn = ctx.rebuild_user_knn(out, np.arange(i), as_of)
            out.knn_as_of.append(as_of)
            next_knn = as_of + every
        if store is not None:
            stop = int(np.searchsorted(vis, t, side="right"))
            if stop > nxt:
                put_writes(store, wr, worker_vectors(worker, wr, ctx.dim, ctx.version, nxt,
                                                     stop, history_at=cfg.schedule.history_at),
                           nxt, stop, ctx.version)
                out.fm_evals += stop - nxt
                nxt = stop
        look = None
        if store is not None:
            look = enrich_local(store, user, items, t, ctx.version, user_knn, item_knn,
                                enrich)
        if arm == "vm":
            p = ctx.base[i].astype(np.float64)
            if cf:
                served = look if ctx.enrich is None or ctx.enrich == enrich else enrich_local(
                    store, user, items, t, ctx.version, user_knn, item_knn, ctx.enrich)
                # one forward each, as the serving arms score (another batch shape may round
                # differently)
                for name, slots in (("solaris", served),
                                    ("fm", inline.slots(user, items, surface, t))):
                    out.cf[name][i] = ctx.scorer.score(
                        [ScoreRequest(user, items, surface, slots)])[0]
                # the truth's click probability of every candidate (what any ranking of this
                # request would earn), before this request's clicks move the session
                out.cf["p_true"][i] = truth.probs(int(ctx.arr_pos[i]), items)[0]
        else:
            if arm == "solaris":
                slots = look
            else:
                full = inline.slots(user, items, surface, t)
                if arm == "oracle":
                    cov = delivered(look.pair_tier, pair_scales)
                    slots = select_slots(np.where(cov & full.pair_present, Tier.PAIR,
                                                  Tier.NONE), full.pair_emb,
                                         np.zeros(c), np.zeros_like(full.pair_emb),
                                         np.zeros(c, bool), None, agg=False)
                else:
                    slots = full
            p = ctx.scorer.score([ScoreRequest(user, items, surface, slots)])[0].astype(
                np.float64)
        pos, prop, shown, pc, click, conv = show_and_label(ctx, opts, truth, i, p,
                                                           explore_u[i])
        hist.record_labels(user, shown, np.stack([click, conv], 1).astype(np.float64), t)
        out.record(i, pos, prop, shown, p, pc, click, conv,
                   None if look is None else look.pair_tier, None if look is None else
                   look.agg_present)
        if progress is not None:
            progress(1)
    return out


def explore_uniforms(ctx: LoopContext, opts: LoopOptions) -> np.ndarray:
    """(R, max(explore, 1)) the exploration draws of every request (shared by all arms)."""
    return uniforms(opts.seed, ctx.request_id[:, None],
                    np.arange(max(opts.explore, 1))[None, :], _EXPLORE)


def show_and_label(ctx: LoopContext, opts: LoopOptions, truth: SessionTruth, i: int,
                   scores: np.ndarray, explore_u: np.ndarray) -> tuple[np.ndarray, ...]:
    """Log row ``i`` ranked by ``scores``: what it shows and how the ground truth labels it.
    Returns (positions, propensities, items, P(click), click, conversion); the arm's session
    state (``truth``) takes the clicks."""
    pos, prop = choose_shown(scores, opts.shown, opts.explore, explore_u)
    shown = ctx.lg.candidates[i][pos]
    a = int(ctx.arr_pos[i])
    pc, pv = truth.probs(a, shown)
    rid = np.full(len(shown), ctx.request_id[i])
    click = uniforms(opts.seed, rid, shown, _CLICK) < pc
    conv = click & (uniforms(opts.seed, rid, shown, _CONV) < pv)
    truth.observe(a, shown, click)
    return pos, prop, shown, pc, click, conv


def empty_log(r: int, shown: int) -> ArmLog:
    """An ``ArmLog`` for ``r`` requests showing ``shown`` items each, nothing filled yet."""
    return ArmLog(pos=np.zeros((r, shown), np.int64), item=np.zeros((r, shown), np.int64),
                  propensity=np.zeros((r, shown)), p_arm=np.zeros((r, shown)),
                  p_true=np.zeros((r, shown)), click=np.zeros((r, shown), bool),
                  conv=np.zeros((r, shown), bool), tier=np.full((r, shown), -1, np.int8),
                  agg=np.zeros((r, shown), bool))


def arm_interactions(before: pa.Table, lg: RequestLog, arm: ArmLog, rows: np.ndarray,
                     tasks: tuple[str, ...]) -> pa.Table:
    """The interaction log a KNN job reads for one arm: ``before`` (the log's rows before the
    window, in the interaction schema) followed by what the arm showed at log rows ``rows``
    (ascending) and how it was labelled -- one row per shown item, in the order the arm's
    history store took them (``seq`` continues from ``before``'s). The first two tasks take
    the click and the conversion (synthetic: click, conversion; MovieLens: like, love)."""
    rows = np.asarray(rows, np.int64)
    s = arm.item.shape[1]
    r = np.repeat(rows, s)
    seq0 = int(before.column(SEQ).to_numpy().max()) + 1 if before.num_rows else 0
    y = [arm.click[rows].ravel(), arm.conv[rows].ravel()]
    cols = {SEQ: np.arange(seq0, seq0 + len(r), dtype=np.int64), USER: lg.user[r].astype(np.int64),
            ITEM: arm.item[rows].ravel().astype(np.int64), TS: lg.ts[r].astype(np.int64),
            SURFACE: lg.surface[r].astype(np.int32),
            **{t: (y[j] if j < 2 else np.zeros(len(r))).astype(np.float32)
               for j, t in enumerate(tasks)}}
    schema = interaction_schema(tasks)
    return pa.concat_tables([before.select(schema.names).cast(schema),
                             pa.Table.from_pydict(cols, schema=schema)])


# ------------------------------------------------------------------------------ metrics
def _bce(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


def shown_log(lg: RequestLog, arm: ArmLog) -> RequestLog:
    """``lg`` with the arm's shown items labelled (click, conversion): the closed-loop log."""
    labels = np.full(lg.labels.shape[:2] + (2,), np.nan, np.float32)
    rows = np.repeat(np.arange(lg.num_requests), arm.pos.shape[1])
    labels[rows, arm.pos.ravel(), 0] = arm.click.ravel()
    labels[rows, arm.pos.ravel(), 1] = arm.conv.ravel()
    return dataclasses.replace(lg, labels=labels[..., :len(lg.tasks)])


def arm_metrics(arm: ArmLog) -> dict:
    """Per-arm figures: expected clicks per request, BCE on shown items and its excess over
    the ground truth's own (the Bayes BCE), coverage of shown items."""
    y = arm.click.astype(np.float64)
    bce = float(_bce(arm.p_arm, y).mean())
    bayes = float(_bce(arm.p_true, y).mean())
    looked = arm.tier >= 0
    out = {"clicks_per_request": float(arm.p_true.sum(1).mean()),
           "realised_clicks_per_request": float(y.sum(1).mean()),
           "bce_shown": bce, "bayes_bce_shown": bayes, "excess_bce": bce - bayes,
           "fm_evals": arm.fm_evals, "knn_rebuilds": len(arm.knn_as_of)}
    if looked.any():
        out["coverage_shown_pair"] = float((arm.tier[looked] == Tier.PAIR).mean())
        out["coverage_shown_any"] = float(((arm.tier[looked] != Tier.NONE)
                                           | arm.agg[looked]).mean())
        out["coverage_shown_slot"] = float((arm.tier[looked] != Tier.NONE).mean())
    return out


def paired_lift(clicks: dict[str, list[np.ndarray]], resamples: int = 2000,
                alpha: float = 0.05, seed: int = 0) -> dict:
    """Paired bootstrap over requests of the expected clicks per request: each arm's gain
    over ``vm`` and, where the FM-VM gap's interval excludes 0, ``click_lift`` = (solaris -
    vm) / (fm - vm) and ``lift_oracle`` = (oracle - vm) / (fm - vm). ``clicks``: arm -> per
    seed (R_s,) expected clicks of each request. Every arm shares each draw; seeds of one
    window (equal R) share one request draw, otherwise each seed draws its own."""
    rng = np.random.default_rng(seed)
    arms = list(clicks)
    n_seeds = len(clicks["vm"])
    point = {a: float(np.mean([c.mean() for c in clicks[a]])) for a in arms}
    draws = {a: np.zeros(resamples) for a in arms}
    sizes = {len(c) for c in clicks["vm"]}
    shared = rng.integers(0, sizes.pop(), size=(resamples, len(clicks["vm"][0]))) \
        if len(sizes) == 1 else None
    for s in range(n_seeds):
        n = len(clicks["vm"][s])
        idx = shared if shared is not None else rng.integers(0, n, size=(resamples, n))
        for a in arms:
            draws[a] += clicks[a][s][idx].mean(1) / n_seeds

    summary = functools.partial(point_ci, alpha=alpha)

    out = {"clicks_per_request": point,
           "gain_over_vm": {a: summary(point[a] - point["vm"], draws[a] - draws["vm"])
                            for a in arms if a != "vm"}}
    if "fm" in arms:
        gap = out["gain_over_vm"]["fm"]
        gap_ok = gap["ci"] is not None and (gap["ci"][0] > 0 or gap["ci"][1] < 0)
        out["fm_gap_excludes_0"] = bool(gap_ok)
        den_pt, den = point["fm"] - point["vm"], draws["fm"] - draws["vm"]
        out["lift_by_arm"] = {}
        for a in arms:
            if a in ("vm", "fm"):
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = (draws[a] - draws["vm"]) / den
            out["lift_by_arm"][a] = summary((point[a] - point["vm"]) / den_pt, ratio) \
                if gap_ok else None
        for name, a in (("click_lift", "solaris"), ("lift_oracle", "oracle")):
            if a in arms:
                out[name] = out["lift_by_arm"][a]
        if "solaris" in arms and "oracle" in arms and gap_ok:
            with np.errstate(divide="ignore", invalid="ignore"):
                share = (draws["solaris"] - draws["vm"]) / (draws["oracle"] - draws["vm"])
            out["click_lift_over_lift_oracle"] = summary(
                (point["solaris"] - point["vm"]) / (point["oracle"] - point["vm"]), share)
    return out


def shadow_coverage(lg: RequestLog, shadow: ArmLog, read_ttl_s: float, lag_s: float) -> dict:
    """Coverage of the shadow arm's shown items against its ceiling (shown items that were a
    candidate of the same user within the TTL and after the lag)."""
    log = shown_log(lg, shadow)
    ceiling = float(ceil_of_shown(log, read_ttl_s, lag_s, shadow.pos).mean())
    cov = float((shadow.tier == Tier.PAIR).mean())
    return {"pair": cov, "ceiling": ceiling,
            "pair_over_ceiling": cov / ceiling if ceiling > 0 else math.nan,
            "slot_any_tier": float((shadow.tier != Tier.NONE).mean()),
            "effective": float(((shadow.tier != Tier.NONE) | shadow.agg).mean())}


def ceil_of_shown(log: RequestLog, read_ttl_s: float, lag_s: float, pos: np.ndarray
                  ) -> np.ndarray:
    """(R, S) whether each shown item (positions ``pos``) is within the pair ceiling: a
    candidate of the same user within the TTL before, and at least the lag before."""
    return np.take_along_axis(ceiling_mask(log, read_ttl_s, lag_s), pos, axis=1)


def schedule(cfg: SolarisConfig, lg: RequestLog, base: np.ndarray, seed: int) -> dict:
    """The verifier's key-level speculation schedule over the window, with its writes."""
    s = cfg.schedule
    return simulate_pair_coverage(
        lg, base, fraction=cfg.verifier.fraction, horizon_s=cfg.verifier.horizon_s,
        read_ttl_s=float(cfg.cache.read_ttl_s), lag_s=s.lag_s, tick_s=s.tick_s,
        budget_per_hour=s.budget_per_hour, seed=seed, record_writes=True)


def write_outputs(out: Path, ctx: LoopContext, logs: dict[str, ArmLog], report: dict) -> None:
    """``out``/arms.npz (the window's requests and every arm's log), closed_loop.png and
    closed_loop.json (``report``, with the plot's path added)."""
    from solaris.eval.render import to_json
    from solaris.replay.plots import closed_loop_plot

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic.save(out / "arms.npz", lambda f: np.savez_compressed(
        f, request_id=ctx.request_id, user=ctx.lg.user, ts=ctx.lg.ts,
        candidates=ctx.lg.candidates, base=ctx.base,
        **{f"{a}/{k}": v for a, g in logs.items() for k, v in g.save().items()}))
    report["plots"] = [str(closed_loop_plot(report, out / "closed_loop.png"))]
    atomic.save_text(out / "closed_loop.json", to_json(report))


# ------------------------------------------------------------------------------ a world
def prepare(cfg: SolarisConfig, ds, art_dir, opts: LoopOptions,
            max_requests: int | None = None, truth=None) -> LoopContext:
    """The shared part of a closed loop: arrivals, the VM alone's scores, the schedule's
    writes, KNN tables and the seed history, with artifacts from ``art_dir`` (trained on the
    periods before the window).

    Synthetic: ``cfg.data.synthetic`` must be the world ``ds`` was generated from; its click
    model is the ground truth and its requests the arrivals. MovieLens: ``truth`` is the
    fitted ``GroundTruth`` and ``ds`` the log relabelled by it (``rating_truth.relabel``); the
    arrivals are the replay's requests (``build_request_log``: the real per-user request
    times, the causal retrieval of the real log), unlabelled."""
    from solaris.simulate.served import knn_tables_as_of, user_knn_from_log
    from solaris.features import FeatureTables
    from solaris.artifacts import load_models
    from solaris.precompute.worker import PrecomputeWorker
    from solaris.replay.prepare import seed_history, window
    from solaris.online.scoring import Artifacts, InlineFM, ScoreRequest, VMScorer

    _, start = window(ds, cfg)
    if cfg.data.dataset == "synthetic":
        from solaris.data.synthetic import build
        from solaris.data.synthetic_truth import arrivals

        world = build(cfg.data.synthetic)
        arr = arrivals(world, start)
        lg, order = arrivals_log(arr, tuple(ds.tasks))
        request_id = arr.request_id

        def make_truth():
            return SessionTruth(world, arr)
    elif cfg.data.dataset == "movielens" and truth is not None:
        from solaris.simulate.log import build_request_log

        lg = build_request_log(ds, start, num_candidates=opts.candidates,
                               granularity_s=cfg.features.request_granularity_s,
                               seed=opts.seed)
        lg = dataclasses.replace(lg, labels=np.full_like(lg.labels, np.nan))
        order = np.arange(lg.num_requests)
        request_id = order.copy()

        # the truth's history state at the window start: the likes of the relabelled log
        inter = ds.interactions
        n0 = int(np.searchsorted(inter.column(TS).to_numpy(), start, side="left"))
        before = tuple(inter.column(c).to_numpy()[:n0] for c in (USER, ITEM, "like"))

        def make_truth():
            return RatingTruth(truth, lg.user, lg.ts, before)
    else:
        raise ConfigError(f"data.dataset={cfg.data.dataset!r}: the closed loop needs a ground "
                          "truth: the synthetic world's, or MovieLens with a fitted one")
    if max_requests is not None:  # the window's first requests only (tests, quick looks)
        order = order[:max_requests]
        lg = lg.slice(np.arange(len(order)))
    art = Artifacts.open(art_dir)
    side = art.side_tables()
    ttl = float(cfg.cache.read_ttl_s)
    scorer = VMScorer(art, ds.tasks[0], side, read_ttl_s=ttl)
    # one forward per request, as every arm scores: the VM alone's probabilities then equal,
    # bit for bit, what a served VM with no SOLARIS input gives (another batch shape may
    # round differently)
    base = np.stack([scorer.score([ScoreRequest(int(lg.user[i]), lg.candidates[i],
                                                int(lg.surface[i]), None)])[0]
                     for i in range(lg.num_requests)]).astype(np.float64)
    fm, enc, version = load_models(art_dir)
    from solaris.online.scales import ScaleTable

    enrich = ScaleTable({version: art.manifest}).enrich_for(version, cfg.enrich)
    tables = FeatureTables(ds, cfg.features)
    knn = knn_tables_as_of(fm, tables, float(start), cfg)
    sim = schedule(cfg, lg, base, opts.seed)

    log0 = ds.interactions  # the log before the window: every arm's log starts with it
    log0 = log0.slice(0, int(np.searchsorted(log0.column(TS).to_numpy(), start, "left")))

    def rebuild_user_knn(arm: ArmLog, rows: np.ndarray, as_of: float) -> NeighbourTable:
        log = arm_interactions(log0, lg, arm, rows, tuple(ds.tasks))
        return user_knn_from_log(fm, log, tuple(ds.tasks), side, as_of, cfg)

    return LoopContext(
        cfg=cfg, lg=lg, request_id=request_id[order], arr_pos=order, base=base,
        scorer=scorer, make_inline=lambda h: InlineFM(art, side, h),
        make_worker=lambda h: PrecomputeWorker(fm, enc, h, side, version),
        make_truth=make_truth,
        seed_history=seed_history(ds, start, cfg.history.max_events), knn=knn,
        writes=sim["writes"], fm_evals=int(sim["fm_evals"]), version=version,
        dim=enc.width, enrich=enrich, start=float(start), log0=log0,
        rebuild_user_knn=rebuild_user_knn,
        info={"window_start": int(start), "requests": lg.num_requests,
                             "candidates_per_request": lg.num_candidates,
                             "fm_evals": int(sim["fm_evals"]),
                             "fm_evals_per_1k_requests": 1000.0 * sim["fm_evals"]
                             / max(1, lg.num_requests)})


# ------------------------------------------------------------------------------ a whole run
POLICY_FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.5)


def run_world(ctx: LoopContext, opts: LoopOptions,
              progress: Callable[[int], None] | None = None,
              extra: dict[str, ArmLog] | None = None) -> tuple[dict, dict[str, ArmLog]]:
    """Every arm of ``opts`` on ``ctx``'s window (plus the ``extra`` arms already run, e.g.
    the live system's), then the report: per-arm figures, the paired click lift, the shadow
    arm's coverage against its ceiling and oracle bound, and the speculation policies at
    equal FM cost on the shadow arm's closed-loop log."""
    from solaris.replay.bounds import effective_bounds
    from solaris.replay.coverage import (RECURRENCE_S, candidate_recurrence,
                                         compare_policies)

    cfg, lg = ctx.cfg, ctx.lg
    logs = {a: run_arm(ctx, a, opts, progress) for a in opts.arms}
    logs.update(extra or {})
    ttl, lag = float(cfg.cache.read_ttl_s), float(cfg.schedule.lag_s)
    shadow = logs["vm"]
    closed = shown_log(lg, shadow)
    user_knn = ctx.knn[0]
    neighbours = {} if user_knn is None else {
        int(u): user_knn.neighbour_ids(np.asarray([u]), cfg.enrich.user_knn_probe)[0]
        for u in np.unique(lg.user)}
    bounds = effective_bounds(closed, neighbours, read_ttl_s=ttl,
                              retention_s=float(cfg.cache.retention_s), lag_s=lag,
                              probes=(cfg.enrich.user_knn_probe,))
    cov = shadow_coverage(lg, shadow, ttl, lag)
    oracle_eff = bounds["effective_oracle"][str(cfg.enrich.user_knn_probe)]
    cov["effective_oracle_bound"] = oracle_eff
    cov["effective_over_bound"] = cov["effective"] / oracle_eff if oracle_eff > 0 else None
    s = cfg.schedule
    policies = compare_policies(
        closed, ctx.base, fraction=cfg.verifier.fraction, fractions=POLICY_FRACTIONS,
        seed=opts.seed, horizon_s=float(cfg.verifier.horizon_s), read_ttl_s=ttl, lag_s=lag,
        tick_s=s.tick_s, budget_per_hour=s.budget_per_hour)
    report = {
        **ctx.info, "options": dataclasses.asdict(opts), "lag_s": lag, "read_ttl_s": ttl,
        "tick_s": s.tick_s, "budget_per_hour": s.budget_per_hour,
        "fraction": cfg.verifier.fraction, "horizon_s": cfg.verifier.horizon_s,
        "arms": {a: arm_metrics(g) for a, g in logs.items()},
        "lift": paired_lift({a: [g.p_true.sum(1)] for a, g in logs.items()}, seed=opts.seed),
        "shadow_coverage": cov, "coverage_bounds": bounds,
        "candidate_recurrence_closed_loop": candidate_recurrence(lg, ttl),
        "candidate_recurrence_6h_closed_loop": candidate_recurrence(lg, RECURRENCE_S),
        "policies": policies}
    if shadow.cf:
        report["off_policy"] = off_policy_report(shadow, ctx.base, opts, report["lift"])
    if "fm" in logs:
        v, f = report["arms"]["vm"]["excess_bce"], report["arms"]["fm"]["excess_bce"]
        report["fm_excess_over_vm_excess"] = f / v if v > 0 else None
    return report, logs


def off_policy_report(shadow: ArmLog, base: np.ndarray, opts: LoopOptions, lift: dict
                      ) -> dict:
    """The off-policy estimates from the shadow arm's log (IPS, SNIPS) of SOLARIS's and the
    FM inline's clicks, gains and ``click_lift``; beside them what they estimate, exactly
    (the truth's expected clicks of those rankings on the logged requests, against the VM
    alone's ranking ``base``), and the simulator's on-policy figures (each arm on its own
    history), with whether each lies in the SNIPS interval."""
    from solaris.replay.offpolicy import counterfactual_clicks, off_policy_lift

    est = off_policy_lift(shadow.click, shadow.pos, shadow.propensity,
                          {k: shadow.cf[k] for k in ("solaris", "fm")}, opts.shown,
                          opts.explore, seed=opts.seed)
    p = shadow.cf["p_true"]
    k_e = (opts.shown, opts.explore)
    own = counterfactual_clicks(base, p, *k_e)
    gain = {k: float((counterfactual_clicks(shadow.cf[k], p, *k_e) - own).mean())
            for k in ("solaris", "fm")}
    exact = {"gain_solaris": gain["solaris"], "gain_fm": gain["fm"],
             "click_lift": gain["solaris"] / gain["fm"] if gain["fm"] != 0 else None}
    g = lift.get("gain_over_vm", {})
    cl = lift.get("click_lift")
    on_policy = {"gain_solaris": g.get("solaris", {}).get("point"),
                 "gain_fm": g.get("fm", {}).get("point"),
                 "click_lift": None if not cl else cl["point"]}

    def inside(d: dict | None, v: float | None) -> bool | None:
        if d is None or d.get("ci") is None or v is None or d["point"] is None:
            return None
        return bool(d["ci"][0] <= v <= d["ci"][1])

    snips = est.get("click_lift_snips")
    gs = est["targets"]["solaris"]["gain_snips"]
    est["exact_counterfactual"] = exact
    est["on_policy"] = on_policy
    est["within_snips_interval"] = {
        "click_lift_exact": inside(snips, exact["click_lift"]),
        "click_lift_on_policy": inside(snips, on_policy["click_lift"]),
        "gain_solaris_exact": inside(gs, exact["gain_solaris"]),
        "gain_solaris_on_policy": inside(gs, on_policy["gain_solaris"])}
    return est


def report_table(report: dict) -> str:
    """The closed loop's headline figures as text."""
    lift, cov, pol = report["lift"], report["shadow_coverage"], report["policies"]

    def ci(d: dict | None) -> str:
        if not d or d["point"] is None:
            return "n/a"
        return f"{d['point']:.3f} [{d['ci'][0]:.3f}, {d['ci'][1]:.3f}]" if d["ci"] else \
            f"{d['point']:.3f}"

    lines = [f"{'arm':<13}{'clicks/req':>11}{'gain over vm [95%]':>26}{'excess BCE':>12}"
             f"{'pair cov':>10}"]
    for a, m in report["arms"].items():
        g = "" if a == "vm" else ci(lift["gain_over_vm"][a])
        pc = m.get("coverage_shown_pair")
        lines.append(f"{a:<13}{m['clicks_per_request']:>11.3f}{g:>26}{m['excess_bce']:>12.4f}"
                     f"{'' if pc is None else f'{pc:.3f}':>10}")
    at = pol["at_verifier_cost"]
    lines += [f"click_lift {ci(lift.get('click_lift'))}   lift_oracle "
              f"{ci(lift.get('lift_oracle'))}   ratio "
              f"{ci(lift.get('click_lift_over_lift_oracle'))}",
              f"shadow: pair coverage {cov['pair']:.3f} of ceiling {cov['ceiling']:.3f} "
              f"({cov['pair_over_ceiling']:.2f}); effective {cov['effective']:.3f} of oracle "
              f"bound {cov['effective_oracle_bound']:.3f} ({cov['effective_over_bound']:.2f})",
              f"policies at the verifier's cost ({at['fm_evals_per_1k']:.0f} FM evals per 1k "
              "requests): " + ", ".join(f"{k} {v:.3f}" for k, v in at["pair"].items()
                                        if v is not None)
              + f"; oracle {at['oracle']['pair']:.3f} at {at['oracle']['fm_evals']} evals; "
              f"verifier/random {pol['verifier_over_random']:.2f}"]
    ope = report.get("off_policy")
    if ope:
        ex, on = ope["exact_counterfactual"], ope["on_policy"]

        def num(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.3f}"
        lines.append(f"off-policy from the shadow log (SNIPS): SOLARIS gain "
                     f"{ci(ope['targets']['solaris']['gain_snips'])} (exact "
                     f"{num(ex['gain_solaris'])}, on-policy {num(on['gain_solaris'])}); "
                     f"click_lift {ci(ope.get('click_lift_snips'))} (exact "
                     f"{num(ex['click_lift'])}, on-policy {num(on['click_lift'])})")
    live = report.get("live")
    if live:
        lines.append(f"live system: errors {live['errors']}, click_lift "
                     f"{ci(lift.get('lift_by_arm', {}).get('solaris_live'))}; against the "
                     f"in-process solaris arm: pair coverage of shown "
                     f"{live['pair_shown_live']:.4f} vs {live['pair_shown_sim']:.4f}, clicks "
                     f"per request {live['clicks_live']:.4f} vs {live['clicks_sim']:.4f}, "
                     f"same items shown {live['same_shown']:.4f}")
    return "\n".join(lines)
