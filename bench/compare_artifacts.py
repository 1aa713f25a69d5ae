"""Compare two artifact directories (``solaris train`` outputs) to the last bit: every
checkpoint tensor by tensor, its meta and config, ``side.npz`` array by array, and the
manifest leaf by leaf. What a refactor must leave unchanged is the models' bits; the
manifest's differences are listed for a person to explain.

    python bench/compare_artifacts.py DIR_A DIR_B

Exits 0 when every tensor, meta and side array is equal, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch


def leaves(d: dict, prefix: str = "") -> dict:
    """A nested dict's leaves by dotted key (an empty dict is no leaf)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare(a: Path, b: Path) -> bool:
    ok = True
    for name in sorted(p.name for p in a.glob("*.pt")):
        x = torch.load(a / name, weights_only=True)
        y = torch.load(b / name, weights_only=True)
        sx, sy = x["state_dict"], y["state_dict"]
        same = list(sx) == list(sy) and all(torch.equal(sx[k], sy[k]) for k in sx)
        meta = x["meta"] == y["meta"]
        cx, cy = leaves(x["config"]), leaves(y["config"])
        cdiff = {k: (cx.get(k, "<absent>"), cy.get(k, "<absent>"))
                 for k in sorted(set(cx) | set(cy)) if cx.get(k) != cy.get(k)}
        print(f"{name}: {len(sx)} tensors bit-identical={same}, meta equal={meta}, "
              f"config differs in {cdiff}")
        ok &= same and meta
    with np.load(a / "side.npz") as x, np.load(b / "side.npz") as y:
        side = x.files == y.files and all(np.array_equal(x[k], y[k]) for k in x.files)
    print(f"side.npz arrays equal={side}")
    ma = leaves(json.loads((a / "manifest.json").read_text()))
    mb = leaves(json.loads((b / "manifest.json").read_text()))
    diff = [(k, ma.get(k, "<absent>"), mb.get(k, "<absent>"))
            for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)]
    print(f"manifest: {len(ma)} and {len(mb)} leaves; differing: {diff}")
    ok &= side
    print("every model bit equal" if ok else "DIFFERENT")
    return ok


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(0 if compare(Path(sys.argv[1]), Path(sys.argv[2])) else 1)
