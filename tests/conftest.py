import copy
import os
import sys

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: docs/benchmarks.md "Threads"
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # pytest.ini runs the suite on -n auto workers
CORES = os.cpu_count() or 1
THREADS = max(1, min(2, CORES // WORKERS))  # no more threads than cores, all workers together
# also what train/eval pick in-process (session.pick_threads reads it first) and what a test's subprocess inherits:
# picked from the load instead, a worker could take both cores while the other is between tests
os.environ["OMP_NUM_THREADS"] = str(THREADS)
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(THREADS)

import model as model_mod  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """-n auto: a worker a core, at most 4 (each holds its own models, and the vLLM tests an engine)."""
    return max(1, min(4, os.cpu_count() or 1))  # read now: the test of this claim sets the cores


@pytest.fixture(scope="session")
def _tiny_base():
    return model_mod.load_model("tiny", seed=0)


@pytest.fixture
def tiny(_tiny_base):
    """A fresh copy of the tiny random Qwen2 and its tokenizer for each test."""
    m, tok = _tiny_base
    return copy.deepcopy(m).eval(), tok
