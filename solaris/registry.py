"""What the packages above the core register with it by name: entry points of an installed
distribution (``pyproject.toml``, ``[project.entry-points."<group>"]``: ``name =
"module:object"``), looked up when they are needed. The core names a group, never the
module behind an entry, so it imports nothing of the jobs or the app (the layers contract).

Every installed distribution's entries are read, as plug-in hosts read them, not only the
first distribution of a name that the path holds: a stale ``*.egg-info`` left in a checkout
by a non-editable build, ahead of the installed metadata on ``sys.path``, hides nothing.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, distributions


def entries(group: str) -> dict[str, EntryPoint]:
    """The entries of ``group`` over every installed distribution, by name (the first one
    on ``sys.path`` where two distributions register a name), sorted by name. Nothing is
    loaded."""
    out: dict[str, EntryPoint] = {}
    for dist in distributions():
        for ep in dist.entry_points.select(group=group):
            out.setdefault(ep.name, ep)
    return dict(sorted(out.items()))
