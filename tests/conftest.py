"""Suite-wide set-up: the torch thread count every test trains and predicts with.

``SOLARIS_TEST_THREADS`` (default 1, read in ``tests/tiny.py``) sets it here for code that runs
torch without a config, and in the configs the tests build (``train.threads``). Changing it
perturbs training floats as another processor does; the suite must pass either way
(``.ci/threads2`` runs it with 2).

Two computations of the same floats in this process agree to the bit only at the same thread
count (a matrix product or a reduction splits its sums by thread), so every test starts at
``THREADS``, its fixtures included, whatever the code an earlier test ran left behind:
``train_fm``/``train_vm``/``train_residual`` set their config's ``train.threads`` (the KNN
job, ``jobs/rebuild_knn.rebuild``, restores its caller's count).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.tiny import THREADS


def pytest_configure(config) -> None:
    import torch

    torch.set_num_threads(THREADS)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    # before the item's fixtures are set up: a module fixture computed here and a test that
    # computes the same floats again later in the module see the same count
    import torch

    torch.set_num_threads(THREADS)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread in this process for the test, the count restored after: for tests
    that compare what this process computes with what the live system computes bit for bit.
    The live system runs torch on one thread in every actor and replica (``serve/vm.py``,
    ``serve/router.py``, ``precompute.threads`` = 1 in ``actors/precompute.py``, the KNN
    job's ``rebuild``), and another count rounds the same sums differently."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pytest_report_header(config) -> str:
    return f"solaris: torch threads {THREADS} (SOLARIS_TEST_THREADS)"
