"""Turn a transfer report into a text table and a PNG (the paper's Table 2 analogue)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from solaris import atomic

MODELS = ("fm", "vm", "vm_kd", "vm_agg", "vm_pair_100", "vm_pair_60", "vm_pair_50", "vm_pair_20",
          "vm_pair_sim", "vm_pair_sim_fresh", "fm_on_sim", "vm_control_100")


def clean_nan(obj):
    """NaN / inf -> None, recursively, so the report is strict JSON (TR is NaN without a gap)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_nan(v) for v in obj]
    return obj


def to_json(report: dict) -> str:
    return json.dumps(clean_nan(report), indent=2, allow_nan=False)


def _f(x: float | None, nd: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def transfer_table(report: dict) -> str:
    """A fixed-width table: BCE / AUC raw and calibrated, TR per variant."""
    lines = [f"transfer report: {report['dataset']} (task {report['task']}, "
             f"protocol {report['teacher_protocol']}, seeds {report['seeds']}, "
             f"test rows {report['test_rows']}, warm share {report['warm_share']:.2f})",
             f"{'model':<14}{'BCE':>9}{'AUC':>9}{'BCE cal':>9}{'AUC cal':>9}"
             f"{'TR':>8}{'TR cal':>8}{'TR std':>8}{'TR warm':>9}{'TR cold':>9}"]
    warm = (report.get("warm") or {}).get("tr") or {}
    cold = (report.get("cold") or {}).get("tr") or {}
    for m in MODELS:
        if m not in report["bce"]:
            continue
        k = m.removeprefix("vm_") if m not in ("fm", "vm") else None
        lines.append(
            f"{m:<14}{_f(report['bce'][m]):>9}{_f(report['auc'][m]):>9}"
            f"{_f(report['bce_cal'][m]):>9}{_f(report['auc_cal'][m]):>9}"
            f"{_f(report['tr'].get(k) if k else None, 3):>8}"
            f"{_f(report['tr_cal'].get(k) if k else None, 3):>8}"
            f"{_f(report['tr_std'].get(k) if k else None, 3):>8}"
            f"{_f(warm.get(k) if k else None, 3):>9}{_f(cold.get(k) if k else None, 3):>9}")
    gap = report["gap"]
    lines.append(f"FM vs VM BCE gap {gap['mean_diff']:.4f} (95% CI {gap['ci_low']:.4f}.."
                 f"{gap['ci_high']:.4f}), significant: {report['gap_significant']}")
    if "gap_cal" in report:
        g = report["gap_cal"]
        lines.append(f"after calibration: gap {g['mean_diff']:.4f} (95% CI {g['ci_low']:.4f}.."
                     f"{g['ci_high']:.4f}), significant: {g['significant']}")
    lines.append("TR is shown only where its FM-VM gap is significant")
    for task, block in (report.get("tasks") or {}).items():
        trs = ", ".join(f"{k} {_f(v, 3)}" for k, v in block["tr"].items())
        cal = ", ".join(f"{k} {_f(v, 3)}" for k, v in block["tr_cal"].items())
        lines.append(f"second task {task}: FM BCE {_f(block['bce']['fm'])} vs VM "
                     f"{_f(block['bce']['vm'])}; gap significant: {block['gap_significant']}")
        lines.append(f"  TR {trs}")
        lines.append(f"  TR cal {cal}")
    if "ablations" in report:
        ab = report["ablations"]
        trs = ", ".join(f"{k} {_f(v, 3)}" for k, v in ab["tr"].items())
        lines.append(f"ablations ({ab['seeds']} seeds): TR {trs}")
        ins = ab["in_sample"]["tr"]
        lines.append(f"in-sample teacher (labelled, not headline): TR pair_100 "
                     f"{_f(ins['pair_100'], 3)}, kd {_f(ins['kd'], 3)}")
    lines.append(f"wall time {report['seconds']:.0f} s")
    return "\n".join(lines)


def coverage_plot(report: dict, path: str | Path) -> Path:
    """Relative BCE reduction of the VM vs pair coverage, KD and aggregate as reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bce = report["bce"]
    covs = sorted(int(k.rsplit("_", 1)[1]) for k in bce
                  if k.startswith("vm_pair_") and k.rsplit("_", 1)[1].isdigit())
    xs = [0] + covs
    gain = [0.0] + [100.0 * (bce["vm"] - bce[f"vm_pair_{c}"]) / bce["vm"] for c in covs]
    fm_gain = 100.0 * (bce["vm"] - bce["fm"]) / bce["vm"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(xs, gain, "o-", label=f"VM + pair embedding ({report['task']})")
    ax.plot([0, 100], [0.0, gain[-1] * 100.0 / max(xs[-1], 1)], color="0.6", lw=0.8,
            label="linear in coverage: c x gain(100%)")
    for task, block in (report.get("tasks") or {}).items():
        b2 = block["bce"]
        g2 = [0.0] + [100.0 * (b2["vm"] - b2[f"vm_pair_{c}"]) / b2["vm"] for c in covs]
        ax.plot(xs, g2, "s--", color="tab:purple", label=f"VM + pair embedding ({task})")
    sim = report.get("schedule")
    if sim and "vm_pair_sim" in bce:
        ax.plot([100.0 * sim["c_sim"]], [100.0 * (bce["vm"] - bce["vm_pair_sim"]) / bce["vm"]],
                "D", color="tab:green", label="presence as the schedule simulation gives it")
    ax.axhline(fm_gain, color="k", ls=":", label="FM (the whole gap)")
    ax.axhline(100.0 * (bce["vm"] - bce["vm_kd"]) / bce["vm"], color="tab:red", ls="--",
               label="VM + soft-label KD")
    ax.axhline(100.0 * (bce["vm"] - bce["vm_agg"]) / bce["vm"], color="tab:green", ls="--",
               label="VM + aggregated user embedding")
    ax.set_xlabel("pair-embedding coverage of test rows (%)")
    ax.set_ylabel("BCE reduction vs VM alone (%)")
    ax.set_title(f"{report['dataset']}: gain vs coverage ({report['seeds']} seeds, temporal)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    atomic.save_figure(path, fig, dpi=110)
    plt.close(fig)
    return path
