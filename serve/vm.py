"""The VM deployment: one task's vertical models (one per live version) behind
``@serve.batch``: ``score`` (the served probabilities and the VM alone's) and, for a residual
VM, ``base`` (the VM alone's logits, which the router completes with the corrections). Named
``VMReplicas``, not after the ``nn.Module`` it serves (``solaris.models.vm.VerticalModel``);
its deployments are named ``VM_<task>``."""

from __future__ import annotations

import logging
from typing import Any

from ray import serve

from serve.backend import QUIET
from solaris.config import load_config
from solaris.online.scoring import Artifacts, VMScorer, decode_score_request, encode_scores

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
        for d in settings["artifact_dirs"]:
            art = Artifacts.open(d)
            if task in art.tasks:
                self.scorers[art.version] = VMScorer(art, task, art.side_tables(),
                                                     cfg.cache.read_ttl_s)
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
        reqs = [decode_score_request(p) for p in payloads]
        out: list[bytes | None] = [None] * len(reqs)
        for version in {v for v, _ in reqs}:
            idx = [i for i, (v, _) in enumerate(reqs) if v == version]
            for i, p in zip(idx, self.scorers[version].score([reqs[i][1] for i in idx],
                                                             with_base=True)):
                out[i] = encode_scores(p)
        return out  # type: ignore[return-value]

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def base(self, payloads: list[bytes]) -> list[bytes]:
        """A ``scores`` frame per request of the VM alone's (C,) logits inside a residual VM
        (``VMScorer.base_logits``): the router sends it while its lookup round runs and adds
        the corrections itself (``solaris.online.scoring.ResidualHead``)."""
        reqs = [decode_score_request(p) for p in payloads]
        out: list[bytes | None] = [None] * len(reqs)
        for version in {v for v, _ in reqs}:
            idx = [i for i, (v, _) in enumerate(reqs) if v == version]
            for i, b in zip(idx, self.scorers[version].base_logits([reqs[i][1] for i in idx])):
                out[i] = encode_scores(b)
        return out  # type: ignore[return-value]

    def versions(self) -> list[str]:
        return list(self.scorers)
