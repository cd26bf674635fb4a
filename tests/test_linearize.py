"""The linearizer's numbering (docs/design.md §3) and its structural validation."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import recjit as rj
from recjit.linearize import distinct, linearize

from conftest import binary_forests, caterpillar, random_dags


def heights(forest):
    """Height of every node, computed independently (children before parents)."""
    height = np.zeros(forest.num_nodes, dtype=int)
    for node in reversed(range(forest.num_nodes)):  # pre-order: children come after parents
        children = forest.children(node)
        if children.size:
            height[node] = 1 + height[children].max()
    return height


@given(binary_forests())
def test_each_batch_is_a_contiguous_range_of_one_height(forest):
    lin = linearize(forest)
    height = heights(forest)[lin.old_of_new]
    for batch in range(lin.num_batches):
        begin, end = lin.batch_begin[batch], lin.batch_begin[batch + 1]
        assert end > begin
        assert np.all(height[begin:end] == lin.num_batches - 1 - batch)


@given(binary_forests())
def test_parents_are_numbered_below_their_children_and_leaves_last(forest):
    lin = linearize(forest)
    for node in range(lin.num_nodes):
        children = lin.child_idx[lin.child_ptr[node]:lin.child_ptr[node + 1]]
        assert np.all(children > node)
        assert (children.size == 0) == (node >= lin.leaf_begin)


@given(binary_forests())
def test_children_fields_and_roots_follow_the_permutation(forest):
    lin = linearize(forest)
    assert np.array_equal(lin.old_of_new[lin.new_of_old], np.arange(forest.num_nodes))
    for new in range(lin.num_nodes):
        old = lin.old_of_new[new]
        children = lin.child_idx[lin.child_ptr[new]:lin.child_ptr[new + 1]]
        assert np.array_equal(lin.old_of_new[children], forest.children(old))
    assert np.array_equal(lin.fields["word"], forest.fields["word"][lin.old_of_new])
    assert np.array_equal(lin.old_of_new[lin.roots], forest.roots)


def relabelled(forest, new_of_old):
    """The same DAG with node n numbered new_of_old[n], each node's children in their order."""
    edges = [(new_of_old[parent], new_of_old[child]) for parent in range(forest.num_nodes)
             for child in forest.children(parent)]
    return rj.Forest.from_edges(forest.num_nodes, edges, kind="dag")


def stable_height_order(forest):
    """Cortex's numbering, computed plainly: longest path down to a leaf by repeated
    relaxation, then the nodes sorted tallest first, in their own order within a height."""
    height = np.zeros(forest.num_nodes, dtype=int)
    for _ in range(forest.num_nodes):
        for node in range(forest.num_nodes):
            children = forest.children(node)
            if children.size:
                height[node] = 1 + height[children].max()
    return sorted(range(forest.num_nodes), key=lambda node: (-height[node], node))


@given(random_dags(features=1), st.sampled_from(["as built", "reversed", "shuffled"]),
       st.integers(0, 2**32 - 1))
def test_the_numbering_is_a_stable_sort_by_height_whatever_the_input_order(dag, order, seed):
    labels = np.arange(dag.num_nodes)
    if order == "reversed":  # children numbered before their parents
        labels = labels[::-1]
    elif order == "shuffled":  # edges both ways: the heights go through Kahn's algorithm
        labels = np.random.default_rng(seed).permutation(dag.num_nodes)
    forest = relabelled(dag, labels)
    lin = linearize(forest, single_parent=False)
    assert lin.old_of_new.tolist() == stable_height_order(forest)
    for new in range(lin.num_nodes):
        children = lin.child_idx[lin.child_ptr[new]:lin.child_ptr[new + 1]]
        assert np.array_equal(lin.old_of_new[children], forest.children(lin.old_of_new[new]))
    internal_batches = np.diff(lin.batch_begin)[:-1]
    edges = np.diff(lin.child_ptr[lin.batch_begin])[:-1]
    assert lin.max_batch_size == (internal_batches.max() if internal_batches.size else 0)
    assert lin.max_batch_edges == (edges.max() if edges.size else 0)


@given(random_dags(features=70))
def test_fields_of_wide_rows_follow_the_permutation(dag):
    """Rows of 64 floats or more are gathered in compiled code, the others by NumPy."""
    x = dag.fields["x"]
    fields = {"x": x, "x32": x.astype(np.float32).reshape(-1, 7, 10), "x_narrow": x[:, :3]}
    forest = rj.Forest(dag.child_ptr, dag.child_idx, dag.roots, fields, kind="dag")
    lin = linearize(forest, single_parent=False)
    for name, values in fields.items():
        assert lin.fields[name].dtype == values.dtype
        assert np.array_equal(lin.fields[name], values[lin.old_of_new])


def test_a_chain_of_depth_5000_linearizes_without_recursion():
    lin = linearize(caterpillar(5000, 7))
    assert lin.num_batches == 5001
    assert lin.num_leaves == 5001


def test_a_dag_node_is_numbered_once_at_its_longest_path_height():
    # 0 -> 1 -> 2 -> 3 and 0 -> 3: node 3 is shared, node 0 has height 3
    forest = rj.Forest.from_edges(4, [(0, 1), (1, 2), (2, 3), (0, 3)])
    lin = linearize(forest, single_parent=False)
    assert lin.num_nodes == 4
    assert lin.num_batches == 4
    assert lin.old_of_new.tolist() == [0, 1, 2, 3]


def edges_forest(num_nodes, edges, roots):
    forest = rj.Forest.from_edges(num_nodes, edges, kind="tree")
    return rj.Forest(forest.child_ptr, forest.child_idx, roots)


@pytest.mark.parametrize("num_nodes, edges, roots, message", [
    (3, [(0, 1), (1, 2), (2, 1)], [0], "node 1 has two parents"),
    (2, [(0, 1), (1, 0)], [], "node 0 lies on a cycle"),
    (3, [(0, 1)], [0], "node 2 is neither a root nor anyone's child"),
    (2, [(0, 1)], [0, 1], "root node 1 is also a child"),
    (2, [(0, 1)], [0, 5], "root #1 is outside"),
])
def test_a_malformed_tree_is_refused_naming_the_node(num_nodes, edges, roots, message):
    with pytest.raises(rj.InputError, match=message):
        linearize(edges_forest(num_nodes, edges, roots))


def test_a_child_index_out_of_range_is_refused():
    forest = rj.Forest([0, 1, 1], [7], [0])
    with pytest.raises(rj.InputError, match="node 0 has a child outside 0..1"):
        linearize(forest)


def test_a_cycle_in_a_dag_is_refused():
    forest = rj.Forest.from_edges(4, [(0, 1), (1, 2), (2, 3), (3, 1)])
    forest = rj.Forest(forest.child_ptr, forest.child_idx, [0], kind="dag")
    with pytest.raises(rj.InputError, match="cycle"):
        linearize(forest, single_parent=False)


@given(st.lists(st.integers(0, 40), max_size=60))
def test_distinct_numbers_values_by_first_occurrence(values):
    values = np.array(values, dtype=np.int64)
    first, slot = distinct(values)
    assert np.array_equal(values[first[slot]], values)
    assert np.array_equal(first, np.sort(np.unique(values, return_index=True)[1]))
