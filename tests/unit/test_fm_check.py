"""The FM checker (solaris/models/check.py, ``solaris check-fm``): the built-in and the example
FM pass it; a small two-tower FM passes it, and each variant of it that breaks one promise
fails it with that promise named -- the history read off by one first."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from solaris import cli
from solaris.models import check
from solaris.models.check import check_fm


class TwoTowerFM(nn.Module):
    """A mean-pooled history against the candidate's item vector, written from the input
    contract (history ids item + 1, 0 = padding); the subclasses below break it."""

    def __init__(self, spec, num_users, num_items, tasks, history_len, version, dim=8):
        super().__init__()
        self.version, self.tasks, self.history_len = version, tuple(tasks), history_len
        self.shared_dim, self.num_items = 2 * dim, num_items
        self.item_emb = nn.Embedding(num_items + 1, dim)
        self.action_emb = nn.Embedding(1 + 2 ** len(tasks), dim)
        self.user_cat_emb = nn.ModuleList(nn.Embedding(c, dim)
                                          for c in spec.user_categorical.values())
        self.out = nn.Linear(3 * dim, 2 * dim)
        self.task_heads = nn.Linear(2 * dim, len(tasks))

    def history(self, req):
        """(R, L) item rows of the history and (R, L) which slots are events."""
        h = req["hist_item"]  # (R, L) item + 1, 0 = pad
        return h, h > 0

    def candidate_rows(self, cand):
        return cand["item"] + 1  # (B,) the same table as the history's

    def pool(self, tok, valid):
        w = valid.unsqueeze(-1).float()  # (R, L, 1)
        return (tok * w).sum(1) / w.sum(1).clamp(min=1.0)  # (R, D)

    def user_state(self, req):
        rows, valid = self.history(req)
        tok = self.item_emb(rows) + self.action_emb(req["hist_action"])  # (R, L, D)
        tok = tok * (1 + req["hist_age"].unsqueeze(-1))  # (R, L, D)
        u = self.pool(tok, valid)  # (R, D)
        for j, emb in enumerate(self.user_cat_emb):
            u = u + emb(req["user_cat"][:, j])  # (R, D)
        return u

    def request_part(self, req):
        return {"u": self.user_state(req)}

    def candidate_part(self, state, cand, req_index):
        u = state["u"].index_select(0, req_index)  # (B, D)
        it = self.item_emb(self.candidate_rows(cand))  # (B, D)
        return F.relu(self.out(torch.cat([u, it, u * it], -1)))  # (B, 2D)

    def heads(self, shared):
        return self.task_heads(shared)  # (B, T)

    def user_vectors(self, req):
        return self.user_state(req)  # (R, D)

    def item_vectors(self):
        return self.item_emb.weight[1:]


class OffByOneFM(TwoTowerFM):
    """The history read as raw item ids with ``num_items`` for padding: 0, the contract's
    padding, is read as item 0."""

    def history(self, req):
        h = req["hist_item"]
        return h, h != self.num_items

    def candidate_rows(self, cand):
        return cand["item"]


class NarrowTableFM(TwoTowerFM):
    """A history table of num_items rows: the last item's code (num_items) has no row."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.item_emb = nn.Embedding(self.num_items, self.item_emb.embedding_dim)

    def candidate_rows(self, cand):
        return cand["item"]


class WideHeadsFM(TwoTowerFM):
    def heads(self, shared):
        return torch.cat([self.task_heads(shared), shared[:, :1]], -1)  # (B, T + 1)


class BatchMeanFM(TwoTowerFM):
    """Centres the last shared layer on the batch: a row depends on the others."""

    def candidate_part(self, state, cand, req_index):
        x = super().candidate_part(state, cand, req_index)
        return x - x.mean(0, keepdim=True)


class NoClampFM(TwoTowerFM):
    """Divides by the history length unclamped: NaN for a user with no history."""

    def pool(self, tok, valid):
        w = valid.unsqueeze(-1).float()
        return (tok * w).sum(1) / w.sum(1)


class UserIdFM(TwoTowerFM):
    """Reads a user-id table of num_users rows, in the user vectors too."""

    def __init__(self, spec, num_users, *a, **kw):
        super().__init__(spec, num_users, *a, **kw)
        self.user_emb = nn.Embedding(num_users, self.item_emb.embedding_dim)

    def user_state(self, req):
        return super().user_state(req) + self.user_emb(req["user"])


class ClaimsNewUsersFM(UserIdFM):
    """Declares it reads users it never saw, and indexes its user table with their ids."""

    reads_unseen_users = True


class ReadsNewUsersFM(TwoTowerFM):
    reads_unseen_users = True


def failed(cls) -> dict[str, str]:
    report = check_fm(cls)
    assert report.passed[0] == "builds"
    return {p.probe: p.message for p in report.problems}


@pytest.mark.parametrize("path", ["solaris.models.fm:FoundationModel",
                                  "examples.causal_fm:CausalTransformerFM"])
def test_the_builtin_and_the_example_fm_pass(path):
    report = check_fm(path)
    assert report.ok, [str(p) for p in report.problems]
    assert {"padding unread", "largest codes", "rows in blocks", "rows permuted",
            "user id unread by user_vectors", "finite"} <= set(report.passed)
    # the built-in indexes a user-id table; the example reads no user id
    assert report.reads_unseen_users == (path.startswith("examples"))
    assert ("unseen users" in report.passed) == report.reads_unseen_users
    # every probe ran, in the order the reference page lists them
    assert report.passed == [p for p in check.PROBES
                             if p != "unseen users" or report.reads_unseen_users]


def test_a_two_tower_written_from_the_contract_passes():
    assert failed(TwoTowerFM) == {}
    report = check_fm(ReadsNewUsersFM)
    assert report.ok and "unseen users" in report.passed


def test_the_history_read_off_by_one_fails_naming_the_padding():
    problems = failed(OffByOneFM)
    assert set(problems) == {"padding unread"}
    message = problems["padding unread"]
    assert "hist_action" in message and "hist_age" in message  # the keys this FM pools
    assert "hist_surface" not in message  # it reads no surface
    assert "is 0 read as item 0?" in message


def test_a_table_without_the_largest_code_fails():
    # on the probe batch, whose histories hold the last item: at the first call
    problems = failed(NarrowTableFM)
    assert set(problems) == {"request_part"}
    assert "IndexError" in problems["request_part"]
    # on a batch without it (the user's own log may lack the largest codes), the extremes
    w = check.world(32)
    req = {**w.req, "hist_item": w.req["hist_item"].clamp(max=1)}
    small = check.World(w.sizes, req, w.cand, w.req_index)
    s = w.sizes
    fm = NarrowTableFM(s.spec, s.num_users, s.num_items, s.tasks, s.history_len, "v").eval()
    probe = check._Checker(fm, small, check.Report("narrow"))
    assert probe.outputs(small.req)["heads"].shape == (len(w.req_index), 2)
    found = probe.extremes("largest")
    assert found.startswith(f"hist_item=num_items ([{s.num_items}]) raised IndexError")
    assert probe.extremes("smallest") is None


@pytest.mark.parametrize("cls, probe, words", [
    (WideHeadsFM, "shapes", "heads width 3 != 2 tasks"),
    (BatchMeanFM, "rows in blocks", "candidate_part by up to"),
    (NoClampFM, "finite", "NaN or inf in candidate_part"),
    (UserIdFM, "user id unread by user_vectors", "changing only the user id"),
    (ClaimsNewUsersFM, "unseen users", "IndexError"),
])
def test_each_broken_promise_is_named(cls, probe, words):
    problems = failed(cls)
    assert probe in problems, problems
    assert words in problems[probe]


def test_the_command_exits_1_naming_each_problem_and_0_listing_what_held(capsys):
    assert cli.main(["check-fm", f"{__name__}:OffByOneFM"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  padding unread: randomising the history" in out
    assert "ok    largest codes" in out and "1 problem(s)" in out
    assert cli.main(["check-fm", f"{__name__}:ReadsNewUsersFM"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "ok    unseen users" in out
    assert out.rstrip().endswith("every probe held; reads users it never saw "
                                 "(reads_unseen_users): yes")
    assert cli.main(["check-fm", "no_such_module_here:FM"]) == 1
    assert "FAIL  builds: fm.cls='no_such_module_here:FM': cannot import" in \
        capsys.readouterr().out
