"""Malformed forests: whatever CSR arrays and fields a user hands over, `run` either
equals the reference or raises a `RecJitError`; never a crash, a hang or a wrong answer."""
import numpy as np
from hypothesis import event, given, settings, strategies as st

import recjit as rj
from tree_rnn import make_params, tree_rnn

from conftest import binary_forests, assert_same_result

VOCAB = 6
P = make_params(3, VOCAB, "float64", seed=1)
MISTAKES = ("none", "child out of range", "root out of range", "shared child", "cycle",
            "root is a child", "offsets out of order", "word off the table", "no roots",
            "extra root", "fractional child index")


@st.composite
def damaged_forests(draw):
    """A valid binary forest's CSR arrays and words, then at most one mistake in them."""
    forest = draw(binary_forests(VOCAB, max_trees=3))
    child_ptr, child_idx = forest.child_ptr.copy(), forest.child_idx.copy()
    roots, words = forest.roots.copy(), forest.fields["word"].copy()
    nodes = forest.num_nodes
    mistake = draw(st.sampled_from(MISTAKES))
    edge = draw(st.integers(0, max(child_idx.size - 1, 0)))
    if child_idx.size == 0 and mistake in ("child out of range", "shared child", "cycle",
                                           "root is a child"):
        mistake = "none"
    if mistake == "child out of range":
        child_idx[edge] = draw(st.sampled_from([-1, nodes, nodes + 5]))
    elif mistake == "root out of range":
        roots[draw(st.integers(0, roots.size - 1))] = draw(st.sampled_from([-1, nodes]))
    elif mistake == "shared child":
        child_idx[edge] = child_idx[(edge + 1) % child_idx.size]
    elif mistake == "cycle":
        child_idx[edge] = roots[0]
    elif mistake == "root is a child":
        roots = np.append(roots, child_idx[edge])
    elif mistake == "offsets out of order" and nodes > 1:
        child_ptr[1] = child_ptr[-1] + 1
    elif mistake == "word off the table":
        words[draw(st.integers(0, nodes - 1))] = draw(st.sampled_from([-2, VOCAB, 99]))
    elif mistake == "no roots":
        roots = roots[:0]
    elif mistake == "extra root":
        roots = np.append(roots, roots[0])
    elif mistake == "fractional child index" and child_idx.size:
        child_idx = child_idx + draw(st.sampled_from([0.0, 0.5]))  # floats, whole or not
    event(mistake)
    return child_ptr, child_idx, roots, words


@settings(max_examples=200)
@given(damaged_forests())
def test_a_damaged_forest_gives_the_reference_result_or_a_recjit_error(arrays):
    child_ptr, child_idx, roots, words = arrays
    try:
        forest = rj.Forest(child_ptr, child_idx, roots, {"word": words})
        result = tree_rnn.run(forest, P)
    except rj.RecJitError as error:
        event(f"refused: {type(error).__name__}")
        return
    event("ran")
    assert_same_result(result, tree_rnn.reference(forest, P))
