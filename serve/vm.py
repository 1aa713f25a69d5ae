"""The VM deployment: one task's vertical models (one per live version) behind
``@serve.batch``: ``score`` (the served probabilities and the VM alone's) and, for a residual
VM, ``base`` (the VM alone's logits, which the router completes with the corrections). Named
``VMReplicas``, not after the ``nn.Module`` it serves (``solaris.models.vm.VerticalModel``);
its deployments are named ``VM_<task>``.

A VM that does not load here (its class does not import where the app runs, a checkpoint
that does not fit) leaves the replica up, scoring nothing, with the error in ``health``: the
router's ``/healthz`` fails readiness with it, and Serve does not restart the replica in a
loop."""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
from ray import serve

from serve.backend import QUIET
from solaris.config import load_config
from solaris.errors import SolarisError
from solaris.online.scoring import (Artifacts, ScoreRequest, VMScorer, decode_score_request,
                                    encode_scores)

log = logging.getLogger("solaris.serve")


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=64,
                  max_queued_requests=256, health_check_period_s=2.0, logging_config=QUIET)
class VMReplicas:
    """One task's VMs (one per live version), scoring batches of requests."""

    def __init__(self, settings: dict[str, Any], task: str):
        import torch

        torch.set_num_threads(1)
        cfg = load_config(settings.get("config"), settings.get("overrides"))
        self.task = task
        self.scorers: dict[str, VMScorer] = {}
        self.error: str | None = None  # why this replica scores nothing
        try:
            for d in settings["artifact_dirs"]:
                art = Artifacts.open(d)
                if task in art.tasks:
                    self.scorers[art.version] = VMScorer(art, task, art.side_tables(),
                                                         cfg.cache.read_ttl_s)
        except SolarisError as e:
            self.scorers = {}
            self.error = f"{type(e).__name__}: {e}"
            log.error("VM %s: scores nothing: %s (fix it and redeploy)", task, self.error)
        for method in (self.score, self.base):
            method.set_max_batch_size(cfg.serve.vm_batch_size)
            method.set_batch_wait_timeout_s(cfg.serve.vm_batch_wait_s)
        log.info("VM %s: versions %s", task, list(self.scorers))

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def score(self, payloads: list[bytes]) -> list[bytes]:
        """A ``scores`` frame per request, of its (2, C) served probabilities and the VM
        alone's inside the residual VM (the verifier's ranking). Each payload is one
        ``score_request`` frame (``solaris.online.scoring.encode_score_request``): one buffer per
        call instead of a dozen arrays Ray would serialise."""
        return self._by_version(payloads, lambda vm, reqs: vm.score(reqs, with_base=True))

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def base(self, payloads: list[bytes]) -> list[bytes]:
        """A ``scores`` frame per request of the VM alone's (C,) logits inside a residual VM
        (``VMScorer.base_logits``): the router sends it while its lookup round runs and adds
        the corrections itself (``solaris.online.scoring.ResidualHead``)."""
        return self._by_version(payloads, VMScorer.base_logits)

    def _by_version(self, payloads: list[bytes],
                    run: Callable[[VMScorer, list[ScoreRequest]], list[np.ndarray]]
                    ) -> list[bytes]:
        """Decode the ``score_request`` frames, ``run`` each version's scorer on its
        requests, and answer each with a ``scores`` frame, in the order given."""
        if self.error is not None:
            raise SolarisError(f"VM {self.task} did not load: {self.error}")
        reqs = [decode_score_request(p) for p in payloads]
        out: list[bytes | None] = [None] * len(reqs)
        for version in {v for v, _ in reqs}:
            idx = [i for i, (v, _) in enumerate(reqs) if v == version]
            for i, a in zip(idx, run(self.scorers[version], [reqs[i][1] for i in idx])):
                out[i] = encode_scores(a)
        return out  # type: ignore[return-value]

    def versions(self) -> list[str]:
        return list(self.scorers)

    def health(self) -> dict[str, Any]:
        """What the router's ``/healthz`` reads: the versions scored, and the error that
        left this replica scoring nothing (None when it loaded)."""
        return {"versions": list(self.scorers), "error": self.error}
