"""Transfer measured on the replay's labelled rows, from the features as served.

The replay logs, for every labelled candidate, the VM's served score and the two SOLARIS
inputs exactly as the router sent them (``ServedRows``). Everything here re-scores those rows
in-process with the same ``VMScorer`` the VM replicas run, so switching tiers off, filling
every pair slot, or swapping the VM changes one thing at a time:

* ``tr_online``: the VM as served vs the VM alone (a VM trained without SOLARIS inputs on the
  same periods) against the FM snapshot that produced the embeddings, all on the same rows.
  Calibrated: each predictor gets a Platt fit on the window's first half (by request time)
  and TR is computed on the second half; the raw TR over all rows rides along.
* ``tr_online_by_tier``: tiers switched on cumulatively (pair, + user neighbour, + item
  neighbour, + aggregate).
* ``tr_offline_pair_100``: the same rows with every pair slot holding the snapshot's own pair
  embedding (fresh, as the offline report has it) and the aggregate as served.
* ``tier_worth``: per fallback input (user neighbour, item neighbour, aggregate), on the
  rows where it is what is served, how much of what the real pair embedding gains the input
  gains, raw and calibrated, with request-bootstrap intervals.
* ``consistency``: the VM fine-tuned on the first half's features as logged (tier and age
  included) vs the shipped VM (trained with random feature dropout), on the second half.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from solaris.cache.query import Slots
from solaris.eval import metrics as M
from solaris.simulate.served import select_slots
from solaris.online.scoring import ScoreRequest, VMScorer
from solaris.tiers import NUM_TIERS, STEPS, Tier

TIER_STEPS = STEPS  # (name, tiers kept, aggregate on), cumulative (solaris.tiers)


@dataclass
class ServedRows:
    """The labelled replay rows as served (N rows), grouped by request (``req``)."""

    req: np.ndarray  # (N,) int64 request index (rows of one request are contiguous)
    ts: np.ndarray  # (N,) float64 request event time
    user: np.ndarray  # (N,) int64
    item: np.ndarray  # (N,) int64
    surface: np.ndarray  # (N,) int64
    y: np.ndarray  # (N,) float64 the main task's label
    score: np.ndarray  # (N,) float64 the served VM score
    tier: np.ndarray  # (N,) int64
    age_s: np.ndarray  # (N,) float64
    pair_emb: np.ndarray  # (N, d) float32 (zeros where absent)
    agg_emb: np.ndarray  # (N, d) float32
    agg_present: np.ndarray  # (N,) bool

    def __len__(self) -> int:
        return len(self.req)

    def slots(self, idx: np.ndarray, tiers: set[int] | None = None, agg: bool = True,
              pair: np.ndarray | None = None) -> Slots:
        """Slots of rows ``idx``: only ``tiers`` kept (None: all), the aggregate on or off,
        or ``pair`` (len(idx), d) as a fresh pair-tier slot for every row."""
        if pair is not None:
            n = len(idx)
            return select_slots(np.full(n, Tier.PAIR), pair, np.zeros(n), self.agg_emb[idx],
                                self.agg_present[idx], None, agg)
        return select_slots(self.tier[idx], self.pair_emb[idx], self.age_s[idx],
                            self.agg_emb[idx], self.agg_present[idx], tiers, agg)


def score(scorer: VMScorer, rows: ServedRows, slots: bool = True, **kw) -> np.ndarray:
    """Re-score every row with ``scorer``, one ScoreRequest per replay request; ``slots``
    False: no SOLARIS inputs; ``kw`` go to ``ServedRows.slots`` (``pair`` indexed by row)."""
    out = np.empty(len(rows))
    starts = np.r_[0, np.flatnonzero(np.diff(rows.req)) + 1, len(rows)]
    reqs, spans = [], []
    pair = kw.pop("pair", None)
    for a, b in zip(starts[:-1], starts[1:]):
        idx = np.arange(a, b)
        z = None
        if slots:
            z = rows.slots(idx, pair=None if pair is None else pair[idx], **kw)
        reqs.append(ScoreRequest(int(rows.user[a]), rows.item[idx], int(rows.surface[a]), z))
        spans.append((a, b))
    for lo in range(0, len(reqs), 256):
        for (a, b), p in zip(spans[lo:lo + 256], scorer.score(reqs[lo:lo + 256])):
            out[a:b] = p
    return np.clip(out, 1e-7, 1 - 1e-7)


def halves(rows: ServedRows) -> tuple[np.ndarray, np.ndarray]:
    """(first, second) half masks by request time: the cut is the median request time, so a
    request's rows never straddle it."""
    cut = np.median(rows.ts)
    first = rows.ts < cut
    if first.all() or not first.any():  # one timestamp: split by request order
        first = rows.req < np.median(rows.req)
    return first, ~first


def transfer(y: np.ndarray, p_vm: np.ndarray, p_x: np.ndarray, p_fm: np.ndarray,
             first: np.ndarray, second: np.ndarray) -> dict[str, float]:
    """Raw TR on all rows and calibrated TR (Platt on ``first``, measured on ``second``)."""
    raw = {k: M.bce(y, p) for k, p in (("vm", p_vm), ("x", p_x), ("fm", p_fm))}
    cal = {}
    for k, p in (("vm", p_vm), ("x", p_x), ("fm", p_fm)):
        ab = M.fit_platt(y[first], p[first])
        cal[k] = M.bce(y[second], M.apply_platt(p[second], ab))
    return {"tr_raw": M.transfer_ratio(raw["vm"], raw["x"], raw["fm"]),
            "tr_cal": M.transfer_ratio(cal["vm"], cal["x"], cal["fm"]),
            "bce_raw": raw, "bce_cal": cal}


def crossfit_tr(y: np.ndarray, p_vm: np.ndarray, p_x: np.ndarray, p_fm: np.ndarray,
                first: np.ndarray) -> float:
    """Calibrated TR with every row measured once: each predictor's Platt fit on ``first`` is
    measured on the rest and its fit on the rest on ``first``, and TR is the ratio of the
    summed BCE gaps over all rows. Where the period is stationary this is ``transfer``'s
    ``tr_cal`` (a Platt fit on half the rows, measured out of sample) with about half its
    variance; where it drifts, fitting on the later half and measuring the earlier one is not
    what a replay measures, so the prediction reports it beside the single split, not
    instead of it."""
    gain = gap = 0.0
    for fit in (first, ~first):
        ev = ~fit
        if not fit.any() or not ev.any():
            return float("nan")
        loss = {k: M.bce_rows(y[ev], M.apply_platt(p[ev], M.fit_platt(y[fit], p[fit])))
                for k, p in (("vm", p_vm), ("x", p_x), ("fm", p_fm))}
        gain += float((loss["vm"] - loss["x"]).sum())
        gap += float((loss["vm"] - loss["fm"]).sum())
    return gain / gap if gap > 0 else float("nan")


def calibrated_tr_ci(y: np.ndarray, p_vm: np.ndarray, p_x: np.ndarray, p_fm: np.ndarray,
                     first: np.ndarray, req: np.ndarray, resamples: int, seed: int = 0,
                     alpha: float = 0.05, crossfit: bool = False) -> dict[str, Any] | None:
    """Percentile interval and standard deviation of the calibrated TR over a bootstrap of
    whole requests (``req``: each row's request), the Platt fits redone in every resample:
    ``transfer``'s single split (Platt on ``first``, TR on the rest), or ``crossfit_tr``.
    ``values``: the finite draws themselves."""
    _, inv = np.unique(req, return_inverse=True)
    members = np.split(np.argsort(inv, kind="stable"),
                       np.cumsum(np.bincount(inv))[:-1])
    rng = np.random.default_rng(seed)
    draws = np.full(resamples, np.nan)
    for k in range(resamples):
        pick = rng.integers(0, len(members), len(members))
        idx = np.concatenate([members[j] for j in pick])
        f = first[idx]
        if f.all() or not f.any():
            continue
        a = (y[idx], p_vm[idx], p_x[idx], p_fm[idx])
        draws[k] = crossfit_tr(*a, f) if crossfit else transfer(*a, f, ~f)["tr_cal"]
    ok = draws[np.isfinite(draws)]
    if len(ok) < 2:
        return None
    lo, hi = np.quantile(ok, [alpha / 2, 1 - alpha / 2])
    return {"ci": [float(lo), float(hi)], "sd": float(ok.std(ddof=1)), "draws": int(len(ok)),
            "values": ok}


def tr_tolerance(tr_online: float) -> float:
    """The prediction bar around an online TR: max(0.03, 0.3 |TR|)."""
    return max(0.03, 0.3 * abs(tr_online))


def within_bar_share(draws: np.ndarray, tr_online: float) -> float | None:
    """Share of ``draws`` (resampled TR figures) within ``tr_tolerance`` of ``tr_online``:
    how often a like window would land within the prediction bar of this one."""
    draws = np.asarray(draws, dtype=np.float64)
    if not np.isfinite(tr_online) or not len(draws):
        return None
    return float(np.mean(np.abs(draws - tr_online) <= tr_tolerance(tr_online)))


def gain_per_row(y: np.ndarray, p_vm: np.ndarray, p_x: np.ndarray, p_fm: np.ndarray,
                 present: np.ndarray) -> dict[str, dict[str, float | None]]:
    """Each side's mean raw BCE gain per row over the VM alone (``fm``: the FM's own
    probability, ``served``: ``p_x``), on the rows with a SOLARIS input and on the rest."""
    la = M.bce_rows(y, p_vm)
    return {name: {side: float((la - M.bce_rows(y, p))[m].mean()) if m.any() else None
                   for side, m in (("present", present), ("missing", ~present))}
            for name, p in (("fm", p_fm), ("served", p_x))}


def base_calibrated_tr(y: np.ndarray, p_vm: np.ndarray, p_x: np.ndarray, p_fm: np.ndarray,
                       first: np.ndarray, second: np.ndarray) -> float:
    """TR on ``second`` with the VM alone's Platt fit on ``first`` applied to the VM alone and
    to ``p_x`` alike (so rows without SOLARIS input stay the VM alone's), the FM its own."""
    ab = M.fit_platt(y[first], p_vm[first])
    fab = M.fit_platt(y[first], p_fm[first])
    b = {k: M.bce(y[second], M.apply_platt(p[second], a))
         for k, p, a in (("vm", p_vm, ab), ("x", p_x, ab), ("fm", p_fm, fab))}
    return M.transfer_ratio(b["vm"], b["x"], b["fm"])


def tier_worth(scorer: VMScorer, rows: ServedRows, real_pair: np.ndarray,
               first: np.ndarray | None = None, resamples: int = 200, seed: int = 0,
               min_rows: int = 50) -> dict[str, dict]:
    """How much of what the row's real pair embedding gains each fallback input gains, on
    the rows where it is what is served: (BCE with it off - BCE as served) / (BCE with it
    off - BCE with the row's real pair), per input.

    * user neighbour, item neighbour: the rows served that pair tier; off = no pair slot,
      the aggregate as served in all three;
    * aggregate: the rows with an aggregate served and no pair tier; off = no aggregate;
      the real pair fills the pair slot beside the aggregate as served.

    Each arm differs from the served scores on the input's rows alone (off: the input
    removed there; real: the real pair there), so that an input served at scale 0 is worth
    exactly 0 in both figures. ``raw`` on the rows' probabilities; ``calibrated`` with each
    arm's Platt fit on the window's ``first`` half (every row; default ``halves``) applied to
    the input's rows in the second. Each with a percentile interval over ``resamples`` bootstrap
    draws of whole requests (the Platt fits kept), of the worth and of its denominator;
    ``rows``, the input's row count and ``share`` of all rows. Fewer than ``min_rows`` rows:
    worth None."""
    if first is None:
        first = halves(rows)[0]
    served = score(scorer, rows)
    real = score(scorer, rows, pair=real_pair)
    no_pair = score(scorer, rows, tiers=set())
    no_agg = score(scorer, rows, agg=False)
    second = ~first

    def platt(p: np.ndarray) -> np.ndarray:
        return M.apply_platt(p, M.fit_platt(rows.y[first], p[first]))

    served_cal = platt(served)
    inputs = ((Tier.USER_NEIGHBOUR.label, rows.tier == Tier.USER_NEIGHBOUR, no_pair),
              (Tier.ITEM_NEIGHBOUR.label, rows.tier == Tier.ITEM_NEIGHBOUR, no_pair),
              ("aggregate", rows.agg_present & (rows.tier == Tier.NONE), no_agg))
    out = {}
    for name, m, without in inputs:
        rec: dict = {"rows": int(m.sum()), "share": float(m.mean()) if len(m) else 0.0}
        out[name] = rec
        off, with_real = np.where(m, without, served), np.where(m, real, served)
        for kind, probs, mask in (("raw", {"off": off, "served": served, "real": with_real}, m),
                                  ("calibrated", {"off": platt(off), "served": served_cal,
                                                  "real": platt(with_real)}, m & second)):
            rec[kind] = _worth(rows.y, probs, mask, rows.req, resamples, seed, min_rows)
        rec["worth"] = rec["raw"]["worth"]  # the raw figure, where older readers look
    return out


def _worth(y: np.ndarray, p: dict[str, np.ndarray], mask: np.ndarray, req: np.ndarray,
           resamples: int, seed: int, min_rows: int) -> dict:
    """``tier_worth``'s figure on rows ``mask`` with its request-bootstrap intervals."""
    idx = np.flatnonzero(mask)
    if len(idx) < min_rows:
        return {"rows": int(len(idx)), "worth": None}
    loss = {k: M.bce_rows(y[idx], v[idx]) for k, v in p.items()}  # (n,) each
    gain, head = loss["off"] - loss["served"], loss["off"] - loss["real"]

    def ratio(g: float, h: float) -> float | None:
        return g / h if h > 1e-9 else None

    out = {"rows": int(len(idx)), "bce_off": float(loss["off"].mean()),
           "bce_served": float(loss["served"].mean()), "bce_real": float(loss["real"].mean()),
           "gain": float(gain.mean()), "real_gain": float(head.mean()),
           "worth": ratio(float(gain.mean()), float(head.mean()))}
    _, inv = np.unique(req[idx], return_inverse=True)
    g_req = np.bincount(inv, gain)  # per request sums, so a draw of requests is a sum
    h_req = np.bincount(inv, head)
    n_req = np.bincount(inv).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(n_req), (resamples, len(n_req)))
    n = n_req[draws].sum(1)
    g, h = g_req[draws].sum(1) / n, h_req[draws].sum(1) / n
    ok = h > 1e-9
    out["worth_ci"] = ([float(v) for v in np.quantile(g[ok] / h[ok], [0.025, 0.975])]
                       if ok.sum() >= 2 else None)
    out["real_gain_ci"] = [float(v) for v in np.quantile(h, [0.025, 0.975])]
    return out


# what fine-tuning trains: the layers that read the slots (the MLP above them too would
# re-fit the whole head on a small recent sample; on both datasets that over-fitted the
# first half and lost on the second)
SLOT_LAYERS = ("pair_proj", "pair_direct", "agg_proj", "agg_direct",
               "pair", "imputed", "agg")  # the last three: a residual VM's corrections


@torch.no_grad()
def _tiers_start_as_pair(model: torch.nn.Module) -> None:
    """Make a VM trained offline read an imputed tier as it read "pair" and ignore the age
    (the weights of those inputs never trained), so a tier-aware copy starts out scoring
    exactly as the VM it came from; fine-tuning then moves them."""
    proj = getattr(model, "pair_proj", None)
    if proj is None:
        return
    d = proj.in_features - NUM_TIERS - 2  # [z (d), present, one-hot tier (4), age]
    w = proj.weight
    for t in (Tier.USER_NEIGHBOUR, Tier.ITEM_NEIGHBOUR):
        w[:, d + 1 + t] = w[:, d + 1 + Tier.PAIR]
    w[:, d + 1 + NUM_TIERS] = 0.0


def fine_tune(scorer: VMScorer, rows: ServedRows, idx: np.ndarray, max_epochs: int = 20,
              lr: float = 3e-4, holdout: float = 0.2, patience: int = 2,
              seed: int = 0) -> tuple[VMScorer, dict]:
    """A copy of ``scorer`` fine-tuned on rows ``idx`` (event order) with their features as
    logged -- the copy is ``tier_aware``: it reads the tier and the age, starting from the
    weights it had for "pair". Only the layers that read the SOLARIS slots train
    (``SLOT_LAYERS``); the last ``holdout`` share of ``idx`` stops it early."""
    torch.manual_seed(seed)
    tuned = copy.copy(scorer)
    tuned.model = copy.deepcopy(scorer.model)
    tuned.tier_aware = True
    model = tuned.model
    _tiers_start_as_pair(model)
    params = [p for n, p in model.named_parameters()
              if n.split(".")[0] in SLOT_LAYERS and p.requires_grad]
    for n, p in model.named_parameters():
        if n.split(".")[0] not in SLOT_LAYERS:
            p.requires_grad_(False)
    opt = torch.optim.Adam(params, lr=lr)
    idx = np.asarray(idx)
    cut = int(len(idx) * (1 - holdout))
    tr, ho = idx[:cut], idx[cut:]
    y = torch.from_numpy(rows.y.astype(np.float32))

    def batch(part: np.ndarray) -> dict[str, torch.Tensor]:
        # the rows' features as logged, tier and age included (``tuned`` is tier-aware)
        return tuned.batch_rows(rows.user[part], rows.item[part], rows.surface[part],
                                rows.slots(part))

    ho_batch = batch(ho)

    def ho_loss() -> float:
        model.eval()
        with torch.no_grad():
            return F.binary_cross_entropy_with_logits(model(ho_batch), y[ho]).item()

    rng = np.random.default_rng(seed)
    best, best_state, bad, epochs = ho_loss(), copy.deepcopy(model.state_dict()), 0, 0
    start = best
    for _ in range(max_epochs):
        model.train()
        for part in np.array_split(rng.permutation(tr), max(1, len(tr) // 256)):
            loss = F.binary_cross_entropy_with_logits(model(batch(part)), y[part])
            opt.zero_grad()
            loss.backward()
            opt.step()
        epochs += 1
        cur = ho_loss()
        if cur < best - 1e-5:
            best, best_state, bad = cur, copy.deepcopy(model.state_dict()), 0
        else:
            bad += 1
            if bad >= patience:
                break
    model.load_state_dict(best_state)
    model.eval()
    return tuned, {"epochs": epochs, "holdout_bce_start": start, "holdout_bce_best": best,
                   "rows": int(len(tr)), "holdout_rows": int(len(ho))}
