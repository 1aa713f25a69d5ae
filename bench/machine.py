"""What every bench JSON records about where it ran: CPUs, platform, library versions and
where the FM ran (``fm_devices``: ``cpu``, or ``cuda:<index> (<GPU name>)`` per device).

Benches that train or run the FM in their own process pass ``IN_PROCESS``; those that start
FM workers pass the devices the workers report; those that read replay runs pass
``run_devices(dirs)`` (what each run's ``replay.json`` recorded). Imported by the scripts
of this folder (``python bench/<name>.py`` puts the folder on the path).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable

IN_PROCESS = ["cpu"]  # solaris/ trains and runs the FM in process on the CPU only
NO_FM: list[str] = []  # benches that never run the FM


def machine(fm_devices: Iterable[str] | None) -> dict[str, Any]:
    """The machine block of a bench JSON; ``fm_devices`` None: not recorded (an older run)."""
    import numpy
    import torch

    try:
        import ray
        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "numpy": numpy.__version__, "ray": ray_version,
            "fm_devices": sorted(set(fm_devices)) if fm_devices is not None else None}


def run_devices(dirs: Iterable[str | Path]) -> list[str] | None:
    """The FM devices the replay runs in ``dirs`` used (their ``replay.json``); None when a
    run did not record them."""
    out: set[str] = set()
    for d in dirs:
        f = Path(d) / "replay.json"
        devices = json.loads(f.read_text()).get("fm_devices") if f.exists() else None
        if devices is None:
            return None
        out.update(devices)
    return sorted(out)
