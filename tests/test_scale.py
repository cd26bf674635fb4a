"""Scale: deep chains and million-node forests run without Python recursion, in
memory proportional to the number of nodes."""
import sys

import numpy as np

import recjit as rj
from gru import gru, make_params as gru_params
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from conftest import assert_same_result


def tiled(forest, times):
    """`times` copies of the forest, side by side, renumbered."""
    nodes, edges = forest.num_nodes, forest.child_idx.size
    node_offsets = np.repeat(np.arange(times) * nodes, edges)
    child_ptr = np.concatenate([[0], (forest.child_ptr[1:] + edges * np.arange(times)[:, None])
                                .ravel()])
    return rj.Forest(child_ptr, np.tile(forest.child_idx, times) + node_offsets,
                     (forest.roots + nodes * np.arange(times)[:, None]).ravel(),
                     {name: np.tile(values, times) for name, values in forest.fields.items()})


def test_a_chain_of_depth_100000_runs_without_python_recursion():
    steps = 100_000
    chain = rj.Forest.from_sequences([steps], fields={"word": np.arange(steps) % 7})
    p = gru_params(4, 7, "float64")
    gru.run(rj.Forest.from_sequences([3], fields={"word": np.arange(3)}), p)  # compiled here
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(250)
    try:
        result, reference = gru.run(chain, p), gru.reference(chain, p)
    finally:
        sys.setrecursionlimit(limit)
    assert_same_result(result, reference)


def test_a_forest_of_a_million_nodes_equals_its_parts():
    part = rj.Forest.random_binary(40, seed=3, vocab_size=50)
    forest = tiled(part, 1_000_000 // part.num_nodes + 1)
    assert forest.num_nodes >= 1_000_000
    p = tree_rnn_params(3, 50, "float64")
    expected = tree_rnn.reference(part, p).roots[0]
    roots = tree_rnn.run(forest, p).roots[0]
    np.testing.assert_allclose(roots, np.tile(expected, (forest.roots.size // part.roots.size,
                                                         1)), rtol=1e-12, atol=1e-12)
