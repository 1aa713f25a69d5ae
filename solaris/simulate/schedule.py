"""The pair-slot presence the speculation schedule gives on the test period (``c_sim``).

Random presence at coverage c tells how TR scales with c; the schedule decides *which* rows
are covered. Here the test period becomes the replay's request log (the same requests and
candidate lists: ``solaris.simulate.log``), the verifier ranks every candidate by the VM alone
(as it does in serving, so the pattern does not depend on the model under test), and the
key-level schedule simulation (``solaris.replay.coverage``, which reproduces the live
replay's pair coverage) says which labelled pairs would have been found fresh in the cache.
Those rows get their pair slot; the rest are misses.
"""

from __future__ import annotations

import numpy as np
import torch

from solaris.config import SolarisConfig
from solaris.data.schema import Dataset
from solaris.data.split import Periods
from solaris.features import FeatureTables
from solaris.models.batch import vm_batch
from solaris.models.vm import VerticalModel
from solaris.simulate.coverage import simulate_pair_coverage
from solaris.simulate.log import RequestLog, build_request_log
from solaris.simulate.log import row_index


@torch.no_grad()
def candidate_scores(model: VerticalModel, tables: FeatureTables, users: np.ndarray,
                     items: np.ndarray, surfaces: np.ndarray, batch: int = 8192,
                     request_cont: np.ndarray | None = None) -> np.ndarray:
    """Probabilities (N,) of a VM alone for arbitrary (user, item, surface) triples (ids the
    model knows), from the side-feature tables. ``request_cont`` (N, n_rq): the triples'
    standardised request-time features; None: none given, each at its training mean (0), as
    serving reads a request that carries none (the replay's request log holds no request
    features)."""
    model.eval()
    out = np.empty(len(users), np.float64)
    if request_cont is None:
        request_cont = np.zeros((len(users), tables.request_cont.shape[1]), np.float32)
    for lo in range(0, len(users), batch):
        u = np.asarray(users[lo:lo + batch], np.int64)
        i = np.asarray(items[lo:lo + batch], np.int64)
        b = vm_batch(u, i, surfaces[lo:lo + batch], tables.user_cat[u], tables.item_cat[i],
                     tables.item_cont[i], user_cont=tables.user_cont[u],
                     item_mh=tables.item_mh[i], request_cont=request_cont[lo:lo + batch],
                     dim=model.slot_dim)  # both slots absent
        out[lo:lo + batch] = torch.sigmoid(model(b)).numpy()
    return out


def window_log(cfg: SolarisConfig, ds: Dataset, periods: Periods,
               period: str = "test") -> RequestLog:
    """A period as the replay's request log: ``test`` (the window starts at the test cut, as
    the replay's), ``val`` (from the validation cut to the test cut) or ``vm`` (the VM
    period: from its cut to the validation cut)."""
    bounds = {"test": (periods.cuts[2], None), "val": (periods.cuts[1], periods.cuts[2]),
              "vm": (periods.cuts[0], periods.cuts[1])}
    if period not in bounds:
        raise ValueError(f"period={period!r}: one of {', '.join(map(repr, bounds))}")
    start, end = bounds[period]
    return build_request_log(ds, int(start), num_candidates=100,
                             granularity_s=max(1, cfg.features.request_granularity_s), seed=0,
                             end_ts=None if end is None else int(end))


def simulated_presence(cfg: SolarisConfig, ds: Dataset, tables: FeatureTables,
                       periods: Periods, base: VerticalModel, lg: RequestLog,
                       seed: int = 0, rows: np.ndarray | None = None) -> dict:
    """Which of ``rows`` (default: the test period's) the schedule covers, the verifier
    ranking ``lg``'s candidates by ``base``: ``mask`` (len(rows),) bool, its share ``c_sim``,
    ``age_s`` (len(rows),) the age each covered row's entry is read at (NaN elsewhere),
    ``history_age_s`` the same rows' age of the history its z was read as of (the entry holds
    z as of ``req_ts - history_age_s``: ``age_s`` under ``schedule.history_at: request``, the
    time since its release under ``visible``), and the simulation's pair coverage of labelled
    pairs, FM evaluations and precision."""
    target = periods.test if rows is None else np.asarray(rows, np.int64)
    r, c = lg.candidates.shape
    scores = candidate_scores(base, tables, np.repeat(lg.user, c), lg.candidates.ravel(),
                              np.repeat(lg.surface, c)).reshape(r, c)
    s = cfg.schedule
    sim = simulate_pair_coverage(lg, scores, fraction=cfg.verifier.fraction,
                                 horizon_s=cfg.verifier.horizon_s,
                                 read_ttl_s=float(cfg.cache.read_ttl_s), lag_s=s.lag_s,
                                 tick_s=s.tick_s, budget_per_hour=s.budget_per_hour, seed=seed)
    lab = lg.labelled
    ri, ci = np.nonzero(lab)
    within = cfg.features.request_granularity_s if ds.requests is None else 1
    rows = row_index(ds, lg.user[ri], lg.candidates[ri, ci], lg.ts[ri], max(1, within))
    pos = np.full(tables.num_rows, -1, np.int64)
    pos[target] = np.arange(len(target))
    mask = np.zeros(len(target), bool)
    age = np.full(len(target), np.nan)
    ok = rows >= 0
    at = pos[rows[ok]]
    mask[at[at >= 0]] = sim["found"][ri[ok], ci[ok]][at >= 0]
    age[at[at >= 0]] = sim["age_s"][ri[ok], ci[ok]][at >= 0]
    age[~mask] = np.nan
    # how old the history the entry's z reads is: as of its write (``request``) or of its
    # release (``visible``: the FM worker reads the history as of the tick end)
    hist = age.copy()
    if cfg.schedule.history_at == "visible":
        hist[at[at >= 0]] = sim["visible_age_s"][ri[ok], ci[ok]][at >= 0]
        hist[~mask] = np.nan
    return {"mask": mask, "age_s": age, "history_age_s": hist, "c_sim": float(mask.mean()),
            "pair_simulated": sim["pair"],
            "fm_evals": int(sim["fm_evals"]), "precision": sim["precision"],
            "labelled_mapped": float(np.mean(at >= 0)) if len(at) else float("nan")}
