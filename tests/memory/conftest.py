"""Memory tests move small tensors: run torch single-threaded, so that on a shared 2-core
machine each tiny op does not wait for a second, busy core (it made them 10x slower)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
