"""Starting Ray for a command, with a console that shows progress and results only.

Every command and job that starts or joins Ray goes through ``start``. By default it keeps
Ray's own chatter off the console (the worker processes' logs, the token-authentication
notice, Ray Data's "progress bars disabled" note, the raylet's worker-pool size warning);
``verbose=True`` (``solaris -v``, ``rebuild_knn -v``) routes everything to the console again.
Ray's logs stay where Ray writes them either way: ``/tmp/ray/session_latest/logs`` on each
node (``ray logs`` lists them) and the dashboard where one runs.

What changes, and why none of it changes a result:

- ``log_to_driver``: worker processes' stdout and stderr stay in their log files.
- Token authentication: a local Ray that this process starts turns it on by default and
  says so on the console; it stays on, the notice goes to Ray's logger at a level the console
  does not show.
- ``RAY_worker_maximum_startup_concurrency``: the raylet prints a warning once the Python
  workers it has started reach 4x this number (default: the node's CPUs). SOLARIS starts one
  actor per cache shard, queue, ledger, KNN holder, FM worker, Serve replica and Ray Data
  worker -- more than 4x the CPUs of a laptop by design. The limit is raised to
  ``STARTUP_CONCURRENCY`` for a Ray started here (a value already set in the environment is
  kept); it bounds how many workers start at once, nothing else.
- Ray Data's progress bars stay off (SOLARIS draws its own) and its per-dataset
  "execution started" lines are not printed.
"""

from __future__ import annotations

import logging
import os
from typing import Any

STARTUP_CONCURRENCY = 16
# loggers whose WARNING lines are notes for Ray's own developers or repeat what SOLARIS
# reports itself; their errors still show
_QUIET = ("ray", "ray.data", "ray.serve", "ray.data._internal.progress",
          "ray._private.authentication.authentication_token_setup")


def start(*, address: str | None = None, num_cpus: float | None = None,
          object_store_bytes: int | None = None, verbose: bool = False,
          **init: Any) -> Any:
    """``ray.init`` for a command: a local Ray with ``num_cpus`` and ``object_store_bytes``
    when ``address`` is None and no ``RAY_ADDRESS`` is set, else the cluster at ``address``
    (or ``RAY_ADDRESS``). ``init`` passes through (``runtime_env``, ``include_dashboard``, ...).
    Returns what ``ray.init`` returns."""
    import ray

    local = address in (None, "local") and not os.environ.get("RAY_ADDRESS")
    if local:  # with or without verbose: -v changes the console, never how Ray runs
        os.environ.setdefault("RAY_worker_maximum_startup_concurrency",
                              str(STARTUP_CONCURRENCY))
    _levels(verbose)  # before ray.init: the token notice is logged while it starts
    args: dict[str, Any] = {"log_to_driver": verbose,
                            "logging_level": logging.INFO if verbose else logging.WARNING,
                            **init}
    if local:
        args["address"] = "local"
        if num_cpus is not None:
            args["num_cpus"] = num_cpus
        if object_store_bytes is not None:
            args["object_store_memory"] = int(object_store_bytes)
    elif address is not None:
        args["address"] = address
    ctx = ray.init(**args)
    quiet(verbose)
    return ctx


def quiet(verbose: bool = False) -> None:
    """Ray's loggers at ERROR on this process (WARNING again with ``verbose``), Ray Data's
    progress bars and start-of-execution lines off."""
    import ray.data

    _levels(verbose)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False


def _levels(verbose: bool) -> None:
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING if verbose else logging.ERROR)
