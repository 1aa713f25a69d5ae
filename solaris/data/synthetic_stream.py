"""Event-time part of the synthetic generator: drifting interests, sessions, requests, labels.

Events are generated window by window (about a day, across all users), so rows come out in
global time order and a 10M-row log never sits in memory whole. Each window draws from its own
seeded stream ``(seed, window)``: output does not depend on how a caller chunks it.

Per request: a retrieval stage returns ``candidates_per_request`` items (nearest to a *noisy*
estimate of the user's interest, plus popular items; the noise redrawn per request, or with
``retrieval_memory_h`` > 0 a per-user state drifting over hours, as a feed's); a ranker with
its own noisy estimate impresses the top ``impressions_per_request``; only those get labels. The click logit uses the
user's *current* interest on that surface, pulled toward the items clicked earlier in the same
session (session intent), minus a penalty for re-clicking an item of this session (satiation):
effects that only a model reading the behaviour sequence can see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from solaris.data.schema import interaction_schema, request_schema
from solaris.data.synthetic_world import DAY, EPOCH, World, matmul, rowdot, unit

TASKS = ("click", "conversion")
NEAR_SHARE = 0.7  # share of candidates from the noisy-interest retrieval (rest: popular)
RETRIEVAL_NOISE = 2.0  # noise scale on the retrieval's estimate of the user's interest
RANK_GUMBEL = 3.0  # extra noise on the ranking score (some exploration in impressions)
SATIATION = 2.0  # click-logit penalty for an item already clicked in this session
CONV_AFFINITY = 1.0  # weight of interest affinity in the conversion logit
POP_STATE_SCALE = 1.28  # sd of a stateful retrieval's popular-score noise (a Gumbel's sd)
GAP_MIN_S, GAP_MEAN_S = 30, 150  # seconds between a session's requests: min + exponential
MAX_SESSION = 20  # cap on requests per session
MAX_WINDOW_CANDIDATES = 20_000_000  # windows shrink below a day when a day would hold more
SCORE_BATCH = 2_000_000  # (request x item) scores held at once by retrieval
PILOT_REQUESTS = 4000  # requests simulated to fit the global click / conversion biases


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass
class Events:
    """Generated requests (arrays aligned on the request axis), ts relative to EPOCH."""

    order: np.ndarray  # (R,) int64 global generation order: tie-break for equal ts
    user: np.ndarray  # (R,) int64
    ts: np.ndarray  # (R,) int64 seconds since event time 0
    surface: np.ndarray  # (R,) int32
    cand: np.ndarray  # (R, C) int32 candidate items
    imp: np.ndarray  # (R, M) int64 positions into cand of the impressed ones, ranker order
    click: np.ndarray  # (R, M) float32
    conv: np.ndarray  # (R, M) float32
    # what the labels were drawn from (the closed loop draws its own from the same model)
    interest: np.ndarray  # (R, d) float32 the user's unit interest on the request's surface
    session: np.ndarray  # (R,) int64 global session id (window << 32 | session in window)

    def take(self, idx: np.ndarray) -> "Events":
        return Events(**{f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)})

    @staticmethod
    def concat(a: "Events", b: "Events") -> "Events":
        return Events(**{f.name: np.concatenate([getattr(a, f.name), getattr(b, f.name)])
                         for f in dataclasses.fields(a)})


def retrieve_and_rank(rng: np.random.Generator, world: World, u_req: np.ndarray,
                      ts: np.ndarray, state: tuple[np.ndarray, np.ndarray] | None = None,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Candidates (R, C) int32 and impressed positions (R, M), for unit interests ``u_req``.

    ``state``: the retrieval's own noise per request, standard normal (R, d) on its interest
    estimate and (R, I) on the popular items' log popularity (a stateful retrieval, drawn by
    ``retrieval_state``); None: redrawn here (the interest noise Gaussian, the popular part
    sampled by popularity without replacement).
    """
    cfg = world.cfg
    n, d = u_req.shape
    c, m = cfg.candidates_per_request, cfg.impressions_per_request
    k_near = int(round(NEAR_SHARE * c))
    k_pop = c - k_near
    vt = np.ascontiguousarray(world.item_vec.T, dtype=np.float32)  # (d, I)
    neg_pop = -np.exp(world.item_logpop - world.item_logpop.max()).astype(np.float32)  # (I,)
    quality = world.item_quality.astype(np.float32)
    ret_noise = rng.standard_normal((n, d)) if state is None else state[0]
    est_ret = unit(u_req + RETRIEVAL_NOISE * ret_noise / np.sqrt(d))
    if state is not None:  # lowest first, like neg_pop / Exp(1) below
        pop_state = -(world.item_logpop.astype(np.float32)[None, :]
                      + POP_STATE_SCALE * state[1].astype(np.float32))
    est_rank = unit(u_req + cfg.rank_noise * rng.standard_normal((n, d)) / np.sqrt(d))
    cand = np.empty((n, c), dtype=np.int32)
    imp = np.empty((n, m), dtype=np.int64)
    step = max(1, SCORE_BATCH // len(neg_pop))
    for lo in range(0, n, step):
        sl = slice(lo, min(n, lo + step))
        late = np.flatnonzero(world.item_release > ts[sl].min())  # items unreleased for some
        hidden = world.item_release[late][None, :] > ts[sl, None]  # (B, L)
        near_s = matmul(-est_ret[sl].astype(np.float32), vt)  # (B, I) negated: lowest first
        near_s[:, late] = np.where(hidden, np.inf, near_s[:, late])
        near = np.argpartition(near_s, k_near - 1, axis=1)[:, :k_near]
        # popular part: top-k of pop / Exp(1) (= log pop + Gumbel), i.e. sampling by
        # popularity without replacement; Exp(1) may round to 0 in float32: score -inf, fine
        if state is None:
            pop_s = rng.standard_exponential(near_s.shape, dtype=np.float32)
            with np.errstate(divide="ignore"):
                np.divide(neg_pop[None, :], pop_s, out=pop_s)
        else:
            pop_s = pop_state[sl].copy()
        pop_s[:, late] = np.where(hidden, np.inf, pop_s[:, late])
        np.put_along_axis(pop_s, near, np.inf, axis=1)
        popular = np.argpartition(pop_s, k_pop - 1, axis=1)[:, :k_pop]
        cc = np.concatenate([near, popular], axis=1)  # (B, C)
        cand[sl] = cc
        aff = rowdot(est_rank[sl, None, :].astype(np.float32), vt.T[cc])  # (B, C)
        score = (cfg.affinity * aff + quality[cc]
                 + RANK_GUMBEL * rng.gumbel(size=cc.shape).astype(np.float32))
        top = np.argpartition(-score, m - 1, axis=1)[:, :m]  # (B, M) impressed, unordered
        by_score = np.argsort(-np.take_along_axis(score, top, axis=1), axis=1, kind="stable")
        imp[sl] = np.take_along_axis(top, by_score, axis=1)
    return cand, imp


def _click_logit(world: World, u_eff: np.ndarray, items: np.ndarray, users: np.ndarray,
                 surface: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Click logit without the global bias, and the interest affinity, both (R, M)."""
    aff = rowdot(u_eff[:, None, :], world.item_vec[items])
    logit = (world.cfg.affinity * aff + world.item_quality[items]
             + world.user_bias[users][:, None] + world.surface_bias[surface][:, None])
    return logit, aff


def _conv_logit(world: World, aff: np.ndarray, items: np.ndarray, users: np.ndarray) -> np.ndarray:
    return world.item_conv[items] + world.user_conv[users][:, None] + CONV_AFFINITY * aff


def _solve_bias(mean_at: Callable[[float], float], target: float) -> float:
    lo, hi = -30.0, 30.0  # mean_at increases with the bias
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_at(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def calibrate(world: World) -> World:
    """Fit the global click / conversion biases on a pilot of requests over the horizon.

    The pilot's interests drift for a random time (one Gaussian step: a random walk's
    marginal), so the fitted rates hold on average over the horizon, not only at its start.
    """
    cfg = world.cfg
    rng = _rng(cfg.seed, 1)
    n_u, d = world.user_vec0.shape
    users = rng.integers(0, n_u, size=PILOT_REQUESTS)
    surface = (world.surface_cdf[users] < rng.random((PILOT_REQUESTS, 1))).sum(1)
    age_days = rng.uniform(0.0, cfg.days, size=(PILOT_REQUESTS, 1))
    walk = age_days
    if cfg.taste_memory_days > 0:  # an OU process's spread saturates at about half its memory
        walk = np.minimum(age_days, cfg.taste_memory_days / 2.0)
    now = unit(world.user_vec0[users] + cfg.drift * np.sqrt(walk / d)
               * rng.standard_normal((PILOT_REQUESTS, d)))
    u_req = unit(now + world.surface_offset[users, surface])
    state = None
    if cfg.retrieval_memory_h > 0:  # a stationary retrieval state's marginal: fresh normals
        state = (rng.standard_normal((PILOT_REQUESTS, d)),
                 rng.standard_normal((PILOT_REQUESTS, len(world.item_logpop))))
    cand, imp = retrieve_and_rank(rng, world, u_req, np.zeros(PILOT_REQUESTS, dtype=np.int64),
                                  state)
    items = np.take_along_axis(cand, imp, axis=1)
    base, aff = _click_logit(world, u_req, items, users, surface)
    click_bias = _solve_bias(lambda b: float(_sigmoid(base + b).mean()), cfg.click_rate)
    p_click = _sigmoid(base + click_bias)
    conv = _conv_logit(world, aff, items, users)
    conv_bias = _solve_bias(lambda b: float((p_click * _sigmoid(conv + b)).mean()),
                            cfg.conversion_rate)
    return dataclasses.replace(world, click_bias=click_bias, conv_bias=conv_bias)


@dataclass
class RetrievalState:
    """Each user's stateful retrieval noise (``retrieval_memory_h`` > 0) and when it was
    last read; a user never read draws from the stationary marginal."""

    ret: np.ndarray  # (U, d) float64
    pop: np.ndarray  # (U, I) float32
    last: np.ndarray  # (U,) float64 seconds, -inf: never read

    @staticmethod
    def empty(num_users: int, dim: int, num_items: int) -> "RetrievalState":
        return RetrievalState(np.zeros((num_users, dim)),
                              np.zeros((num_users, num_items), dtype=np.float32),
                              np.full(num_users, -np.inf))


def retrieval_state(rng: np.random.Generator, st: RetrievalState, memory_s: float,
                    user: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The retrieval noise of requests (``user``, ``ts``): each user's state moved on by an
    Ornstein-Uhlenbeck step of time constant ``memory_s`` from its last read, request by
    request in time order (``st`` updated in place). Returns (R, d) and (R, I) noise."""
    n = len(user)
    out_ret = np.empty((n, st.ret.shape[1]))
    out_pop = np.empty((n, st.pop.shape[1]), dtype=np.float32)
    order = np.lexsort((ts, user))
    u_sorted = user[order]
    first = np.r_[True, u_sorted[1:] != u_sorted[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    rank = np.arange(n) - start  # k-th request of its user here
    for k in range(int(rank.max(initial=-1)) + 1):
        rows = order[rank == k]
        u = user[rows]
        dt = np.maximum(ts[rows] - st.last[u], 0.0)  # a late session's request: no step back
        a = np.exp(-dt / memory_s)
        b = np.sqrt(1.0 - a * a)
        st.ret[u] = (a[:, None] * st.ret[u]
                     + b[:, None] * rng.standard_normal((len(u), st.ret.shape[1])))
        st.pop[u] = (a[:, None] * st.pop[u]
                     + b[:, None] * rng.standard_normal(st.pop[u].shape, dtype=np.float32))
        st.last[u] = ts[rows]
        out_ret[rows], out_pop[rows] = st.ret[u], st.pop[u]
    return out_ret, out_pop


def _window(world: World, rng: np.random.Generator, t0: int, t1: int, interest: np.ndarray,
            order0: int, window: int = 0, rstate: RetrievalState | None = None,
            ) -> tuple[Events, np.ndarray]:
    """Requests whose sessions start in [t0, t1), and the interests drifted to t1.
    ``rstate``: the users' retrieval state (stateful retrieval only), carried on in place."""
    cfg = world.cfg
    n_u, d = interest.shape
    step = cfg.drift * np.sqrt((t1 - t0) / DAY / d) * rng.standard_normal((n_u, d))
    if cfg.taste_memory_days > 0:  # pulled back toward the home taste (Ornstein-Uhlenbeck)
        a = np.exp(-(t1 - t0) / DAY / cfg.taste_memory_days)
        drifted = unit(a * interest + (1.0 - a) * world.user_vec0 + step)
    else:
        drifted = unit(interest + step)

    # sessions: a Cox process, each user's rate times a bursty per-window multiplier
    start = np.maximum(world.user_arrival, t0)
    active_days = np.clip(t1 - start, 0, None) / DAY
    burst = rng.gamma(cfg.burst_shape, 1.0 / cfg.burst_shape, size=n_u)
    s_user = np.repeat(np.arange(n_u), rng.poisson(world.user_rate * active_days * burst))
    n_sess = len(s_user)
    s_start = start[s_user] + (rng.random(n_sess) * (t1 - start[s_user])).astype(np.int64)
    s_len = np.minimum(1 + rng.poisson(cfg.requests_per_session - 1.0, size=n_sess), MAX_SESSION)
    s_surf = (world.surface_cdf[s_user] < rng.random((n_sess, 1))).sum(1).astype(np.int32)

    # requests: a few minutes apart, all on the session's surface
    n_req = int(s_len.sum())
    r_sess = np.repeat(np.arange(n_sess), s_len)
    first = np.repeat(np.cumsum(s_len) - s_len, s_len)
    r_pos = np.arange(n_req) - first
    gaps = GAP_MIN_S + rng.exponential(GAP_MEAN_S, size=n_req).astype(np.int64)
    gaps[r_pos == 0] = 0
    csum = np.cumsum(gaps)
    r_ts = s_start[r_sess] + csum - csum[first]
    r_user, r_surf = s_user[r_sess], s_surf[r_sess]
    frac = np.clip((r_ts - t0) / max(t1 - t0, 1), 0.0, 1.0)[:, None]
    now = unit((1.0 - frac) * interest[r_user] + frac * drifted[r_user])  # (R, d)
    u_req = unit(now + world.surface_offset[r_user, r_surf])
    state = None
    if rstate is not None:  # its own stream: the window's other draws stay as they are
        srng = _rng(cfg.seed, 3, window)
        held = retrieval_state(srng, rstate, cfg.retrieval_memory_h * 3600.0, r_user, r_ts)
        # each request's own part: the share of the variance the user's state does not hold
        rho = np.sqrt(cfg.retrieval_persistence)
        fresh = np.sqrt(1.0 - cfg.retrieval_persistence)
        state = (rho * held[0] + fresh * srng.standard_normal(held[0].shape),
                 rho * held[1] + fresh * srng.standard_normal(held[1].shape, dtype=np.float32))
    cand, imp = retrieve_and_rank(rng, world, u_req, r_ts, state)
    items = np.take_along_axis(cand, imp, axis=1).astype(np.int64)  # (R, M)

    # labels, one session position at a time: earlier clicks shape later requests
    m = cfg.impressions_per_request
    click = np.zeros((n_req, m), dtype=np.float32)
    conv = np.zeros((n_req, m), dtype=np.float32)
    intent = np.zeros((n_sess, d))
    n_clicked = np.zeros(n_sess)
    clicked_keys = np.zeros(0, dtype=np.int64)  # session * num_items + item, clicked so far
    n_i = len(world.item_release)
    for p in range(int(s_len.max(initial=0))):
        rows = np.flatnonzero(r_pos == p)
        s, it, u = r_sess[rows], items[rows], r_user[rows]
        pull = cfg.session_intent * intent[s] / np.maximum(n_clicked[s], 1.0)[:, None]
        logit, aff = _click_logit(world, unit(u_req[rows] + pull), it, u, r_surf[rows])
        keys = s[:, None] * n_i + it
        logit -= SATIATION * np.isin(keys, clicked_keys)
        c = rng.random(it.shape) < _sigmoid(logit + world.click_bias)
        cv = c & (rng.random(it.shape) < _sigmoid(_conv_logit(world, aff, it, u) + world.conv_bias))
        click[rows], conv[rows] = c, cv
        intent[s] += (c[..., None] * world.item_vec[it]).sum(1)
        n_clicked[s] += c.sum(1)
        clicked_keys = np.concatenate([clicked_keys, keys[c]])
    ev = Events(order=order0 + np.arange(n_req, dtype=np.int64), user=r_user.astype(np.int64),
                ts=r_ts.astype(np.int64), surface=r_surf, cand=cand, imp=imp, click=click,
                conv=conv, interest=u_req.astype(np.float32),
                session=(np.int64(window) << 32) + r_sess.astype(np.int64))
    return ev, drifted


def to_tables(ev: Events, first_request: int, first_seq: int) -> tuple[pa.Table, pa.Table]:
    """Interaction rows (ranker order within a request) and request rows of time-sorted ``ev``."""
    n, c = ev.cand.shape
    m = ev.imp.shape[1]
    ts = ev.ts + EPOCH
    items = np.take_along_axis(ev.cand, ev.imp, axis=1).astype(np.int64)
    inter = pa.Table.from_arrays([
        pa.array(first_seq + np.arange(n * m, dtype=np.int64)),
        pa.array(np.repeat(ev.user, m)),
        pa.array(items.ravel()),
        pa.array(np.repeat(ts, m)),
        pa.array(np.repeat(ev.surface, m).astype(np.int32)),
        pa.array(ev.click.ravel()),
        pa.array(ev.conv.ravel()),
    ], schema=interaction_schema(TASKS))
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * c)

    def lists(values: np.ndarray) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values.ravel()))

    shown = np.zeros((n, c), dtype=bool)
    np.put_along_axis(shown, ev.imp, True, axis=1)
    labels = []
    for y in (ev.click, ev.conv):
        full = np.full((n, c), np.nan, dtype=np.float32)
        np.put_along_axis(full, ev.imp, y, axis=1)
        labels.append(lists(full))
    req = pa.Table.from_arrays([
        pa.array(first_request + np.arange(n, dtype=np.int64)),
        pa.array(ev.user),
        pa.array(ts),
        pa.array(ev.surface.astype(np.int32)),
        lists(ev.cand.astype(np.int64)),
        lists(shown),
        *labels,
    ], schema=request_schema(TASKS))
    return inter, req


def num_windows(world: World) -> int:
    """About one window per day; shorter when a day would hold too many candidates."""
    cfg = world.cfg
    candidates = cfg.target_interactions / cfg.impressions_per_request * cfg.candidates_per_request
    return max(1, int(np.ceil(cfg.days)), int(np.ceil(candidates / MAX_WINDOW_CANDIDATES)))


def iter_events(world: World) -> Iterator[Events]:
    """Each window's requests as ``Events``, globally sorted by (ts, generation order): the
    n-th request over all windows is request id n.

    Sessions that run past a window's end are held back and merged into the next window's
    output, so every emitted request is older than every later one.
    """
    n_win = num_windows(world)
    edges = np.arange(n_win + 1, dtype=np.int64) * world.horizon_s // n_win
    interest = world.user_vec0
    rstate = None
    if world.cfg.retrieval_memory_h > 0:
        rstate = RetrievalState.empty(*world.user_vec0.shape, len(world.item_logpop))
    pending: Events | None = None
    order = 0
    for w in range(n_win):
        ev, interest = _window(world, _rng(world.cfg.seed, 2, w), int(edges[w]),
                               int(edges[w + 1]), interest, order, w, rstate)
        order += len(ev.ts)
        pending = ev if pending is None else Events.concat(pending, ev)
        due = pending.ts < edges[w + 1] if w < n_win - 1 else np.ones(len(pending.ts), bool)
        out = pending.take(np.flatnonzero(due))
        pending = pending.take(np.flatnonzero(~due))
        yield out.take(np.lexsort((out.order, out.ts)))


def iter_windows(world: World) -> Iterator[tuple[pa.Table, pa.Table]]:
    """(interactions, requests) per window, globally sorted by (ts, seq) / (ts, request_id)."""
    next_request = next_seq = 0
    for out in iter_events(world):
        inter, req = to_tables(out, next_request, next_seq)
        next_request += req.num_rows
        next_seq += inter.num_rows
        yield inter, req
