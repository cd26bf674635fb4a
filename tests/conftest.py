"""Shared strategies: random forests and parameters. Kernels compile once per shape signature
and are reused across hypothesis examples (hidden sizes are fixed per test)."""
import os
import sys

import numpy as np
from hypothesis import HealthCheck, settings, strategies as st

import recjit as rj
from recjit.linearize import random_bracketing

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "examples")))

settings.register_profile("recjit", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("recjit")


@st.composite
def binary_forests(draw, vocab_size=50, max_trees=30, max_leaves=24):
    """1–30 random binary trees, single nodes among them."""
    leaf_counts = draw(st.lists(st.integers(1, max_leaves), min_size=1, max_size=max_trees))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    words = [[int(w) for w in rng.integers(0, vocab_size, n)] for n in leaf_counts]
    return rj.Forest.from_nested([random_bracketing(w, rng) for w in words])


seeds = st.integers(0, 2**32 - 1)
scales = st.floats(0.1, 2.0)


def caterpillar(depth, vocab_size):
    """A left-deep binary tree of the given depth: the deepest recursion per node count."""
    tree = 0
    for level in range(depth):
        tree = (tree, (level + 1) % vocab_size)
    return rj.Forest.from_nested([tree])


def assert_same_result(compiled, reference, rtol=1e-5, atol=1e-6):
    """Compiled equals reference within `rtol` relative (plus `atol` for values near zero),
    per node and per root."""
    assert len(compiled.nodes) == len(reference.nodes)
    for got, want in zip(compiled.nodes + compiled.roots, reference.nodes + reference.roots):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
