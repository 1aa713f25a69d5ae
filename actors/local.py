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


JOIN = ("no", "prefer", "require")


def start(*, address: str | None = None, num_cpus: float | None = None,
          object_store_bytes: int | None = None, verbose: bool = False,
          join: str = "no", **init: Any) -> Any:
    """``ray.init`` for a command: the cluster at ``address`` (or ``RAY_ADDRESS``) where one
    is given; else, by ``join``, the cluster that ``ray start`` runs on this machine ("prefer":
    that one if it runs, else a local Ray; "require": that one or a ``ClusterNotFound``;
    Ray's ``address="auto"`` finds a cluster that ``ray start`` started, else the one Ray
    runs on this machine, such as ``serve run``'s own) or a
    local Ray of its own with ``num_cpus`` and ``object_store_bytes`` ("no"). ``init`` passes
    through (``runtime_env``, ``include_dashboard``, ...). Returns what ``ray.init`` returns.
    A cluster that cannot be reached (or asks for a token this process lacks) is a
    ``ClusterNotFound`` that says how to give it one."""
    import ray

    if join not in JOIN:
        raise ValueError(f"join={join!r}: one of {JOIN}")
    given = address not in (None, "local") or bool(os.environ.get("RAY_ADDRESS"))
    if not given and join != "no":
        found = _join_running(verbose, init)
        if found is not None:
            return found
        if join == "require":
            raise ClusterNotFound(
                "no Ray cluster runs on this machine: a job reaches a running app on the "
                "cluster the app runs on. Start one with `ray start --head`, deploy the app "
                "onto it (`serve run CONFIG` then joins it), or pass --address (or "
                "RAY_ADDRESS) of the app's cluster")
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
    try:
        ctx = ray.init(**args)
    except Exception as e:  # noqa: BLE001 -- Ray's own error types vary by release
        if not local and (_is_auth_error(e) or isinstance(e, ConnectionError)):
            where = f"the Ray cluster at {args.get('address') or os.environ['RAY_ADDRESS']}"
            raise ClusterNotFound(f"{where}: could not connect ({e}). Is it running? If it "
                                  f"does, it may use token authentication: "
                                  f"{_token_hint(where)}") from e
        raise
    quiet(verbose)
    return ctx


class ClusterNotFound(RuntimeError):
    """No Ray cluster this command may join: none runs, or it asks for a token."""


def _join_running(verbose: bool, init: dict[str, Any]) -> Any:
    """``ray.init`` on the cluster ``ray start`` runs on this machine, or None if none
    runs."""
    import ray

    _levels(verbose)
    try:
        ctx = ray.init(address="auto", log_to_driver=verbose,
                       logging_level=logging.INFO if verbose else logging.WARNING, **init)
    except ConnectionError:  # Ray's "could not find any running Ray instance"
        return None
    except Exception as e:  # noqa: BLE001
        if _is_auth_error(e):
            raise ClusterNotFound(f"the Ray cluster on this machine asks for a token: "
                                  f"{_token_hint('it')}") from e
        raise
    quiet(verbose)
    return ctx


def _is_auth_error(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return "authentication" in text or "auth_token" in text or "invalidauthtoken" in text


def _token_hint(where: str) -> str:
    """How to give this process the token of a cluster that asks for one (a local Ray that
    ``ray.init`` or ``serve run`` starts does; joined through ``address="auto"`` on its own
    machine it needs none)."""
    mode = os.environ.get("RAY_AUTH_MODE") or "unset"
    return (f"to reach {where} with a token, `export RAY_AUTH_MODE=token` before the command "
            f"(now {mode}); the token is read from ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or "
            f"RAY_AUTH_TOKEN, as on the cluster's own nodes")


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
