"""The FM checker: one call on a team's FM class names every broken promise of the interface.

``check_fm("mypackage.models:MyFM")`` (``solaris check-fm``) builds the class the way the loader
does (``solaris.models.api.build_fm``) on a small synthetic world, feeds it batches built by
the training path (``solaris.features.FeatureTables``, the codes of
``solaris.models.contract.INPUTS``), calls every member of the interface and probes, without
knowing the architecture:

- shapes, dtypes and finite values of every output, rows with no history included; the
  heads' width against the task count;
- that rows do not leak into each other: permuting the batch, computing it in fixed-size
  blocks (as the FM workers do) or with the request side copied per pair (as training does)
  changes no row's output;
- that the padding is not read: randomising every history key where ``hist_item == 0``
  changes no output;
- that the largest valid code of every key (``num_items`` for history items, the vocabulary
  for multi-hot codes, ...) and the smallest (all padding) are read without an error;
- that ``user_vectors`` does not read the user id;
- what the FM declares: with ``reads_unseen_users``, finite outputs for a user id
  ``>= num_users`` with zero side features.

The probes compare an untrained model with itself, so they hold for any weights. Seconds on
a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import torch

from solaris.errors import SolarisError
from solaris.ids import PROVISIONAL_BASE
from solaris.models import api, contract
from solaris.models.blocks import blockwise

Tensor = torch.Tensor

# the small world: big enough for full and empty histories, every feature kind of the
# synthetic generator (user categories and a continuous column, item categories, multi-hot
# tags, a continuous item column) and both surfaces
WORLD = {"data.dataset": "synthetic", "data.synthetic.num_users": 60,
         "data.synthetic.num_items": 120, "data.synthetic.days": 4.0,
         "data.synthetic.target_interactions": 1500}
REQUESTS = 8  # request rows of the probe batch
PER_REQUEST = 3  # candidates per request
RTOL, ATOL = 1e-4, 1e-5  # "unchanged": |a - b| <= ATOL + RTOL * max |a|
HISTORY_KEYS = ("hist_action", "hist_surface", "hist_age", "hist_item_cat")
CODE_KEYS = ("user", "surface", "user_cat", "hist_item", "hist_action", "hist_surface",
             "hist_item_cat", "item", "item_cat", "item_mh")
CONTRACT_PAGE = "docs/reference/fm-inputs.md"

# every probe, in the order it runs, and what it holds the class to
PROBES: dict[str, str] = {
    "builds": "the class builds as the loader builds it (`from_config`, else keyword "
              "arguments) and has every member of the interface",
    "attributes": "`version` is a non-empty string, `history_len` the length it was built "
                  "with, `shared_dim` an int >= 1",
    "request_part": "returns a dict of tensors, each with the R request rows first",
    "calls": "`request_part`, `candidate_part`, `heads` and `user_vectors` run on the batch",
    "shapes": "`candidate_part` (B, shared_dim), `heads` (B, T) with T the task count, "
              "`user_vectors` (R, U), all floating",
    "finite": "no NaN or inf in any output, a request with no history included",
    "item_vectors": "(num_items, I), finite",
    "deterministic": "two calls on the same batch in eval mode agree",
    "rows permuted": "permuting the requests and the pairs changes no row's output",
    "rows in blocks": "computing the batch in fixed-size blocks of requests and of pairs (as "
                      "the FM workers do) changes no row's output",
    "request side per pair": "the request side copied per pair (training's form) gives the "
                             "same last shared layer as the request part shared by its pairs",
    "padding unread": "randomising each history key where `hist_item == 0` (padding) changes "
                      "no output",
    "largest codes": "each key at its largest valid code (`num_items` for history items, the "
                     "vocabulary size for multi-hot codes, `2^T` for actions, ...) is read "
                     "without an error, outputs finite",
    "smallest codes": "each key at 0 (no history, item 0, an empty multi-hot list, an unknown "
                      "history surface) is read without an error, outputs finite",
    "user id unread by user_vectors": "changing only `user` changes no user vector",
    "unseen users": "only where the class declares `reads_unseen_users`: finite outputs for "
                    "user ids `>= num_users` (`num_users` and a provisional code) with zero "
                    "side features",
    "training step": "a forward and backward pass in train mode: a finite loss, and finite "
                     "gradients",
    "flops_per_pair": "where defined: None or a count >= 0",
}


@dataclass(frozen=True)
class Problem:
    """A broken promise: the probe that found it and what it saw."""

    probe: str
    message: str

    def __str__(self) -> str:
        return f"{self.probe}: {self.message}"


@dataclass
class Report:
    """What ``check_fm`` found: the probes that held and the problems, in probe order."""

    cls: str
    reads_unseen_users: bool = False  # what the class declares (``api.ReadsUnseenUsers``)
    passed: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class _Stop(Exception):
    """A probe whose failure leaves nothing for the later probes to call."""


@dataclass(frozen=True)
class World:
    """The probe batch: R requests, B = R * PER_REQUEST pairs, and the sizes."""

    sizes: contract.Sizes
    req: dict[str, Tensor]  # REQUEST_KEYS, R rows
    cand: dict[str, Tensor]  # CANDIDATE_KEYS, B rows
    req_index: Tensor  # (B,)

    @property
    def pairs(self) -> dict[str, Tensor]:
        """The training form: every pair carries its own request side (B rows each)."""
        out = {k: v.index_select(0, self.req_index) for k, v in self.req.items()}
        return {**out, **self.cand}


@lru_cache(maxsize=4)
def world(history_len: int, seed: int = 0) -> World:
    """The probe batch for an FM reading ``history_len`` events: requests with an empty, a
    partial and a full history, candidates including item 0 and the last item."""
    from solaris.config import load_config
    from solaris.data.load import load_dataset
    from solaris.features import FeatureTables

    cfg = load_config(None, {**WORLD, "data.synthetic.seed": seed,
                             "features.history_len": history_len})
    ds = load_dataset(cfg.data)
    ft = FeatureTables(ds, cfg.features)
    rng = np.random.default_rng(seed)
    length = (ft.hist >= 0).sum(1)  # (N,) events per row
    rows = [int(np.argmin(length)), int(np.argmax(length))]  # an empty and a full history
    rows += rng.choice(ft.num_rows, REQUESTS - len(rows), replace=False).tolist()
    req = {k: v for k, v in ft.batch(np.array(rows)).items() if k in api.REQUEST_KEYS}
    items = rng.integers(0, ft.num_items, REQUESTS * PER_REQUEST)
    items[:2] = (0, ft.num_items - 1)
    cand = {"item": torch.from_numpy(items), "item_cat": torch.from_numpy(ft.item_cat[items]),
            "item_mh": torch.from_numpy(ft.item_mh[items]),
            "item_cont": torch.from_numpy(ft.item_cont[items])}
    sizes = contract.Sizes(ds.spec, ds.num_users, ds.num_items, tuple(ds.tasks), history_len,
                           ft.item_mh.shape[2])
    return World(sizes, req, cand, torch.arange(REQUESTS).repeat_interleave(PER_REQUEST))


def _differ(a: Tensor, b: Tensor) -> float | None:
    """The largest difference of two outputs, None where they agree within the tolerance."""
    if a.shape != b.shape:
        return math.inf
    a, b = a.detach().double(), b.detach().double()
    d = float((a - b).abs().max()) if a.numel() else 0.0
    return None if d <= ATOL + RTOL * float(a.abs().max() if a.numel() else 0.0) else d


def _finite(x: Any) -> bool:
    return isinstance(x, Tensor) and bool(torch.isfinite(x).all())


class _Checker:
    def __init__(self, fm: Any, w: World, report: Report):
        self.fm, self.w, self.report = fm, w, report
        self.T = len(w.sizes.tasks)

    def fail(self, probe: str, message: str) -> None:
        self.report.problems.append(Problem(probe, message))

    def probe(self, name: str, fn: Callable[[], str | None], stop: bool = False) -> None:
        """Run one probe: it returns a problem's message, or None (held); raising is a
        problem too. ``stop``: a failure ends the check (nothing later could run)."""
        try:
            message = fn()
        except Exception as e:  # the model raised: that is the finding
            message = f"raised {type(e).__name__}: {e}"
        if message is None:
            self.report.passed.append(name)
            return
        self.fail(name, message)
        if stop:
            raise _Stop

    # the model's outputs on a batch, in eval mode without gradients
    def outputs(self, req: dict[str, Tensor], cand: dict[str, Tensor] | None = None,
                req_index: Tensor | None = None) -> dict[str, Tensor]:
        w = self.w
        cand = w.cand if cand is None else cand
        req_index = w.req_index if req_index is None else req_index
        with torch.no_grad():
            shared = self.fm.candidate_part(self.fm.request_part(req), cand, req_index)
            return {"candidate_part": shared, "heads": self.fm.heads(shared),
                    "user_vectors": self.fm.user_vectors(req)}

    def changed(self, base: dict[str, Tensor], other: dict[str, Tensor]) -> list[str]:
        out = []
        for k, a in base.items():
            d = _differ(a, other[k])
            if d is not None:
                out.append(f"{k} by up to {d:.3g}")
        return out

    # -- the probes -----------------------------------------------------------------------
    def attributes(self) -> str | None:
        fm, s = self.fm, self.w.sizes
        bad = []
        if not isinstance(fm.version, str) or not fm.version:
            bad.append(f"version={fm.version!r} (a non-empty string)")
        if fm.history_len != s.history_len:
            bad.append(f"history_len={fm.history_len!r}, built with {s.history_len} (the "
                       "workers read this many events; training fed that many)")
        if not isinstance(fm.shared_dim, int) or fm.shared_dim < 1:
            bad.append(f"shared_dim={fm.shared_dim!r} (an int >= 1)")
        return "; ".join(bad) or None

    def request_part(self) -> str | None:
        with torch.no_grad():
            state = self.fm.request_part(self.w.req)
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            return f"returned {type(state).__name__}, not a dict of tensors"
        R = REQUESTS
        bad = [f"{k} {tuple(v.shape)}" for k, v in state.items() if v.ndim == 0
               or v.shape[0] != R]
        return (f"state tensors without the {R} request rows first: {', '.join(bad)} (the "
                "workers run it in row blocks and concatenate the blocks)") if bad else None

    def shapes(self, out: dict[str, Tensor]) -> str | None:
        fm, B, R = self.fm, len(self.w.req_index), REQUESTS
        want = {"candidate_part": (B, fm.shared_dim), "heads": (B, self.T)}
        bad = []
        for k, shape in want.items():
            v = out[k]
            if not isinstance(v, Tensor):
                bad.append(f"{k} returned {type(v).__name__}, not a tensor")
            elif tuple(v.shape) != shape or not v.is_floating_point():
                bad.append(f"{k} is {tuple(v.shape)} {v.dtype}, expected {shape} floating"
                           + (f" (heads width {v.shape[-1]} != {self.T} tasks "
                              f"{self.w.sizes.tasks})" if k == "heads" and v.ndim == 2
                              and v.shape[-1] != self.T else ""))
        u = out["user_vectors"]
        if not isinstance(u, Tensor) or u.ndim != 2 or u.shape[0] != R \
                or not u.is_floating_point():
            bad.append(f"user_vectors is {getattr(u, 'shape', type(u).__name__)}, expected "
                       f"({R}, U) floating")
        return "; ".join(bad) or None

    def finite(self, out: dict[str, Tensor]) -> str | None:
        empty = (self.w.req["hist_item"] == 0).all(1)  # (R,) rows with no history
        bad = [k for k, v in out.items() if not _finite(v)]
        note = f" (the batch has {int(empty.sum())} requests with no history)" \
            if empty.any() else ""
        return f"NaN or inf in {', '.join(bad)}{note}" if bad else None

    def item_vectors(self) -> str | None:
        with torch.no_grad():
            v = self.fm.item_vectors()
        n = self.w.sizes.num_items
        if not isinstance(v, Tensor) or v.ndim != 2 or v.shape[0] != n:
            return f"is {getattr(v, 'shape', type(v).__name__)}, expected ({n}, I)"
        return None if _finite(v) else "NaN or inf"

    def deterministic(self, out: dict[str, Tensor]) -> str | None:
        diff = self.changed(out, self.outputs(self.w.req))
        return ("two calls on the same batch in eval mode differ: " + ", ".join(diff)
                + " (dropout or sampling left on at inference?)") if diff else None

    def permuted(self, out: dict[str, Tensor]) -> str | None:
        w, g = self.w, torch.Generator().manual_seed(1)
        rp = torch.randperm(REQUESTS, generator=g)  # new row i is old request rp[i]
        inv = torch.argsort(rp)
        pp = torch.randperm(len(w.req_index), generator=g)
        req = {k: v.index_select(0, rp) for k, v in w.req.items()}
        cand = {k: v.index_select(0, pp) for k, v in w.cand.items()}
        got = self.outputs(req, cand, inv.index_select(0, w.req_index.index_select(0, pp)))
        want = {"candidate_part": out["candidate_part"].index_select(0, pp),
                "heads": out["heads"].index_select(0, pp),
                "user_vectors": out["user_vectors"].index_select(0, rp)}
        diff = self.changed(want, got)
        return ("permuting the requests and the pairs changed rows' outputs: "
                + ", ".join(diff)) if diff else None

    def blocks(self, out: dict[str, Tensor]) -> str | None:
        w, fm = self.w, self.fm
        with torch.no_grad():
            state = blockwise(fm.request_part, w.req, 3)
            shared = blockwise(lambda c: fm.candidate_part(state, c, c["req_index"]),
                               {**w.cand, "req_index": w.req_index}, 5)
            users = blockwise(fm.user_vectors, w.req, 3)
        diff = self.changed({"candidate_part": out["candidate_part"],
                             "user_vectors": out["user_vectors"]},
                            {"candidate_part": shared, "user_vectors": users})
        return ("computing the batch in blocks of 3 requests and 5 pairs (as the FM workers "
                "do) changed rows' outputs: " + ", ".join(diff)) if diff else None

    def per_pair(self, out: dict[str, Tensor]) -> str | None:
        with torch.no_grad():
            shared = api.shared_layer(self.fm, self.w.pairs)
        d = _differ(out["candidate_part"], shared)
        return None if d is None else (
            f"the request side copied per pair (training's form) gives another last shared "
            f"layer than the request part shared by its pairs (up to {d:.3g})")

    def padding(self, out: dict[str, Tensor]) -> str | None:
        w, s, g = self.w, self.w.sizes, np.random.default_rng(2)
        pad = (w.req["hist_item"] == 0).numpy()  # (R, L)
        if not pad.any():
            return "the probe batch has no padded history slot"
        noise = {"hist_action": lambda shape: g.integers(1, 2 ** self.T + 1, shape),
                 "hist_surface": lambda shape: g.integers(1, s.spec.num_surfaces + 1, shape),
                 "hist_age": lambda shape: g.uniform(0.0, 8.0, shape).astype(np.float32),
                 "hist_item_cat": lambda shape: g.integers(1, s.high("hist_item_cat") + 1,
                                                           shape)}
        read = []
        for key in HISTORY_KEYS:
            a = w.req[key].numpy().copy()
            a[pad] = noise[key](a[pad].shape)
            diff = self.changed(out, self.outputs({**w.req, key: torch.from_numpy(a)}))
            if diff:
                read.append(f"{key} ({', '.join(diff)})")
        return None if not read else (
            "randomising the history where hist_item == 0 (padding) changed the outputs: "
            + "; ".join(read) + ". History item ids are item + 1 with 0 for padding; is 0 "
            f"read as item 0? ({CONTRACT_PAGE})")

    def extremes(self, which: str) -> str | None:
        """Every code key at its largest valid value (``which`` "largest", over a history
        whose every slot is an event) or at its smallest (0: no history, item 0, no
        multi-hot code, an unknown surface), one key at a time: no error, finite outputs."""
        w, s = self.w, self.w.sizes
        req = dict(w.req)
        if which == "largest":  # every slot a real event, so no code is masked as padding
            pad = req["hist_item"] == 0  # (R, L)
            req["hist_item"] = torch.where(pad, 1, req["hist_item"])
            req["hist_action"] = torch.where(pad, 1, req["hist_action"])
            req["hist_item_cat"] = torch.where(pad[..., None], 1, req["hist_item_cat"])
            keys = CODE_KEYS
        else:
            keys = ("user", "surface", "user_cat", "hist_item", "hist_surface", "item",
                    "item_cat", "item_mh")
        bad = []
        for key in keys:
            a = (req if key in req else w.cand)[key]
            if not a.numel():
                continue
            if which == "largest":
                v = torch.from_numpy(np.ascontiguousarray(np.broadcast_to(
                    s.high(key), tuple(a.shape)), dtype=np.int64))
                shown = f"{contract.BY_NAME[key].high} ({np.asarray(s.high(key)).ravel().tolist()})"
            else:
                v, shown = torch.zeros_like(a), "0"
            r, c = dict(req), dict(w.cand)
            (r if key in r else c)[key] = v
            if key == "hist_item" and which == "smallest":  # no history at all
                r.update({k: torch.zeros_like(r[k]) for k in HISTORY_KEYS})
                shown = "0 (no history)"
            try:
                got = self.outputs(r, c)
            except Exception as e:  # the finding: a valid code the model cannot read
                bad.append(f"{key}={shown} raised {type(e).__name__}: {str(e)[:120]}")
                continue
            nan = [k for k, x in got.items() if not _finite(x)]
            if nan:
                bad.append(f"{key}={shown} gave NaN or inf in {', '.join(nan)}")
        return "; ".join(bad) or None

    def user_id_unread(self, out: dict[str, Tensor]) -> str | None:
        w = self.w
        other = (w.req["user"] + 1) % w.sizes.num_users
        with torch.no_grad():
            got = self.fm.user_vectors({**w.req, "user": other})
        d = _differ(out["user_vectors"], got)
        return None if d is None else (
            f"changing only the user id changed the user vectors (up to {d:.3g}): they must "
            "not read it (a user the FM never saw gets one from the same function)")

    def unseen_users(self) -> str | None:
        w, s = self.w, self.w.sizes
        ids = torch.full_like(w.req["user"], s.num_users)
        ids[1::2] = PROVISIONAL_BASE + 12345  # a provisional code: far past every table
        req = {**w.req, "user": ids, "user_cat": torch.zeros_like(w.req["user_cat"]),
               "user_cont": torch.zeros_like(w.req["user_cont"])}
        got = self.outputs(req)
        nan = [k for k, x in got.items() if not _finite(x)]
        return None if not nan else (
            f"declares reads_unseen_users but gives NaN or inf in {', '.join(nan)} for user "
            f"ids >= num_users={s.num_users}")

    def training(self) -> str | None:
        fm = self.fm
        fm.train()
        try:
            fm.zero_grad(set_to_none=True)
            logits = fm.heads(api.shared_layer(fm, self.w.pairs))  # (B, T)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, torch.zeros_like(logits))
            loss.backward()
        finally:
            fm.eval()
        if not torch.isfinite(loss):
            return f"the training loss is {float(loss.detach())}"
        grads = [p.grad for p in fm.parameters() if p.grad is not None]
        if not grads:
            return "no parameter gets a gradient from the heads' loss"
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            return "a gradient holds NaN or inf"
        return None

    def flops(self) -> str | None:
        f = getattr(self.fm, "flops_per_pair", None)
        if not callable(f):
            return None
        v = f()
        return None if v is None or (isinstance(v, (int, float)) and math.isfinite(v)
                                     and v >= 0) else f"returned {v!r}, not None or a count >= 0"


def check_fm(fm_cls: str | type, config: Any = None, *, seed: int = 0) -> Report:
    """Probe an FM class (``package.module:Class`` or the class) against the interface and
    the input contract; ``config`` (a ``SolarisConfig``) supplies the ``fm`` section (its
    ``kwargs``, ``version``; ``cls`` is replaced) and ``features.history_len`` (None: the
    defaults). The class is built as the loader builds it, on a small synthetic world."""
    from dataclasses import replace

    from solaris.config import load_config

    cfg = config if config is not None else load_config(None)
    name = fm_cls if isinstance(fm_cls, str) else f"{fm_cls.__module__}:{fm_cls.__qualname__}"
    fm_cfg = replace(cfg.fm, cls=name)
    w = world(cfg.features.history_len, seed)
    report = Report(name)
    s = w.sizes
    torch.manual_seed(seed)
    try:
        fm = api.build_fm(fm_cfg, s.spec, s.num_users, s.num_items, s.tasks, s.history_len,
                          cls=None if isinstance(fm_cls, str) else fm_cls)
    except SolarisError as e:
        report.problems.append(Problem("builds", str(e)))
        return report
    report.passed.append("builds")
    report.reads_unseen_users = api.reads_unseen_users(fm)
    c = _Checker(fm.eval(), w, report)
    try:
        c.probe("attributes", c.attributes)
        c.probe("request_part", c.request_part, stop=True)
        out: dict[str, Tensor] = {}

        def run() -> None:
            out.update(c.outputs(w.req))

        c.probe("calls", run, stop=True)
        c.probe("shapes", lambda: c.shapes(out), stop=True)
        c.probe("finite", lambda: c.finite(out))
        c.probe("item_vectors", c.item_vectors)
        c.probe("deterministic", lambda: c.deterministic(out))
        c.probe("rows permuted", lambda: c.permuted(out))
        c.probe("rows in blocks", lambda: c.blocks(out))
        c.probe("request side per pair", lambda: c.per_pair(out))
        c.probe("padding unread", lambda: c.padding(out))
        c.probe("largest codes", lambda: c.extremes("largest"))
        c.probe("smallest codes", lambda: c.extremes("smallest"))
        c.probe("user id unread by user_vectors", lambda: c.user_id_unread(out))
        if report.reads_unseen_users:
            c.probe("unseen users", c.unseen_users)
        c.probe("training step", c.training)
        c.probe("flops_per_pair", c.flops)
    except _Stop:
        pass
    return report
