"""Shared test setup."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """The tests use tiny tensors: a second OpenMP thread only waits, or contends with the
    subprocesses some tests start, which made small ops 20-50x slower on 2 shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
