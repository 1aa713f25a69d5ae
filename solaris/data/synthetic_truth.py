"""The synthetic world's own click model as the ground truth of a closed loop.

A closed loop (``solaris.replay.closed_loop``) lets each arm choose what is shown; the labels
of what it shows must then come from the model that generated the data, not from the log.
``arrivals`` regenerates the window's requests exactly as the generator made them (the same
seeded streams, so request ids, users, times and candidates match the dataset) together with
what their labels were drawn from: the user's interest on the request's surface and the
session. ``SessionTruth`` is one arm's view of that model: the click probability of an item
shown at a request follows the user's interest pulled toward the items the user clicked
earlier in the same session (session intent), minus the satiation penalty for an item
already clicked in the session -- so an arm's own clicks shape its later probabilities, as
in the generator. Sessions that began before the window start with no clicks.

numpy only; no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solaris.data.synthetic_stream import (SATIATION, Events, _click_logit, _conv_logit,
                                           _sigmoid, iter_events)
from solaris.data.synthetic_world import EPOCH, World, unit


@dataclass(frozen=True)
class Arrivals:
    """The window's requests in the dataset's order (request id ascending), ts absolute."""

    request_id: np.ndarray  # (R,) int64
    user: np.ndarray  # (R,) int64
    ts: np.ndarray  # (R,) int64 absolute event seconds (EPOCH-based, as in the dataset)
    surface: np.ndarray  # (R,) int32
    candidates: np.ndarray  # (R, C) int64
    interest: np.ndarray  # (R, d) float32
    session: np.ndarray  # (R,) int64


def arrivals(world: World, start_ts: int) -> Arrivals:
    """Requests with absolute ts >= ``start_ts``, regenerated from the world's seed."""
    parts: list[tuple[np.ndarray, Events]] = []
    next_id = 0
    for ev in iter_events(world):
        n = len(ev.ts)
        keep = np.flatnonzero(ev.ts + EPOCH >= start_ts)
        if len(keep):
            parts.append((next_id + keep, ev.take(keep)))
        next_id += n
    if not parts:
        raise ValueError(f"no synthetic request at or after ts={start_ts}")
    ids = np.concatenate([p[0] for p in parts]).astype(np.int64)

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p[1], name) for p in parts])

    return Arrivals(request_id=ids, user=cat("user").astype(np.int64),
                    ts=(cat("ts") + EPOCH).astype(np.int64),
                    surface=cat("surface").astype(np.int32),
                    candidates=cat("cand").astype(np.int64), interest=cat("interest"),
                    session=cat("session").astype(np.int64))


class SessionTruth:
    """One arm's ground truth: click and conversion probabilities of shown items, with the
    session state (intent, items clicked) built from this arm's own clicks. Requests must
    be ``observe``d in event order."""

    def __init__(self, world: World, arr: Arrivals) -> None:
        self.world, self.arr = world, arr
        self._intent: dict[int, np.ndarray] = {}
        self._clicks: dict[int, int] = {}
        self._clicked: dict[int, set[int]] = {}

    def probs(self, r: int, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P(click), P(conversion | click)), each (n,), of ``items`` shown at request ``r``
        (a position in the arrivals)."""
        w, a = self.world, self.arr
        items = np.asarray(items, np.int64)
        s = int(a.session[r])
        d = w.item_vec.shape[1]
        pull = w.cfg.session_intent * self._intent.get(s, np.zeros(d)) / max(
            self._clicks.get(s, 0), 1)
        u_eff = unit(a.interest[r].astype(np.float64) + pull)[None, :]
        logit, aff = _click_logit(w, u_eff, items[None, :], a.user[r:r + 1],
                                  a.surface[r:r + 1])
        seen = self._clicked.get(s, set())
        logit = logit[0] - SATIATION * np.fromiter((int(i) in seen for i in items), bool,
                                                   len(items))
        p_click = _sigmoid(logit + w.click_bias)
        p_conv = _sigmoid(_conv_logit(w, aff, items[None, :], a.user[r:r + 1])[0] + w.conv_bias)
        return p_click, p_conv

    def observe(self, r: int, items: np.ndarray, clicks: np.ndarray) -> None:
        """The arm showed ``items`` at request ``r`` and these were clicked."""
        c = np.asarray(clicks, bool)
        if not c.any():
            return
        s = int(self.arr.session[r])
        it = np.asarray(items, np.int64)[c]
        d = self.world.item_vec.shape[1]
        self._intent[s] = self._intent.get(s, np.zeros(d)) + self.world.item_vec[it].sum(0)
        self._clicks[s] = self._clicks.get(s, 0) + int(c.sum())
        self._clicked.setdefault(s, set()).update(int(i) for i in it)


def uniforms(seed: int, request_ids: np.ndarray, items: np.ndarray, stream: int) -> np.ndarray:
    """Uniforms in [0, 1) fixed per (seed, request, item, stream), shaped like ``items``
    (``request_ids`` broadcast against it): every arm that shows an item at a request meets
    the same random number (splitmix64 of the key)."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed & 0xFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
             ^ np.asarray(request_ids, np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
             ^ np.asarray(items, np.uint64) * np.uint64(0x94D049BB133111EB)
             ^ np.uint64(stream) * np.uint64(0xD6E8FEB86659FD93))
        for _ in range(2):
            x = x + np.uint64(0x9E3779B97F4A7C15)
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
