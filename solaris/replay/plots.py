"""The replay's figures: tier coverage over event time, the budget x TTL sweep, and a
version rollover. Each writes one PNG (matplotlib, Agg) and returns its path."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from solaris import atomic
from solaris.errors import DataError
from solaris.tiers import Tier

DAY_S = 86_400.0
_TIER_LINES = ((Tier.PAIR.label, "pair", "tab:blue"),
               (Tier.USER_NEIGHBOUR.label, "+ user neighbour", "tab:orange"),
               (Tier.ITEM_NEIGHBOUR.label, "+ item neighbour", "tab:green"),
               ("effective", "effective (any input)", "k"), ("aggregate", "aggregate", "tab:purple"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    atomic.save_figure(path, fig, dpi=110)
    return path


def coverage_time_plot(curve: dict, path: str | Path, title: str) -> Path:
    """Cumulative tier coverage per time bin (``coverage.coverage_over_time``), one marked
    point per bin, against the time since the window start (hours for a window under two
    days, else days)."""
    plt = _pyplot()
    t = np.asarray(curve["t"], np.float64)
    start = curve.get("start")
    start = float(t[0]) if start is None and len(t) else float(start or 0.0)
    hours = len(t) > 0 and float(t[-1] - start) < 2 * DAY_S
    x = (t - start) / (3600.0 if hours else DAY_S)
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for key, label, color in _TIER_LINES:
        if key in curve:
            y = 100.0 * np.asarray(curve[key], np.float64)
            ax.plot(x, y, label=label, color=color, lw=1.2, marker="o", ms=2.5,
                    ls="--" if key == "aggregate" else "-")
    ax.set_xlabel(f"event time ({'hours' if hours else 'days'} since the window start)")
    ax.set_ylabel("labelled pairs covered (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    out = _save(fig, path)
    plt.close(fig)
    return out


def _budget_axis(rows: list[dict]) -> tuple[dict[float, float], list[float], list[str]]:
    """x position per budget: budget 0 (unlimited) sits one step right of the largest."""
    finite = sorted({float(r["budget_per_hour"]) for r in rows if r["budget_per_hour"] > 0})
    pos = {b: b for b in finite}
    ticks, labels = list(finite), [f"{b:g}" for b in finite]
    if any(r["budget_per_hour"] == 0 for r in rows):
        top = finite[-1] * 2.0 if finite else 1.0
        pos[0.0] = top
        ticks.append(top)
        labels.append("unlimited")
    return pos, ticks, labels


def sweep_plot(rows: list[dict], path: str | Path) -> Path:
    """Coverage (pair, effective) and TR against the budget, one line per read TTL.

    ``rows``: dicts with ``budget_per_hour`` (0 = unlimited), ``read_ttl_s``,
    ``coverage_pair``, ``coverage_effective`` and ``tr_online`` (None where not measured).
    """
    if not rows:
        raise DataError("sweep_plot: no rows")
    for key in ("budget_per_hour", "read_ttl_s", "coverage_pair", "coverage_effective"):
        if any(key not in r for r in rows):
            raise DataError(f"sweep_plot: a row lacks {key!r}")
    plt = _pyplot()
    pos, ticks, labels = _budget_axis(rows)
    fig, (ax_c, ax_t) = plt.subplots(1, 2, figsize=(11.0, 4.2))
    ttls = sorted({float(r["read_ttl_s"]) for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, ttl in enumerate(ttls):
        sel = sorted((r for r in rows if float(r["read_ttl_s"]) == ttl),
                     key=lambda r: pos[float(r["budget_per_hour"])])
        x = [pos[float(r["budget_per_hour"])] for r in sel]
        color = colors[n % len(colors)]
        name = f"TTL {ttl / 3600:g} h"
        ax_c.plot(x, [100 * r["coverage_pair"] for r in sel], "o-", color=color,
                  label=f"{name}: pair")
        ax_c.plot(x, [100 * r["coverage_effective"] for r in sel], "s--", color=color,
                  label=f"{name}: effective")
        tr = [(xi, r.get("tr_online")) for xi, r in zip(x, sel)]
        tr = [(xi, v) for xi, v in tr if v is not None]
        if tr:
            ax_t.plot([a for a, _ in tr], [v for _, v in tr], "o-", color=color, label=name)
    for ax in (ax_c, ax_t):
        if ticks and min(ticks) > 0 and max(ticks) / min(ticks) >= 10:
            ax.set_xscale("log")
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("precompute budget (FM pair-evaluations per event hour)")
        ax.grid(alpha=0.3)
    ax_c.set_ylabel("labelled pairs covered (%)")
    ax_c.set_title("coverage vs budget")
    ax_c.legend(fontsize=7)
    ax_t.set_ylabel("transfer ratio (online)")
    ax_t.set_title("TR vs budget")
    if ax_t.get_legend_handles_labels()[0]:
        ax_t.legend(fontsize=7)
    else:
        ax_t.text(0.5, 0.5, "TR not measured", ha="center", va="center",
                  transform=ax_t.transAxes)
    out = _save(fig, path)
    plt.close(fig)
    return out


def rollover_plot(curve: dict, path: str | Path) -> Path:
    """Pair coverage of the old and the new version over event time, with the switch.

    ``curve``: ``t`` (event seconds), ``old`` and ``new`` (coverage per t, NaN where not
    served), ``switch_t`` (event seconds or None).
    """
    plt = _pyplot()
    t = np.asarray(curve["t"], np.float64)
    start = float(t[0]) if len(t) else 0.0
    x = (t - start) / 3600.0
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    ax.plot(x, 100 * np.asarray(curve["old"], np.float64), label="old version", color="tab:blue")
    ax.plot(x, 100 * np.asarray(curve["new"], np.float64), label="new version",
            color="tab:orange")
    if curve.get("switch_t") is not None:
        ax.axvline((float(curve["switch_t"]) - start) / 3600.0, color="k", ls=":",
                   label="switch")
    ax.set_xlabel("event time (hours since the first point)")
    ax.set_ylabel("pair coverage (%)")
    ax.set_ylim(0, 100)
    ax.set_title("version rollover: pair coverage per version")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out = _save(fig, path)
    plt.close(fig)
    return out


def policy_cost_plot(panels: dict[str, dict[str, list[dict]]], path: str | Path) -> Path:
    """Pair coverage against FM evaluations per 1,000 requests, one line per speculation
    policy (a point for one that has a single cost), one panel per run.

    ``panels``: run label -> ``solaris.replay.coverage.policy_curves``'s output."""
    if not panels:
        raise DataError("policy_cost_plot: no runs")
    plt = _pyplot()
    n = len(panels)
    cols = min(3, n)
    rows_ = -(-n // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.6 * cols, 3.8 * rows_), squeeze=False)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    for ax, (label, curves) in zip(axes.ravel(), panels.items()):
        for name, rows in curves.items():
            rows = sorted(rows, key=lambda p: p["fm_evals_per_1k"])
            x = [p["fm_evals_per_1k"] for p in rows]
            y = [100 * p["pair"] for p in rows]
            ax.plot(x, y, "*" if len(rows) == 1 else "o-", markersize=10 if len(rows) == 1
                    else 4, label=name)
        ax.set_xlabel("FM evaluations per 1,000 requests")
        ax.set_ylabel("labelled pairs covered (%)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    out = _save(fig, path)
    plt.close(fig)
    return out


def closed_loop_plot(report: dict, path: str | Path) -> Path:
    """A closed loop at a glance: expected clicks per request per arm with its paired
    interval against the VM alone (left), and the speculation policies' coverage of shown
    items against FM evaluations per 1,000 requests on the shadow arm's log (right)."""
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    lift = report["lift"]
    arms = list(lift["clicks_per_request"])
    vm = lift["clicks_per_request"]["vm"]
    ys = [lift["clicks_per_request"][x] for x in arms]
    lo = [0.0 if x == "vm" else ys[i] - (vm + lift["gain_over_vm"][x]["ci"][0])
          for i, x in enumerate(arms)]
    hi = [0.0 if x == "vm" else (vm + lift["gain_over_vm"][x]["ci"][1]) - ys[i]
          for i, x in enumerate(arms)]
    a.bar(arms, ys, yerr=[lo, hi], capsize=4,
          color=["tab:gray", "tab:blue", "tab:green", "tab:orange"][:len(arms)])
    a.axhline(vm, color="k", lw=0.8, ls=":")
    a.set_ylabel("expected clicks per request")
    cl = lift.get("click_lift")
    a.set_title("closed loop" + (f": click_lift {cl['point']:.2f}" if cl else ""))
    for name, rows in report["policies"]["curves"].items():
        pts = sorted((p["fm_evals_per_1k"], p["pair"]) for p in rows)
        b.plot(*zip(*pts), marker="o" if len(pts) > 1 else "*", ms=5 if len(pts) > 1 else 12,
               label=name)
    b.set_xlabel("FM evaluations per 1,000 requests")
    b.set_ylabel("pair coverage of shown items (shadow)")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    out = _save(fig, path)
    plt.close(fig)
    return out


def estimate_plot(pred: dict, path: str | Path, online: dict | None = None) -> Path:
    """One page of ``solaris estimate``: the predicted transfer ratios with their intervals
    and the predicted tier coverage, beside a finished replay's figures (``online``, its
    ``replay.json``) where given."""
    plt = _pyplot()
    fig, (ax_tr, ax_cov) = plt.subplots(1, 2, figsize=(10, 4))
    rows = [("calibrated", "tr_predicted", "tr_predicted_ci", "tr_online"),
            ("raw", "tr_predicted_raw", "tr_predicted_raw_ci", "tr_online_raw"),
            ("base-calibrated", "tr_predicted_base_calibrated", None,
             "tr_online_base_calibrated")]
    for x, (name, key, ci_key, on_key) in enumerate(rows):
        v = pred.get(key)
        if v is not None and np.isfinite(v):
            ci = pred.get(ci_key) if ci_key else None
            err = None
            if ci and all(c is not None and np.isfinite(c) for c in ci):
                err = [[max(v - ci[0], 0.0)], [max(ci[1] - v, 0.0)]]
            ax_tr.errorbar([x], [v], yerr=err, fmt="o", color="tab:blue", capsize=4,
                           label="predicted (95% interval)" if x == 0 else None)
        o = (online or {}).get(on_key)
        if o is not None and np.isfinite(o):
            ax_tr.plot([x + 0.15], [o], "kx", label="online (replay)" if x == 0 else None)
    ax_tr.axhline(0.0, color="0.6", lw=0.8)
    ax_tr.set_xticks(range(len(rows)), [r[0] for r in rows])
    ax_tr.set_ylabel("transfer ratio")
    ax_tr.set_title("online TR, predicted from the past")
    ax_tr.legend(loc="best", fontsize=8)
    cov = pred["coverage_predicted"]
    names = [Tier.PAIR.label, Tier.USER_NEIGHBOUR.label, Tier.ITEM_NEIGHBOUR.label,
             "aggregate", "effective"]
    ax_cov.bar(range(len(names)), [cov[k] for k in names], color="tab:blue", alpha=0.7,
               label="predicted")
    if online and online.get("coverage"):
        ax_cov.plot(range(len(names)), [online["coverage"][k] for k in names], "kx",
                    label="online (replay)")
    ax_cov.set_xticks(range(len(names)), ["pair", "+ user nbr", "+ item nbr", "aggregate",
                                          "effective"], fontsize=8)
    ax_cov.set_ylabel("share of labelled pairs")
    evals = pred["fm_evals_per_1k_requests_predicted"]
    on_evals = (online or {}).get("fm_evals_per_1k_requests")
    ax_cov.set_title(f"coverage; FM evals / 1k requests {evals:.0f}"
                     + (f" (online {on_evals:.0f})" if on_evals else ""), fontsize=9)
    ax_cov.legend(loc="best", fontsize=8)
    return _save(fig, path)
