import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
# tools/: development tools that are not installed (offline.py, the SASS counter)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))

# Without a GPU, Triton runs kernels only under its interpreter, and it reads
# TRITON_INTERPRET when it decorates a function, its own library's included:
# set before any test module imports triton, or a module that imports it
# first (test_triton_offline.py) leaves triton.language compiled-only and the
# interpreted kernels of test_triton_codec.py fail. Kernel compiles for the
# GPU run in subprocesses without it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from dist_utils import DistPool  # noqa: E402


# Process pools of real gloo ranks, one per test module that asks for one. A
# module that sets PG_TIMEOUT_S gets process groups with that timeout. Modules
# that set the same POOL_SHARE (the modules of one topic, split per module
# under test) share their pools for the whole run: each is spawned once, and
# closed when pytest ends.
_SHARED_POOLS: dict = {}


def _new_pool(request, n):
    timeout = getattr(request.module, "PG_TIMEOUT_S", None)
    return DistPool(n) if timeout is None else DistPool(n, pg_timeout_s=timeout)


def _pool(request, n):
    share = getattr(request.module, "POOL_SHARE", None)
    if share is None:
        pool = _new_pool(request, n)
        yield pool
        pool.close()
        return
    key = (share, n, getattr(request.module, "PG_TIMEOUT_S", None))
    if key not in _SHARED_POOLS:
        _SHARED_POOLS[key] = _new_pool(request, n)
    yield _SHARED_POOLS[key]


def pytest_unconfigure(config):
    for pool in _SHARED_POOLS.values():
        pool.close()
    _SHARED_POOLS.clear()


_BUILD_CACHE: list = []


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory):
    """An asset and C++ build cache of the test run's own, set as
    ZIPCCL_FSDP_CACHE_DIR for the modules that ask for it (what their
    subprocess ranks and their own checks share): made at the first such
    module, so the C++ codec and the torchtitan assets are built once a run,
    and never read from or left in the user's cache."""
    if not _BUILD_CACHE:
        _BUILD_CACHE.append(tmp_path_factory.mktemp("cache"))
    path = _BUILD_CACHE[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZIPCCL_FSDP_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def pool2(request):
    yield from _pool(request, 2)


@pytest.fixture(scope="module")
def pool3(request):
    yield from _pool(request, 3)


@pytest.fixture(scope="module")
def pool4(request):
    yield from _pool(request, 4)
