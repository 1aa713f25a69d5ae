"""A ground truth for MovieLens-shaped data: a like-model fitted on every period of the log.

A closed loop (``solaris.replay.closed_loop``) needs the probability that a user likes any
item shown at any time, not only the items the user happened to rate. ``fit_truth`` fits one
on the whole interaction log (every period: it knows the future), sharing no code, weights or
architecture with the FM: a logistic factorisation with a time-aware user state, in the
spirit of timeSVD (Koren, KDD 2009). For a user ``u``, item ``i`` at time ``t`` and each of
two heads (``like``; ``love`` given ``like``)::

    logit = b + b_u + b_i + a_u * dev_u(t) + <p_u + dev_u(t) * d_u, q_i>
    dev_u(t) = sign(t - tbar_u) * (|t - tbar_u| / 1 day) ** 0.4 / 10

where ``tbar_u`` is the mean time of the user's ratings. Fitted full-batch (Adam, L2 chosen
on a validation slice); its BCE on held-out real ratings is reported.

``relabel`` replaces a dataset's labels with draws from the ground truth (random numbers fixed
per row), so the periods before the window are what the FM and the VMs would have seen had
the ground truth been the world: the Bayes BCE of every row is then known. ``RatingTruth`` is
one arm's view in the closed loop: an item shown again is labelled again, from the same
probability (one label per exposure, as with ads). A satiation penalty for items liked before
was tried and dropped: no model here can know of it (the VM alone reads no history, and no
training row repeats a pair), so on MovieLens' bursts of requests it made every arm show the
satiated items again and buried the ranking differences the loop is there to measure.

numpy for the probabilities; torch only to fit. No Ray.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from solaris.data.schema import ITEM, SEQ, TS, USER, Dataset
from solaris.data.synthetic_truth import uniforms
from solaris.errors import ConfigError, DataError

HEADS = ("like", "love_given_like")
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
    params: dict[str, dict[str, np.ndarray]]  # head -> b, bu, bi, au, p, d, q
    info: dict

    def logits(self, head: str, users: np.ndarray, items: np.ndarray, ts: np.ndarray
               ) -> np.ndarray:
        """Logits of ``head`` for (users, items, ts) broadcast together."""
        w = self.params[head]
        u, i = np.asarray(users, np.int64), np.asarray(items, np.int64)
        u, i, t = np.broadcast_arrays(u, i, np.asarray(ts, np.float64))
        dev = _dev(t, self.tbar[u])
        pu = w["p"][u] + dev[..., None] * w["d"][u]
        return (w["b"][0] + w["bu"][u] + w["bi"][i] + w["au"][u] * dev
                + np.einsum("...k,...k->...", pu, w["q"][i]))

    def probs(self, users: np.ndarray, items: np.ndarray, ts: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """(P(like), P(love | like)) for (users, items, ts) broadcast together."""
        return (_sigmoid(self.logits("like", users, items, ts)),
                _sigmoid(self.logits("love_given_like", users, items, ts)))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        arrays = {"tbar": self.tbar, **{f"{h}/{k}": v for h, w in self.params.items()
                                        for k, v in w.items()}}
        np.savez_compressed(path, info=np.asarray(json.dumps(self.info)), **arrays)
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
            if set(params) != set(HEADS):
                raise DataError(f"{path}: heads {sorted(params)}, expected {list(HEADS)}")
            return cls(tbar=z["tbar"], params=params, info=json.loads(str(z["info"])))
        except (OSError, ValueError, KeyError) as e:
            raise DataError(f"{path}: not a ground-truth file ({e})") from e


def _labels(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    if ds.tasks[:2] != ("like", "love"):
        raise DataError(f"{ds.name}: tasks {ds.tasks}; the rating ground truth needs "
                        "('like', 'love')")
    t = ds.interactions
    return (t.column("like").to_numpy().astype(np.float32),
            t.column("love").to_numpy().astype(np.float32))


def _fit_head(users, items, dev, y, num_users, num_items, dim, l2, steps, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    u, i = torch.as_tensor(users), torch.as_tensor(items)
    dv, yt = torch.as_tensor(dev, dtype=torch.float32), torch.as_tensor(y)
    rate = float(y.mean())
    w = {"b": torch.tensor([np.log(rate / (1 - rate))], dtype=torch.float32),
         "bu": torch.zeros(num_users), "bi": torch.zeros(num_items), "au": torch.zeros(num_users),
         "p": 0.05 * torch.randn(num_users, dim, generator=g),
         "d": torch.zeros(num_users, dim),
         "q": 0.05 * torch.randn(num_items, dim, generator=g)}
    for v in w.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(list(w.values()), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        pu = w["p"][u] + dv[:, None] * w["d"][u]
        logit = w["b"] + w["bu"][u] + w["bi"][i] + w["au"][u] * dv + (pu * w["q"][i]).sum(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, yt)
        reg = sum((w[k] ** 2).sum() for k in ("bu", "bi", "au", "p", "d", "q")) / len(y)
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
    constant's). L2 is chosen per head on a further random tenth of the fitted rows."""
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
    params, info = {}, {"dim": dim, "steps": steps, "holdout": holdout, "seed": seed,
                        "rows_fitted": int(fit.sum()), "rows_held_out": int(test.sum())}
    for head, y, rows in (("like", like, np.ones(n, bool)), ("love_given_like", love,
                                                               like > 0.5)):
        best = None
        for l2 in l2_grid:
            tr = fit & ~val & rows
            w = _fit_head(users[tr], items[tr], dev[tr], y[tr], ds.num_users, ds.num_items,
                          dim, l2, steps, seed)
            gt = GroundTruth(tbar, {head: w}, {})
            v = val & rows
            score = _bce(_sigmoid(gt.logits(head, users[v], items[v], ts[v])), y[v])
            if best is None or score < best[0]:
                best = (score, l2)
        l2 = best[1]
        tr = fit & rows
        params[head] = _fit_head(users[tr], items[tr], dev[tr], y[tr], ds.num_users,
                                 ds.num_items, dim, l2, steps, seed)
        gt = GroundTruth(tbar, {head: params[head]}, {})
        te = test & rows
        p = _sigmoid(gt.logits(head, users[te], items[te], ts[te]))
        info[head] = {"l2": l2, "bce_held_out": _bce(p, y[te]),
                      "bce_constant": _bce(np.full(int(te.sum()), y[tr].mean()), y[te]),
                      "rows_held_out": int(te.sum())}
    return GroundTruth(tbar, params, info)


def relabel(ds: Dataset, truth: GroundTruth, seed: int) -> Dataset:
    """``ds`` with its ``like`` and ``love`` labels drawn from ``truth`` at every row's (user,
    item, time), with random numbers fixed per (seed, row, item): the log the world of
    ``truth`` would have produced on the same exposures."""
    _labels(ds)
    t = ds.interactions
    users = t.column(USER).to_numpy().astype(np.int64)
    items = t.column(ITEM).to_numpy().astype(np.int64)
    seq = t.column(SEQ).to_numpy().astype(np.int64)
    pl, pv = truth.probs(users, items, t.column(TS).to_numpy())
    like = uniforms(seed, seq, items, _RELABEL_STREAMS[0]) < pl
    love = like & (uniforms(seed, seq, items, _RELABEL_STREAMS[1]) < pv)
    inter = t
    for name, y in (("like", like), ("love", love)):
        j = inter.schema.get_field_index(name)
        inter = inter.set_column(j, inter.schema.field(j), pa.array(y.astype(np.float32)))
    return dataclasses.replace(ds, name=f"{ds.name}-truth", interactions=inter)


class RatingTruth:
    """One arm's ground truth over a closed-loop log: P(like) and P(love | like) of items shown
    at a log row (the user's, at the row's time). Stateless: what the arm showed before does
    not move it (``observe`` is there for the loop's interface)."""

    def __init__(self, truth: GroundTruth, users: np.ndarray, ts: np.ndarray) -> None:
        self.truth, self.users, self.ts = truth, np.asarray(users), np.asarray(ts)

    def probs(self, r: int, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.truth.probs(int(self.users[r]), np.asarray(items, np.int64),
                                float(self.ts[r]))

    def observe(self, r: int, items: np.ndarray, clicks: np.ndarray) -> None:
        pass


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
