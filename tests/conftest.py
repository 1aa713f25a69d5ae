"""Suite-wide set-up: the torch thread count every test trains and predicts with.

``SOLARIS_TEST_THREADS`` (default 1, read in ``tests/tiny.py``) sets it here for code that runs
torch without a config, and in the configs the tests build (``train.threads``). Changing it
perturbs training floats as another processor does; the suite must pass either way.
"""

from __future__ import annotations

from tests.tiny import THREADS


def pytest_configure(config) -> None:
    import torch

    torch.set_num_threads(THREADS)


def pytest_report_header(config) -> str:
    return f"solaris: torch threads {THREADS} (SOLARIS_TEST_THREADS)"
