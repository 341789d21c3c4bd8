import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

from dist_utils import DistPool  # noqa: E402


# Process pools of real gloo ranks, one per test module that asks for one.
def _pool(n):
    pool = DistPool(n)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def pool2():
    yield from _pool(2)


@pytest.fixture(scope="module")
def pool3():
    yield from _pool(3)


@pytest.fixture(scope="module")
def pool4():
    yield from _pool(4)
