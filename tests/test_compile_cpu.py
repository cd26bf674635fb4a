"""The compiled CPU kernel equals the naive recursion (`model.reference`) on generated forests
and parameters: within 1e-5 relative in float64 (plus 1e-6 absolute for values near zero)."""
import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import recjit as rj
from recjit.codegen_cpu.emit import SERIAL_ITEMS
from recjit.codegen_cpu.runtime import VECTOR_BYTES
from recjit.linearize import random_bracketing
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from conftest import (assert_gradients_are_differences, assert_same_result,
                      attentive_child_sum, attentive_params,
                      binary_forests, caterpillar, child_mean, gated_child_list,
                      max_pooled, min_pooled, nary_forests, powered_rnn, row_major_params,
                      row_major_rnn, scaled_rnn, scaled_rnn_params, scales, seeds,
                      time_aware_rnn, transposed_mv_params, transposed_mv_rnn, tree_convolution,
                      vector_rnn_params, with_time_steps, word_sequences)

VOCAB = 50


def scaled(params, scale):
    return rj.Params(**{name: getattr(params, name) * scale for name in params.names()})


@given(binary_forests(VOCAB), seeds, scales)
def test_tree_lstm_equals_reference(forest, seed, scale):
    p = scaled(tree_lstm_params(6, VOCAB, "float64", seed), scale)
    assert_same_result(tree_lstm.run(forest, p), tree_lstm.reference(forest, p))


@given(binary_forests(VOCAB), seeds, scales)
def test_tree_rnn_equals_reference(forest, seed, scale):
    p = scaled(tree_rnn_params(5, VOCAB, "float64", seed), scale)
    assert_same_result(tree_rnn.run(forest, p), tree_rnn.reference(forest, p))


@given(binary_forests(VOCAB), seeds)
def test_tree_lstm_in_float32_equals_reference_within_float32_rounding(forest, seed):
    p = tree_lstm_params(12, VOCAB, "float32", seed)
    result = tree_lstm.run(forest, p)
    assert result.nodes[0].dtype == np.float32
    assert_same_result(result, tree_lstm.reference(forest, p), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_reference_of_a_cell_that_starts_from_rj_zeros_computes_in_the_parameters_dtype(
        dtype):
    """A child-sum cell accumulates from `rj.zeros`, whose NumPy default is float64: the
    plain recursion of a float32 model must not compute in float64 from there on."""
    forest = rj.Forest.from_nested([((1, 2, 3), 4), 5])
    p = tree_gru_params(6, VOCAB, dtype, seed=1)
    reference = tree_gru.reference(forest, p)
    assert reference.nodes[0].dtype == np.dtype(dtype) == tree_gru.run(forest, p).nodes[0].dtype
    assert rj.zeros(2).dtype == np.float64  # outside a reference, NumPy's default


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_exact_math_schedule_equals_reference(forest, seed):
    p = tree_lstm_params(6, VOCAB, "float64", seed)
    result = tree_lstm.run(forest, p, schedule=rj.Schedule(fast_math=False))
    assert_same_result(result, tree_lstm.reference(forest, p), rtol=1e-12, atol=1e-12)


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_without_hoisting_results_are_unchanged(forest, seed):
    p = tree_rnn_params(5, VOCAB, "float64", seed)
    result = tree_rnn.run(forest, p, schedule=rj.Schedule(hoist=False))
    assert_same_result(result, tree_rnn.reference(forest, p))


def test_a_chain_of_depth_2000_equals_the_iterative_reference():
    forest = caterpillar(2000, VOCAB)
    p = tree_lstm_params(6, VOCAB, "float64", 1)
    assert_same_result(tree_lstm.run(forest, p), tree_lstm.reference(forest, p))


def test_the_reference_equals_the_plain_python_recursion():
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), 6])
    p = tree_lstm_params(4, VOCAB, "float64", 2)
    reference = tree_lstm.reference(forest, p)
    for position, root in enumerate(forest.roots):
        h, c = tree_lstm(rj.NodeView(forest, int(root)), p)
        np.testing.assert_array_equal(reference.roots[0][position], h)
        np.testing.assert_array_equal(reference.roots[1][position], c)


def helper_gate(x, p, bias):
    return rj.sigmoid(x + bias)


@rj.recursive_model(arity=2)
def kitchen_sink(node, p):
    """Every op of the first cell language, in one cell."""
    if node.is_leaf:
        e = p.E[node.word]
        return rj.relu(e) - 0.5 * e, rj.zeros(4) + rj.ones(4) / 2
    left, left_aux = kitchen_sink(node.left, p)
    right, right_aux = kitchen_sink(node.right, p)
    both = rj.concat([left, right])
    a, b = rj.split(p.W @ both + p.b, 2)
    gate = helper_gate(a, p, bias=p.b[0:4])
    mixed = rj.maximum(gate, rj.exp(-b)) - rj.minimum(left, right) / 3.0
    tail = rj.log(1.0 + rj.exp(both[4:8]))
    if node.num_children == 2:
        mixed = mixed + -tail
    total = sum(aux for aux in (left_aux, right_aux))
    return rj.tanh(mixed), rj.concat([total[0:2], gate[2:4]]) * 0.5


@given(binary_forests(VOCAB, max_trees=8), seeds)
def test_every_supported_op_equals_reference(forest, seed):
    rng = np.random.default_rng(seed)
    p = rj.Params(E=rng.normal(size=(VOCAB, 4)), W=rng.normal(size=(8, 8)) / 3,
                  b=rng.normal(size=8))
    assert_same_result(kitchen_sink.run(forest, p), kitchen_sink.reference(forest, p))


def test_the_same_shapes_hit_the_cache_and_new_shapes_compile_again():
    forest = rj.Forest.from_nested([(1, 2)])
    first = tree_rnn.compile(forest, tree_rnn_params(5, VOCAB, "float64", 0))
    again = tree_rnn.compile(forest, tree_rnn_params(5, VOCAB, "float64", 9))
    other = tree_rnn.compile(forest, tree_rnn_params(7, VOCAB, "float64", 0))
    assert first is again
    assert other is not first
    assert other.cell.state_shapes == ((7,),)


def test_kernel_source_has_no_per_node_branch_and_runs_batches_in_parallel():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    tree_lstm.run(forest, tree_lstm_params(4, VOCAB, "float64"))
    source = tree_lstm.kernel_source("cpu")
    assert "@njit(parallel=True" in source
    assert "prange(count)" in source and "prange(num_leaves)" in source
    kernel = source.split("def tree_lstm_kernel")[1]
    branches = [line.strip() for line in kernel.splitlines()
                if line.strip().startswith(("if ", "else"))]
    assert branches and all(branch.startswith((f"if count > {SERIAL_ITEMS}:", "else:",
                                               "if pack:"))
                            for branch in branches)


def test_batches_of_a_few_nodes_run_on_one_thread_and_equal_reference():
    forest = rj.Forest.perfect(5, vocab_size=VOCAB)  # internal batches of 16, 8, 4, 2, 1 nodes
    p = tree_lstm_params(6, VOCAB, "float64")
    assert_same_result(tree_lstm.run(forest, p), tree_lstm.reference(forest, p))
    source = tree_lstm.kernel_source("cpu")
    assert "for slot in prange(count):" in source and "for slot in range(count):" in source


@given(st.integers(1, 30), st.integers(1, 3), seeds)
def test_leaf_products_are_computed_once_per_distinct_word(num_leaves, vocab_size, seed):
    rng = np.random.default_rng(seed)
    forest = rj.Forest.from_nested([random_bracketing(
        [int(w) for w in rng.integers(0, vocab_size, num_leaves)], rng)])
    p = tree_lstm_params(5, vocab_size, "float64", seed)
    assert_same_result(tree_lstm.run(forest, p), tree_lstm.reference(forest, p))
    assert "for distinct in prange(num_distinct_leaves):" in tree_lstm.kernel_source("cpu")


def test_explain_shows_cases_batches_and_barriers():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    text = tree_lstm.explain(forest, tree_lstm_params(4, VOCAB, "float64"))
    assert "case leaf (0 children)" in text and "case internal (2 children)" in text
    assert "3 batches" in text
    assert "barrier: the next batch reads this batch's states" in text
    assert "barrier: the products read the packed inputs" in text
    assert "barrier: the elementwise ops read the products" in text
    assert "barriers per batch: 3" in text


def test_explain_marks_the_cell_ir_ops_that_no_state_reads():
    """A leaf's `U_iou @ h_sum` with h_sum zero is folded to zeros, and leaves `U_iou` behind:
    listed, numbered as the kernel's names are, and marked."""
    forest = rj.Forest.from_nested([((1, 2, 3), 4)])
    text = child_sum_tree_lstm.explain(forest, tree_lstm_params(4, VOCAB, "float64"))
    leaf = text.split("case leaf")[1].split("case internal")[0]
    assert "= param U_iou    : (12, 4)  (no state reads it)" in leaf
    assert "= param W_iou    : (12, 4)\n" in leaf


def test_explain_names_the_width_of_the_products_vectors():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    text = tree_lstm.explain(forest, tree_lstm_params(4, VOCAB, "float64"))
    assert f"the products' vectors are {VECTOR_BYTES} bytes" in text


def test_an_empty_forest_gives_empty_results():
    forest = rj.Forest.from_nested([])
    result = tree_lstm.run(forest, tree_lstm_params(4, VOCAB, "float64"))
    assert [a.shape for a in result.nodes] == [(0, 4), (0, 4)]
    assert [a.shape for a in result.roots] == [(0, 4), (0, 4)]


@rj.recursive_model(arity=2, kind="dag")
def dag_rnn(node, p):
    if node.is_leaf:
        return rj.relu(p.W @ node.x + p.b)
    return rj.relu(p.W @ node.x + p.U @ (dag_rnn(node.left, p) + dag_rnn(node.right, p)) + p.b)


@given(st.integers(2, 40), seeds)
def test_a_fixed_arity_dag_with_vector_fields_equals_reference(num_nodes, seed):
    """Node n's two children are drawn from the nodes after it, so nodes are shared; the input
    projection `W @ node.x` is hoisted out of the batches."""
    rng = np.random.default_rng(seed)
    edges = [(n, int(c)) for n in range(num_nodes - 2)
             for c in rng.choice(np.arange(n + 1, num_nodes), 2, replace=False)]
    forest = rj.Forest.from_edges(num_nodes, edges, fields={"x": rng.normal(size=(num_nodes, 3))})
    p = rj.Params(W=rng.normal(size=(4, 3)), U=rng.normal(size=(4, 4)) / 2, b=rng.normal(size=4))
    assert_same_result(dag_rnn.run(forest, p), dag_rnn.reference(forest, p))


@given(st.integers(3, 40), seeds, st.sampled_from([rj.Schedule(), rj.Schedule(hoist=False)]))
def test_a_product_of_a_vector_field_reads_the_fields_rows_in_place(num_nodes, seed, schedule):
    """`W @ node.x` over the leaves, the hoisted internal nodes or a batch: the product reads
    `field_x` from the pass's first node on, with no packed copy of it."""
    rng = np.random.default_rng(seed)
    edges = [(n, int(c)) for n in range(num_nodes - 2)
             for c in rng.choice(np.arange(n + 1, num_nodes), 2, replace=False)]
    forest = rj.Forest.from_edges(num_nodes, edges, fields={"x": rng.normal(size=(num_nodes, 3))})
    p = rj.Params(W=rng.normal(size=(4, 3)), U=rng.normal(size=(4, 4)) / 2, b=rng.normal(size=4))
    assert_same_result(dag_rnn.run(forest, p, schedule=schedule),
                       dag_rnn.reference(forest, p))
    source = dag_rnn.kernel_source("cpu")
    assert "matmul_share(p_W, panels_W, no_tail, field_x" in source and "_x_W[" not in source


@given(st.integers(2, 40), seeds)
def test_a_vector_field_of_integers_is_computed_on_in_the_parameters_dtype(num_nodes, seed):
    rng = np.random.default_rng(seed)
    edges = [(n, int(c)) for n in range(num_nodes - 2)
             for c in rng.choice(np.arange(n + 1, num_nodes), 2, replace=False)]
    forest = rj.Forest.from_edges(num_nodes, edges,
                                  fields={"x": rng.integers(-3, 4, size=(num_nodes, 3))})
    p = rj.Params(W=rng.normal(size=(4, 3)), U=rng.normal(size=(4, 4)) / 2, b=rng.normal(size=4))
    assert_same_result(dag_rnn.run(forest, p), dag_rnn.reference(forest, p))


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_a_scalar_parameter_equals_reference(forest, seed):
    p = scaled_rnn_params(4, VOCAB, seed)
    assert_same_result(scaled_rnn.run(forest, p), scaled_rnn.reference(forest, p))


@pytest.mark.parametrize("number", [0.75, -2], ids=["float", "int"])
def test_a_python_number_parameter_takes_the_arrays_dtype_as_in_numpy(number):
    p = scaled_rnn_params(4, VOCAB, seed=4)
    single = rj.Params(E=p.E.astype(np.float32), W=p.W.astype(np.float32), alpha=number)
    forest = rj.Forest.from_nested([((1, 2), (3, 4)), 5])
    result, expected = scaled_rnn.run(forest, single), scaled_rnn.reference(forest, single)
    assert result.roots[0].dtype == expected.roots[0].dtype == np.float32
    assert_same_result(result, expected, rtol=1e-5)


@given(nary_forests(VOCAB, max_trees=5), seeds)
def test_the_mean_of_any_number_of_children_equals_reference(forest, seed):
    p = vector_rnn_params(4, VOCAB, seed)
    assert_same_result(child_mean.run(forest, p), child_mean.reference(forest, p))


@rj.recursive_model(arity=None)
def children_as_condition(node, p):
    """`not node.children` and `if node.children:` test for a leaf as the list's truth does."""
    if not node.children:
        return p.E[node.word]
    total = sum(children_as_condition(child, p) for child in node.children)
    return rj.tanh(p.W @ total) if node.children else total


@given(nary_forests(VOCAB, max_trees=5), seeds)
def test_node_children_as_a_condition_is_true_at_internal_nodes_as_in_python(forest, seed):
    p = vector_rnn_params(4, VOCAB, seed)
    assert_same_result(children_as_condition.run(forest, p),
                       children_as_condition.reference(forest, p))


def test_node_children_as_a_condition_differentiates_as_finite_differences_do():
    forest = rj.Forest.from_nested([(1, (2, 3, 4), 0), (2,)])
    assert_gradients_are_differences(children_as_condition, forest,
                                     vector_rnn_params(3, VOCAB, seed=1), seed=2)


@given(nary_forests(VOCAB, max_trees=5), seeds)
def test_lists_of_the_childrens_states_with_any_number_of_children_equal_reference(forest, seed):
    p = vector_rnn_params(4, VOCAB, seed)
    assert_same_result(gated_child_list.run(forest, p), gated_child_list.reference(forest, p))


@pytest.mark.parametrize("model", [max_pooled, min_pooled, tree_convolution],
                         ids=["a running maximum", "a running minimum, the child first",
                              "a child's place"])
@given(nary_forests(VOCAB, max_trees=5), seeds)
def test_pooling_and_places_over_any_number_of_children_equal_reference(model, forest, seed):
    p = vector_rnn_params(4, VOCAB, seed)
    assert_same_result(model.run(forest, p), model.reference(forest, p))


@rj.recursive_model(arity=2)
def counted_from_one(node, p):
    """`enumerate` with a start, over a fixed number of children."""
    if node.is_leaf:
        return p.E[node.word]
    total = rj.zeros(p.b.shape)
    for place, child in enumerate(node.children, 1):
        total = total + place * counted_from_one(child, p)
    return rj.tanh(p.W @ total + p.b)


def test_enumerate_from_a_start_over_a_fixed_number_of_children_equals_reference():
    forest = rj.Forest.from_nested([((1, 2), (3, 4)), 5])
    p = vector_rnn_params(4, VOCAB, seed=2)
    assert_same_result(counted_from_one.run(forest, p), counted_from_one.reference(forest, p))


@rj.recursive_model(arity=3)
def weighted_from_the_end(node, p):
    """`reversed` of a fixed number of children, and of their states: each weighted by its
    place, so that either reversal left out changes the states."""
    if node.is_leaf:
        return p.E[node.word]
    states = [weighted_from_the_end(child, p) for child in reversed(node.children)]
    total = rj.zeros(p.b.shape)
    for place, h in enumerate(states, 1):
        total = total + place * rj.tanh(p.W @ h)
    for place, h in enumerate(reversed(states), 1):
        total = total + place * place * h
    return rj.tanh(total + p.b)


def test_the_children_reversed_with_a_fixed_arity_equal_reference():
    forest = rj.Forest.from_nested([((1, 2, 3), (4, 5, 6), 7), (0, 2, 4)])
    p = vector_rnn_params(4, VOCAB, seed=3)
    assert_same_result(weighted_from_the_end.run(forest, p),
                       weighted_from_the_end.reference(forest, p))


@rj.recursive_model(arity=2)
def listed_children(node, p):
    """`list(node.children)` indexed, as Python code copies a list before reading it."""
    if node.is_leaf:
        return p.E[node.word]
    children = list(node.children)
    return rj.tanh(p.W @ listed_children(children[0], p) + listed_children(children[1], p))


@rj.recursive_model(arity=None)
def listed_any_children(node, p):
    """A loop over `tuple(node.children)`, and a sum of `list(states)`."""
    states = [listed_any_children(child, p) for child in tuple(node.children)]
    total = rj.zeros(p.b.shape)
    for child in list(node.children):
        total = total + rj.tanh(p.W @ listed_any_children(child, p))
    x = p.E[node.word] if node.is_leaf else 0
    return rj.tanh(x + total + sum(list(states), rj.zeros(p.b.shape)) + p.b)


def test_the_children_as_a_list_with_a_fixed_arity_are_indexed_as_the_children():
    forest = rj.Forest.from_nested([((1, 2), (3, 4)), (5, 6)])
    p = vector_rnn_params(4, VOCAB, seed=4)
    assert_same_result(listed_children.run(forest, p), listed_children.reference(forest, p))


def test_any_number_of_children_as_a_list_or_tuple_are_looped_over_as_the_children():
    forest = rj.Forest.from_nested([((1, 2, 3), (4,), 5), (6, 7)])
    p = vector_rnn_params(4, VOCAB, seed=5)
    assert_same_result(listed_any_children.run(forest, p),
                       listed_any_children.reference(forest, p))


@given(nary_forests(VOCAB, max_trees=5), seeds,
       st.sampled_from([rj.Schedule(), rj.Schedule(unroll=2)]))
def test_inner_products_weighting_any_number_of_children_equal_reference(forest, seed, schedule):
    p = attentive_params(5, VOCAB, seed)
    assert_same_result(attentive_child_sum.run(forest, p, schedule=schedule),
                       attentive_child_sum.reference(forest, p))


def test_the_cpu_kernel_computes_each_inner_product_once_a_node_or_a_child():
    """No loop over a state's 5 elements encloses an inner product's own loop: the node's
    `total @ total` and each child's score are computed before the element loops that read
    them, and the weighted sum over children goes into a row first."""
    forest = rj.Forest.from_nested([((1, 2, 3), (4, 5)), (6, 7)])
    source = attentive_child_sum.kernel_source("cpu", forest, attentive_params(5, VOCAB, 1))
    lines = source[source.index("for b in range"):].splitlines()

    def indent(line):
        return len(line) - len(line.lstrip())

    inner_loops = [i for i, line in enumerate(lines) if line.strip().startswith("for k2 ")]
    assert inner_loops
    for i in inner_loops:
        enclosing, depth = [], indent(lines[i])
        for line in reversed(lines[:i]):
            if line.strip() and indent(line) < depth:
                enclosing.append(line.strip())
                depth = indent(line)
        assert not any(line.startswith("for ") and line.endswith("in range(5):")
                       for line in enclosing), enclosing


@given(word_sequences(VOCAB, max_length=40), seeds)
def test_a_float_scalar_field_is_a_number_per_node(forest, seed):
    forest, p = with_time_steps(forest, seed), scaled_rnn_params(4, VOCAB, seed)
    assert_same_result(time_aware_rnn.run(forest, p), time_aware_rnn.reference(forest, p))


def gate(x, W, b=None, scale=1.0, *, act=rj.sigmoid):
    """A helper with optional arguments, as people write them."""
    y = W @ x
    if b is not None:
        y = y + b
    return act(y * scale)


@rj.recursive_model(arity=2)
def gated_by_helper(node, p):
    if node.is_leaf:
        return gate(p.E[node.word], p.W, act=rj.tanh)
    left, right = gated_by_helper(node=node.left, p=p), gated_by_helper(node.right, p=p)
    return gate(left + right, p.W, p.b, scale=0.5) * gate(left - right, W=p.W, b=p.b)


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_helpers_with_optional_arguments_and_calls_by_keyword_equal_reference(forest, seed):
    p = vector_rnn_params(4, VOCAB, seed)
    assert_same_result(gated_by_helper.run(forest, p), gated_by_helper.reference(forest, p))


@rj.recursive_model(arity=2)
def weighted_children(node, p):
    """Loops over a list of the children's states: as many trips as the list has values, which
    the structure decides, so not a loop over a tensor (P.1)."""
    if node.is_leaf:
        return p.E[node.word]
    states = [weighted_children(child, p) for child in (node.left, node.right)]
    weighted = sum(state * weight for state, weight in [(states[0], 0.25), (states[1], 0.75)])
    return rj.tanh(weighted + sum(p.W @ state for state in states))


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_loops_over_a_list_of_the_childrens_states_equal_reference(forest, seed):
    p = vector_rnn_params(4, VOCAB, seed)
    assert_same_result(weighted_children.run(forest, p), weighted_children.reference(forest, p))


@rj.recursive_model(arity=None)
def accumulating(node, p):
    """`acc += ...` into an array of the cell's own (rj.zeros), over any number of children."""
    acc = rj.zeros(p.b.shape)
    for child in node.children:
        acc += accumulating(child, p)
    if node.is_leaf:
        acc += p.E[node.word]
    return rj.tanh(p.W @ acc + p.b)


@given(nary_forests(VOCAB, max_trees=5), seeds)
def test_updates_in_place_of_an_array_of_the_cells_own_equal_reference(forest, seed):
    p = vector_rnn_params(4, VOCAB, seed)
    assert_same_result(accumulating.run(forest, p), accumulating.reference(forest, p))


@rj.recursive_model(arity=3)
def ternary(node, p):
    """Fixed arity 3: children by index (from the end too), a loop that unrolls over exactly
    three, and their count as a number."""
    if node.is_leaf:
        return p.E[node.word]
    first, last = ternary(node.children[0], p), ternary(node.children[-1], p)
    total = rj.zeros(p.b.shape)
    for child in node.children:
        total = total + rj.tanh(p.U @ ternary(child, p))
    return rj.tanh(p.W @ (first - last) + total / len(node.children) + p.b * node.num_children)


def ternary_forests(draw_words):
    return rj.Forest.from_nested([((1, 2, 3), 4, (5, (6, 7, 8), 9)), (draw_words, 1, 2)])


def ternary_params(seed):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(VOCAB, 5)), W=rng.normal(size=(5, 5)) / 2,
                     U=rng.normal(size=(5, 5)) / 2, b=rng.normal(size=5))


@given(st.integers(0, VOCAB - 1), seeds)
def test_a_fixed_arity_3_model_indexes_counts_and_loops_over_its_children(word, seed):
    p, forest = ternary_params(seed), ternary_forests(word)
    assert_same_result(ternary.run(forest, p), ternary.reference(forest, p))


@rj.recursive_model(arity=3)
def zipped_children(node, p):
    """`zip` of weights with the children's states, `enumerate` over the children."""
    if node.is_leaf:
        return p.E[node.word]
    states = [zipped_children(child, p) for child in node.children]
    total = p.b
    for weight, state in zip((p.U, p.W, p.U), states):
        total = total + weight @ state
    for k, child in enumerate(node.children, start=1):
        total = total + zipped_children(child, p) * k
    return rj.tanh(total)


@given(st.integers(0, VOCAB - 1), seeds)
def test_zip_and_enumerate_over_children_and_their_states_equal_reference(word, seed):
    p, forest = ternary_params(seed), ternary_forests(word)
    assert_same_result(zipped_children.run(forest, p), zipped_children.reference(forest, p))


@rj.recursive_model(arity=2)
def squashed_matrix_rnn(node, p):
    if node.is_leaf:
        return p.E_M[node.word]
    return rj.tanh(p.W_M @ rj.concat([squashed_matrix_rnn(node.left, p),
                                      squashed_matrix_rnn(node.right, p)]))


@settings(max_examples=10)
@given(binary_forests(vocab_size=7, max_trees=4, max_leaves=8), seeds)
def test_a_parameter_times_a_matrix_is_packed_and_stored_column_by_column(forest, seed):
    rng = np.random.default_rng(seed)
    p = rj.Params(E_M=rng.normal(size=(7, 4, 3)), W_M=rng.normal(size=(4, 8), scale=0.5))
    assert_same_result(squashed_matrix_rnn.run(forest, p),
                       squashed_matrix_rnn.reference(forest, p))
    source = squashed_matrix_rnn.kernel_source("cpu")
    # the packs of both children, in the batch loop's parallel and one-thread twins
    assert source.count("for k_column in range(3):") == 2 * 2
    assert "for e_column in range(3):" in source  # tanh of the product, stored


def read_only(array):
    """As `np.load(path, mmap_mode="r")` gives arrays: not writeable."""
    array = np.array(array)
    array.flags.writeable = False
    return array


@pytest.mark.parametrize("num_trees", [2, 12], ids=["direct", "weight-panels"])
def test_read_only_parameters_and_forest_arrays_equal_reference(num_trees):
    forest = rj.Forest.random_binary(num_trees, vocab_size=VOCAB, seed=num_trees)
    p = tree_lstm_params(8, VOCAB, "float32", seed=num_trees)
    frozen = rj.Forest(read_only(forest.child_ptr), read_only(forest.child_idx),
                       read_only(forest.roots), fields={"word": read_only(forest.fields["word"])})
    frozen_p = rj.Params(**{name: read_only(getattr(p, name)) for name in p.names()})
    assert_same_result(tree_lstm.run(frozen, frozen_p), tree_lstm.reference(forest, p),
                       rtol=1e-5)


def test_a_read_only_vector_field_equals_reference():
    rng = np.random.default_rng(3)
    edges = [(n, int(c)) for n in range(18) for c in rng.choice(np.arange(n + 1, 20), 2,
                                                                replace=False)]
    forest = rj.Forest.from_edges(20, edges, fields={"x": read_only(rng.normal(size=(20, 3)))})
    p = rj.Params(W=read_only(rng.normal(size=(4, 3))), U=read_only(rng.normal(size=(4, 4))),
                  b=read_only(rng.normal(size=4)))
    assert_same_result(dag_rnn.run(forest, p), dag_rnn.reference(forest, p))


@rj.recursive_model(arity=None)
def gated_child_sum(node, p):
    if node.is_leaf:
        return p.E[node.word]
    gate = rj.sigmoid(p.b)
    total, gated = rj.zeros(p.b.shape), rj.zeros(p.b.shape)
    for child in node.children:
        h = gated_child_sum(child, p)
        total = total + rj.tanh(p.W @ h)
        gated = gated + gate * h
    return rj.tanh(total + gated)


@rj.recursive_model(arity=None)
def product_gated_child_sum(node, p):
    if node.is_leaf:
        return p.E[node.word]
    gate = rj.tanh(p.W) @ p.b  # a product of a matrix the node computes: a loop of its own
    total = rj.zeros(p.b.shape)
    for child in node.children:
        total = total + gate * product_gated_child_sum(child, p)
    return rj.tanh(total)


def state_loop(source):
    """The CPU kernel's first element loop that writes the batch's states."""
    batches = source.split("# the batches")[1]
    store = batches.index("state_0[node, e] =")
    return batches[batches.rindex("for e in", 0, store):store]


@given(nary_forests(VOCAB, max_trees=5), seeds)
def test_sums_over_children_are_summed_child_by_child_before_the_loop_that_reads_them(
        forest, seed):
    """So the element loop has no inner loop and vectorizes; `gate`, which a term reads, is
    computed again in the sum's own loop."""
    p = vector_rnn_params(5, VOCAB, seed)
    assert_same_result(gated_child_sum.run(forest, p), gated_child_sum.reference(forest, p))
    source = gated_child_sum.kernel_source("cpu")
    assert source.count("= np.empty((5), dtype=real)") == 2 * 2  # two sums, prange and serial
    assert "for edge" not in state_loop(source) and "sums_v" in state_loop(source)
    assert "sums over children are summed child by child" in gated_child_sum.explain(forest, p)


@given(nary_forests(VOCAB, max_trees=5), seeds)
def test_a_sum_whose_terms_read_a_value_computed_in_a_loop_stays_in_the_element_loop(
        forest, seed):
    p = vector_rnn_params(5, VOCAB, seed)
    assert_same_result(product_gated_child_sum.run(forest, p),
                       product_gated_child_sum.reference(forest, p))
    source = product_gated_child_sum.kernel_source("cpu")
    assert "sums_v" not in source and "for edge" in state_loop(source)


@rj.recursive_model(arity=2)
def numpy_cell(node, p):
    """NumPy's functions and products, and Python's abs."""
    if node.is_leaf:
        e = p.E[node.word]
        return np.tanh(abs(np.matmul(np.concatenate([e, e]), p.W.T)))
    h = np.concatenate([numpy_cell(node.left, p), numpy_cell(node.right, p)])
    return np.maximum(np.tanh(np.dot(p.W, h)),
                      np.minimum(np.exp(-np.log(1 + np.sqrt(np.abs(p.b)))), 0.5))


@rj.recursive_model(arity=2)
def rj_cell(node, p):
    if node.is_leaf:
        e = p.E[node.word]
        return rj.tanh(rj.abs(p.W @ rj.concat([e, e])))
    h = rj.concat([rj_cell(node.left, p), rj_cell(node.right, p)])
    return rj.maximum(rj.tanh(p.W @ h), rj.minimum(rj.exp(-rj.log(1 + rj.sqrt(rj.abs(p.b)))), 0.5))


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_numpys_elementwise_functions_concatenate_dot_and_matmul_compile_as_rjs(forest, seed):
    rng = np.random.default_rng(seed)
    p = rj.Params(E=rng.normal(size=(VOCAB, 4)), W=rng.normal(size=(4, 8)) / 2,
                  b=rng.normal(size=4))
    assert_same_result(numpy_cell.run(forest, p), numpy_cell.reference(forest, p))
    assert (numpy_cell.kernel_source("cpu").replace("numpy_cell", "cell")
            == rj_cell.kernel_source("cpu", forest, p).replace("rj_cell", "cell"))


@given(binary_forests(VOCAB, max_trees=5), seeds, st.sampled_from([(3, 5), (20, 12), (16, 16)]),
       st.sampled_from([rj.Schedule(), rj.Schedule(refactor=True)]))
def test_a_vector_times_a_parameter_and_a_transposed_parameter_equal_reference(
        forest, seed, hidden_and_inputs, schedule):
    hidden, inputs = hidden_and_inputs  # 20 rows: two panels of 8 float64 rows and 4 more
    p = row_major_params(hidden, VOCAB, seed, inputs)
    assert_same_result(row_major_rnn.run(forest, p, schedule=schedule),
                       row_major_rnn.reference(forest, p))


@given(binary_forests(VOCAB, max_trees=5), seeds, st.integers(1, 6))
def test_matrix_states_times_parameters_read_transposed_equal_reference(forest, seed, hidden):
    p = transposed_mv_params(hidden, VOCAB, seed)
    assert_same_result(transposed_mv_rnn.run(forest, p), transposed_mv_rnn.reference(forest, p))


def test_parameters_read_transposed_whose_rows_alias_in_the_cache_are_packed_and_right():
    """128 float64 outputs a row (1 KiB), read-only, over a forest of 64 nodes or more: the
    kernel packs the rows into panels of its own before its products, and equals the
    reference."""
    forest = rj.Forest.random_binary(3, seed=4, vocab_size=VOCAB)
    assert forest.num_nodes >= rj.Schedule().pack_from_nodes
    p = row_major_params(128, VOCAB, seed=2)
    for value in vars(p).values():
        value.setflags(write=False)
    assert_same_result(row_major_rnn.run(forest, p), row_major_rnn.reference(forest, p))
    assert "pack_rows_share(pT_U, room_pT_U" in row_major_rnn.kernel_source("cpu")


def test_a_parameter_read_transposed_is_a_view_of_it_not_a_copy():
    forest = rj.Forest.from_nested([((1, 2), (3, (4, 5))), (6, 7)])
    source = row_major_rnn.kernel_source("cpu", forest, row_major_params(8, VOCAB, seed=1))
    assert "pT_U = p_U.T" in source and "pT_W = p_W.T" in source
    assert "matmul_share(pT_U," in source and "copy" not in source


@rj.recursive_model(arity=2)
def split_cell(node, p):
    """NumPy's split: in equal parts, and at indices (one from the end)."""
    if node.is_leaf:
        return p.E[node.word]
    h = np.concatenate([split_cell(node.left, p), split_cell(node.right, p)])
    a, b = np.split(h, 2)
    first, middle, last = np.split(p.W @ h, [1, -1])
    return rj.tanh(a * b + np.concatenate([last, middle, first]))


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_numpys_split_in_equal_parts_and_at_indices_equals_reference(forest, seed):
    rng = np.random.default_rng(seed)
    p = rj.Params(E=rng.normal(size=(VOCAB, 4)), W=rng.normal(size=(4, 8)) / 2)
    assert_same_result(split_cell.run(forest, p), split_cell.reference(forest, p))


@given(binary_forests(VOCAB, max_trees=5), seeds)
def test_integer_powers_equal_reference_and_compile_to_products(forest, seed):
    p = scaled_rnn_params(4, VOCAB, seed)
    assert_same_result(powered_rnn.run(forest, p), powered_rnn.reference(forest, p))
    source = powered_rnn.kernel_source("cpu")
    assert "**" not in source and "pow(" not in source and "power(" not in source


def test_explain_prints_only_when_given_a_file_and_shows_as_its_text(capsys):
    """A notebook cell ending in `model.explain(...)` shows the text once, not twice."""
    forest = rj.Forest.from_nested([((1, 2), 3)])
    p = tree_lstm_params(4, VOCAB, "float64")
    text = tree_lstm.explain(forest, p)
    assert capsys.readouterr().out == ""
    assert repr(text) == str(text) and text._repr_html_().startswith("<pre>== tree_lstm")
    written = io.StringIO()
    tree_lstm.explain(forest, p, file=written)
    assert written.getvalue() == str(text) + "\n"


def test_explain_refuses_a_file_it_cannot_write_to():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    with pytest.raises(rj.InputError, match="explain writes to `file`, an open text file"):
        tree_lstm.explain(forest, tree_lstm_params(4, VOCAB, "float64"), file="out.txt")


def test_a_pullbacks_a_prepared_forests_and_batches_reprs_are_short():
    """What a notebook shows as a cell's last line: not the arrays and kernels they hold."""
    forest = rj.Forest.from_nested([(1, 2), (3, (4, 5))])
    p = tree_lstm_params(4, VOCAB, "float64")
    _, pullback = tree_lstm.vjp(forest, p)
    assert repr(pullback) == "Pullback(tree_lstm, 2 roots, 8 nodes, compiled)"
    assert repr(tree_lstm.prepare(forest, p)) == f"Prepared(tree_lstm, {forest!r}, backend='cpu')"
    assert repr(forest.batches(1)) == "Batches(2 of up to 1 trees)"


def test_a_results_repr_is_short_its_roots_and_state_shapes():
    forest = rj.Forest.random_binary(3, seed=0, mean_leaves=30, vocab_size=VOCAB)
    out = tree_lstm.run(forest, tree_lstm_params(4, VOCAB, "float64"))
    assert repr(out) == "Result(3 roots; state: (4,) float64, (4,) float64)"
