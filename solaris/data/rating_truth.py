"""A ground truth for MovieLens-shaped data: a like-model fitted on every period of the log.

A closed loop (``solaris.replay.closed_loop``) needs the probability that a user likes any
item shown at any time, not only the items the user happened to rate. ``fit_truth`` fits one
on the whole interaction log (every period: it knows the future), sharing no code, weights or
architecture with the FM: a logistic factorisation with a time-aware user state -- a drift in
time, as in timeSVD (Koren, KDD 2009), and the items the user liked last, as in SVD++'s
implicit feedback. For a user ``u``, item ``i`` at time ``t`` and each of two heads
(``like``; ``love`` given ``like``)::

    logit = b + b_u + b_i + a_u * dev_u(t) + <p_u + dev_u(t) * d_u + m_u(t), q_i>
    dev_u(t) = sign(t - tbar_u) * (|t - tbar_u| / 1 day) ** 0.4 / 10
    m_u(t) = mean of x_j over the last ``HISTORY`` items j the user liked before t

where ``tbar_u`` is the mean time of the user's ratings. Fitted full-batch (Adam, L2 chosen
on a validation slice) with the real likes as the history; its BCE on held-out real ratings
is reported. Because the state follows what the user liked, a model that reads the user's
history (the FM) can know more than one that does not (the VM alone), and in a closed loop
each arm's own likes move its users' later probabilities.

``relabel`` replaces a dataset's labels with draws from the ground truth, row by row in event
order with the drawn likes as the history (random numbers fixed per row), so the periods
before the window are what the FM and the VMs would have seen had the ground truth been the
world: the Bayes BCE of every row is then known. ``RatingTruth`` is one arm's view in the
closed loop: its users' histories start from the relabelled log before the window and take
the arm's own likes. An item shown again is labelled again (one label per exposure, as with
ads). A satiation penalty for items liked before was tried and dropped: no model here can
know of it (no training row repeats a pair), and on MovieLens' bursts of requests it made
every arm show the satiated items again, burying the ranking differences the loop measures.

numpy for the probabilities; torch only to fit. No Ray.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from solaris import atomic
from solaris.data.schema import ITEM, SEQ, TS, USER, Dataset
from solaris.data.synthetic_truth import uniforms
from solaris.errors import ConfigError, DataError

HEADS = ("like", "love_given_like")
HISTORY = 10  # liked items in the user state
_DAY = 86400.0
_RELABEL_STREAMS = (11, 12)  # uniform streams of relabel (like, love)


def _dev(ts: np.ndarray, tbar: np.ndarray) -> np.ndarray:
    d = (np.asarray(ts, np.float64) - tbar) / _DAY
    return np.sign(d) * np.abs(d) ** 0.4 / 10.0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass
class GroundTruth:
    """The fitted like-model: per head, biases and factors (numpy)."""

    tbar: np.ndarray  # (U,) mean rating time per user (0 where the user has none)
    params: dict[str, dict[str, np.ndarray]]  # head -> b, bu, bi, au, p, d, q, x
    info: dict

    def state(self, head: str, liked: np.ndarray) -> np.ndarray:
        """(..., dim) the history part of the user state: the mean of ``x`` over the liked
        items ``liked`` (..., K), -1 where there is none (no item: zeros)."""
        liked = np.asarray(liked, np.int64)
        x = self.params[head]["x"]
        ok = liked >= 0
        v = np.where(ok[..., None], x[np.maximum(liked, 0)], 0.0).sum(-2)
        return v / np.maximum(ok.sum(-1), 1)[..., None]

    def logits(self, head: str, users: np.ndarray, items: np.ndarray, ts: np.ndarray,
               state: np.ndarray | None = None) -> np.ndarray:
        """Logits of ``head`` for (users, items, ts) broadcast together, with the history
        state ``state`` (..., dim) broadcast against them (None: no liked items)."""
        w = self.params[head]
        u, i = np.asarray(users, np.int64), np.asarray(items, np.int64)
        u, i, t = np.broadcast_arrays(u, i, np.asarray(ts, np.float64))
        dev = _dev(t, self.tbar[u])
        pu = w["p"][u] + dev[..., None] * w["d"][u]
        if state is not None:
            pu = pu + state
        return (w["b"][0] + w["bu"][u] + w["bi"][i] + w["au"][u] * dev
                + np.einsum("...k,...k->...", pu, w["q"][i]))

    def probs(self, users: np.ndarray, items: np.ndarray, ts: np.ndarray,
              liked: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(P(like), P(love | like)) for (users, items, ts) broadcast together, the users
        having liked ``liked`` (..., K) last (-1: none; None: nothing)."""
        out = []
        for h in HEADS:
            st = None if liked is None else self.state(h, liked)
            out.append(_sigmoid(self.logits(h, users, items, ts, st)))
        return out[0], out[1]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        arrays = {"tbar": self.tbar, **{f"{h}/{k}": v for h, w in self.params.items()
                                        for k, v in w.items()}}
        atomic.save(path, lambda f: np.savez_compressed(
            f, info=np.asarray(json.dumps(self.info)), **arrays))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "GroundTruth":
        try:
            z = np.load(path, allow_pickle=False)
            params: dict[str, dict[str, np.ndarray]] = {}
            for key in z.files:
                if "/" in key:
                    h, k = key.split("/", 1)
                    params.setdefault(h, {})[k] = z[key]
            if set(params) != set(HEADS) or any("x" not in w for w in params.values()):
                raise DataError(f"{path}: heads {sorted(params)}, expected {list(HEADS)} "
                                "with history factors")
            return cls(tbar=z["tbar"], params=params, info=json.loads(str(z["info"])))
        except (OSError, ValueError, KeyError) as e:
            raise DataError(f"{path}: not a ground-truth file ({e})") from e


class LikeHistory:
    """Each user's last ``k`` liked items, the latest last: the history part of the state."""

    def __init__(self, k: int = HISTORY) -> None:
        self.k = k
        self._items: dict[int, deque] = {}

    def add(self, user: int, items) -> None:
        """The user liked ``items`` (in this order)."""
        self._items.setdefault(int(user), deque(maxlen=self.k)).extend(int(i) for i in items)

    def liked(self, user: int) -> np.ndarray:
        """(k,) the user's latest likes, the latest last, -1 padded at the front."""
        h = list(self._items.get(int(user), ()))
        return np.asarray([-1] * (self.k - len(h)) + h, np.int64)


def liked_before(users: np.ndarray, items: np.ndarray, ts: np.ndarray, like: np.ndarray,
                 k: int = HISTORY) -> np.ndarray:
    """(N, k) for each row, the items its user liked (``like`` > 0.5) in rows strictly
    earlier in time, the latest last, -1 padded at the front. Rows must be in event order."""
    out = np.full((len(users), k), -1, np.int64)
    hist = LikeHistory(k)
    pending: dict[int, list[int]] = {}  # likes of the user's current timestamp
    cur: dict[int, float] = {}
    for r in range(len(users)):
        u, t = int(users[r]), float(ts[r])
        if cur.get(u) != t:
            hist.add(u, pending.pop(u, []))
            cur[u] = t
        out[r] = hist.liked(u)
        if like[r] > 0.5:
            pending.setdefault(u, []).append(int(items[r]))
    return out


def _labels(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    if ds.tasks[:2] != ("like", "love"):
        raise DataError(f"{ds.name}: tasks {ds.tasks}; the rating ground truth needs "
                        "('like', 'love')")
    t = ds.interactions
    return (t.column("like").to_numpy().astype(np.float32),
            t.column("love").to_numpy().astype(np.float32))


def _fit_head(users, items, dev, hist, y, num_users, num_items, dim, l2, steps, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    u, i = torch.as_tensor(users), torch.as_tensor(items)
    dv, yt = torch.as_tensor(dev, dtype=torch.float32), torch.as_tensor(y)
    # the history state as a sparse (rows x items) matrix of 1/count weights: m = H @ x
    ok = hist >= 0
    rr = np.repeat(np.arange(len(hist)), hist.shape[1])[ok.ravel()]
    wt = (1.0 / np.maximum(ok.sum(1), 1))[rr]
    hmat = torch.sparse_coo_tensor(np.stack([rr, hist.ravel()[ok.ravel()]]),
                                   wt.astype(np.float32), (len(hist), num_items),
                                   check_invariants=True).coalesce()
    rate = float(y.mean())
    w = {"b": torch.tensor([np.log(rate / (1 - rate))], dtype=torch.float32),
         "bu": torch.zeros(num_users), "bi": torch.zeros(num_items), "au": torch.zeros(num_users),
         "p": 0.05 * torch.randn(num_users, dim, generator=g),
         "d": torch.zeros(num_users, dim),
         "q": 0.05 * torch.randn(num_items, dim, generator=g),
         "x": torch.zeros(num_items, dim)}
    for v in w.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(list(w.values()), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        m = torch.sparse.mm(hmat, w["x"])
        pu = w["p"][u] + dv[:, None] * w["d"][u] + m
        logit = w["b"] + w["bu"][u] + w["bi"][i] + w["au"][u] * dv + (pu * w["q"][i]).sum(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, yt)
        reg = sum((w[k] ** 2).sum() for k in ("bu", "bi", "au", "p", "d", "q", "x")) / len(y)
        (loss + l2 * reg).backward()
        opt.step()
    return {k: v.detach().numpy().astype(np.float64) for k, v in w.items()}


def _bce(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


def fit_truth(ds: Dataset, *, dim: int = 16, l2_grid: tuple[float, ...] = (1.0, 3.0, 10.0),
              steps: int = 300, holdout: float = 0.1, seed: int = 0) -> GroundTruth:
    """The ground truth fitted on ``ds``'s interactions of every period but a random
    ``holdout`` share, on which its BCE against the real labels is reported (beside a
    constant's, and the same model's without the history state). L2 is chosen per head on a
    further random tenth of the fitted rows. The history state reads the real likes."""
    if not 0 < holdout < 0.5:
        raise ConfigError(f"holdout={holdout!r}: must be in (0, 0.5)")
    like, love = _labels(ds)
    t = ds.interactions
    users = t.column(USER).to_numpy().astype(np.int64)
    items = t.column(ITEM).to_numpy().astype(np.int64)
    ts = t.column(TS).to_numpy().astype(np.float64)
    n = len(users)
    rng = np.random.default_rng(seed)
    part = rng.random(n)
    test, val = part < holdout, (part >= holdout) & (part < holdout + 0.1 * (1 - holdout))
    fit = ~test
    tbar = np.zeros(ds.num_users)
    cnt = np.bincount(users[fit], minlength=ds.num_users)
    np.divide(np.bincount(users[fit], ts[fit], ds.num_users), cnt, out=tbar, where=cnt > 0)
    dev = _dev(ts, tbar[users])
    hist = liked_before(users, items, ts, like)
    params, info = {}, {"dim": dim, "steps": steps, "holdout": holdout, "seed": seed,
                        "history": HISTORY, "rows_fitted": int(fit.sum()),
                        "rows_held_out": int(test.sum())}
    for head, y, rows in (("like", like, np.ones(n, bool)), ("love_given_like", love,
                                                               like > 0.5)):
        def fitted(sel: np.ndarray, l2: float) -> dict:
            return _fit_head(users[sel], items[sel], dev[sel], hist[sel], y[sel],
                             ds.num_users, ds.num_items, dim, l2, steps, seed)

        def bce_on(w: dict, sel: np.ndarray, with_state: bool = True) -> float:
            gt = GroundTruth(tbar, {head: w}, {})
            st = gt.state(head, hist[sel]) if with_state else None
            return _bce(_sigmoid(gt.logits(head, users[sel], items[sel], ts[sel], st)), y[sel])

        l2 = min(l2_grid, key=lambda v: bce_on(fitted(fit & ~val & rows, v), val & rows))
        params[head] = fitted(fit & rows, l2)
        te = test & rows
        info[head] = {"l2": l2, "bce_held_out": bce_on(params[head], te),
                      "bce_held_out_without_history": bce_on(params[head], te, False),
                      "bce_constant": _bce(np.full(int(te.sum()), y[fit & rows].mean()), y[te]),
                      "rows_held_out": int(te.sum())}
    return GroundTruth(tbar, params, info)


def relabel(ds: Dataset, truth: GroundTruth, seed: int) -> Dataset:
    """``ds`` with its ``like`` and ``love`` labels drawn from ``truth`` at every row's (user,
    item, time), in event order with the likes drawn so far as the users' histories, random
    numbers fixed per (seed, row, item): the log the world of ``truth`` would have produced
    on the same exposures."""
    _labels(ds)
    t = ds.interactions
    users = t.column(USER).to_numpy().astype(np.int64)
    items = t.column(ITEM).to_numpy().astype(np.int64)
    ts = t.column(TS).to_numpy().astype(np.float64)
    seq = t.column(SEQ).to_numpy().astype(np.int64)
    u_like = uniforms(seed, seq, items, _RELABEL_STREAMS[0])
    u_love = uniforms(seed, seq, items, _RELABEL_STREAMS[1])
    like = np.zeros(len(users), bool)
    love = np.zeros(len(users), bool)
    # a user's rows of one time form a group: their histories are the likes drawn before it
    order = np.lexsort((np.arange(len(users)), ts, users))
    cut = np.flatnonzero((np.diff(users[order]) != 0) | (np.diff(ts[order]) != 0)) + 1
    hist = LikeHistory()
    for g in np.split(order, cut):
        u = int(users[g[0]])
        pl, pv = truth.probs(u, items[g], ts[g], hist.liked(u)[None, :])
        like[g] = u_like[g] < pl
        love[g] = like[g] & (u_love[g] < pv)
        hist.add(u, items[g][like[g]])
    inter = t
    for name, y in (("like", like), ("love", love)):
        j = inter.schema.get_field_index(name)
        inter = inter.set_column(j, inter.schema.field(j), pa.array(y.astype(np.float32)))
    return dataclasses.replace(ds, name=f"{ds.name}-truth", interactions=inter)


class RatingTruth:
    """One arm's ground truth over a closed-loop log: P(like) and P(love | like) of items shown
    at a log row (the user's, at the row's time). The users' history states start from
    ``seed`` -- (users, items, like) of the relabelled log before the window, in event order
    -- and then take this arm's own likes. Rows must be ``observe``d in event order."""

    def __init__(self, truth: GroundTruth, users: np.ndarray, ts: np.ndarray,
                 seed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        self.truth, self.users, self.ts = truth, np.asarray(users), np.asarray(ts)
        self.history = LikeHistory()
        if seed is not None:
            for u, i, y in zip(*(np.asarray(a) for a in seed)):
                if y > 0.5:
                    self.history.add(u, (i,))

    def liked(self, user: int) -> np.ndarray:
        """(HISTORY,) the user's latest likes, the latest last, -1 padded at the front."""
        return self.history.liked(user)

    def probs(self, r: int, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u = int(self.users[r])
        return self.truth.probs(u, np.asarray(items, np.int64), float(self.ts[r]),
                                self.liked(u)[None, :])

    def observe(self, r: int, items: np.ndarray, clicks: np.ndarray) -> None:
        c = np.asarray(clicks, bool)
        if c.any():
            self.history.add(int(self.users[r]), np.asarray(items, np.int64)[c])


def truth_at(ds: Dataset, path: str | Path, say=print) -> GroundTruth:
    """The ground truth saved at ``path``, or one fitted on ``ds`` and saved there."""
    path = Path(path)
    if path.exists():
        return GroundTruth.load(path)
    say("fitting the ground truth (a like-model on every period of the log)")
    truth = fit_truth(ds)
    path.parent.mkdir(parents=True, exist_ok=True)
    truth.save(path)
    return truth


def relabelled(ds: Dataset, path: str | Path, seed: int) -> tuple[GroundTruth, Dataset]:
    """The closed loop's MovieLens world: the ground truth at ``path`` (fitted there if
    absent) and ``ds`` relabelled by it with ``seed``."""
    truth = truth_at(ds, path)
    return truth, relabel(ds, truth, seed)
