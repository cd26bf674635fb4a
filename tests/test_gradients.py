"""Reverse mode (`model.vjp`): every gradient a pullback returns (parameters, gathered rows,
float fields, context arguments) equals central finite differences of the plain recursion,
in float64 (`conftest.assert_gradients_are_differences`), for every model of the zoo and the
examples, on generated forests and random cotangents on roots and nodes."""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import recjit as rj
from recjit.autodiff import jacobian as jacobian_module
from recjit.codegen_cpu import calls
from dag_rnn import dag_rnn, make_params as dag_rnn_params
from gru import gru, make_params as gru_params
from lstm import lstm, make_params as lstm_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from simple_tree_gru import simple_tree_gru
from tree_attention import make_params as tree_attention_params, tree_attention
from tree_fc import make_params as tree_fc_params, tree_fc
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from conftest import (assert_gradients_are_differences, assert_same_gradients,
                      attentive_child_sum, attentive_params,
                      binary_forests, child_mean, child_sum_mv, child_sum_mv_params,
                      cotangents, gated_child_list, max_pooled, min_pooled, nary_forests,
                      powered_rnn, random_dags, row_major_params, row_major_rnn, scaled_rnn,
                      scaled_rnn_params, seeds, time_aware_rnn, transposed_mv_params,
                      transposed_mv_rnn, tree_convolution, vector_rnn_params, with_time_steps,
                      word_sequences)

HIDDEN, VOCAB = 3, 6
BINARY = binary_forests(VOCAB, max_trees=3, max_leaves=5)
NARY = nary_forests(VOCAB, max_trees=3, max_leaves=7, max_children=6)  # arity 1-6
SEQUENCES = word_sequences(VOCAB, max_length=5, max_sequences=2)
ZOO = {"tree_fc": (tree_fc, tree_fc_params, BINARY),
       "tree_rnn": (tree_rnn, tree_rnn_params, BINARY),
       "tree_lstm": (tree_lstm, tree_lstm_params, BINARY),
       "mv_rnn": (mv_rnn, mv_rnn_params, BINARY),
       "tree_gru": (tree_gru, tree_gru_params, NARY),
       "simple_tree_gru": (simple_tree_gru, tree_gru_params, NARY),
       "child_sum_tree_lstm": (child_sum_tree_lstm, tree_lstm_params, NARY),
       "tree_attention": (tree_attention, tree_attention_params, NARY),
       "lstm": (lstm, lstm_params, SEQUENCES), "gru": (gru, gru_params, SEQUENCES)}
few = settings(max_examples=2)


@pytest.mark.parametrize("name", sorted(ZOO))
@few
@given(data=st.data(), seed=seeds)
def test_a_zoo_models_gradients_are_the_recursions(name, data, seed):
    """Binary trees, trees of any arity, sequences, as each model takes them."""
    model, make, forests = ZOO[name]
    assert_gradients_are_differences(model, data.draw(forests),
                                     make(HIDDEN, VOCAB, "float64", seed % 7), seed)


@pytest.mark.parametrize("schedule", [rj.Schedule(unroll=2), rj.Schedule(unroll=3),
                                      rj.Schedule(dynamic_batching=False)],
                         ids=["unrolled by 2", "unrolled by 3", "a node a batch"])
@few
@given(forest=BINARY, seed=seeds)
def test_the_forward_schedules_batches_do_not_change_the_gradients(schedule, forest, seed):
    """An unrolled forward puts a parent and its children in one batch; the backward still
    sees every parent before its children."""
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", seed % 7)
    out, pullback = tree_lstm.vjp(forest, p, schedule=schedule)
    _, by_height = tree_lstm.vjp(forest, p)
    roots = tuple(cotangents([state.shape for state in out.roots], seed))
    nodes = tuple(cotangents([state.shape for state in out.nodes], seed + 1))
    got, expected = pullback(roots=roots, nodes=nodes), by_height(roots=roots, nodes=nodes)
    for name in ("W_iou", "U_iou", "U_f", "b_iou", "b_f"):
        np.testing.assert_allclose(getattr(got.params, name), getattr(expected.params, name),
                                   rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(np.asarray(got.params.E), np.asarray(expected.params.E),
                               rtol=1e-12, atol=1e-12)


@few
@given(forest=random_dags(HIDDEN, max_nodes=8), seed=seeds)
def test_a_dag_models_gradients_sum_what_every_parent_sends_back(forest, seed):
    """DAG-RNN on DAGs whose nodes have several parents, and a vector field per node."""
    assert_gradients_are_differences(dag_rnn, forest, dag_rnn_params(HIDDEN, dtype="float64",
                                                                      seed=seed % 7), seed)


@few
@given(rows=st.integers(1, 4), cols=st.integers(1, 4), grids=st.integers(1, 2), seed=seeds)
def test_a_dag_models_gradients_on_grids_are_the_recursions(rows, cols, grids, seed):
    """DAG-RNN's own setting: every cell of a grid reads its left and upper neighbours, so an
    inner cell has two parents."""
    cells = rows * cols * grids
    x = np.random.default_rng(seed).normal(size=(cells, HIDDEN))
    forest = rj.Forest.grid_dag(rows, cols, fields={"x": x}, num_grids=grids)
    assert_gradients_are_differences(dag_rnn, forest, dag_rnn_params(HIDDEN, dtype="float64",
                                                                      seed=seed % 7), seed)


CELLS = {"scalar parameter": (scaled_rnn, scaled_rnn_params, binary_forests),
         "powers and division": (powered_rnn, scaled_rnn_params, binary_forests),
         "parameters read transposed": (row_major_rnn, row_major_params, binary_forests),
         "matrix states, transposed": (transposed_mv_rnn, transposed_mv_params, binary_forests),
         "attention, inner products": (attentive_child_sum, attentive_params, nary_forests),
         "the number of children": (child_mean, vector_rnn_params, nary_forests),
         "lists of children's states": (gated_child_list, vector_rnn_params, nary_forests),
         "matrices per child": (child_sum_mv, child_sum_mv_params, nary_forests),
         "a running maximum over the children": (max_pooled, vector_rnn_params, nary_forests),
         "a running minimum, the child first": (min_pooled, vector_rnn_params, nary_forests),
         "a child's place among the children": (tree_convolution, vector_rnn_params,
                                                nary_forests)}


@pytest.mark.parametrize("name", sorted(CELLS))
@few
@given(data=st.data(), seed=seeds)
def test_a_cell_of_the_languages_constructs_gets_the_recursions_gradients(name, data, seed):
    model, make, forests = CELLS[name]
    forest = data.draw(forests(VOCAB, max_trees=2, max_leaves=5))
    assert_gradients_are_differences(model, forest, make(HIDDEN, VOCAB, seed % 7), seed)


def pooled(node, p):
    """A running maximum and a running minimum over the children, from zeros."""
    best = rj.zeros(p.b.shape)
    for child in node.children:
        best = rj.maximum(best, rj.relu(pooled(child, p)))
    low = rj.zeros(p.b.shape)
    for child in node.children:
        low = rj.minimum(pooled(child, p), low)
    x = p.E[node.word] if node.is_leaf else 0
    return p.W @ (x + best + low) + p.b


# Over exactly three children the loops unroll into chains of `maximum` and `minimum`, whose
# pullbacks send a tie's cotangent where NumPy's choice went.
pooled_any, pooled_three = (rj.recursive_model(arity=arity)(pooled) for arity in (None, 3))


@few
@given(seed=seeds)
def test_a_running_maximums_tie_sends_the_cotangent_where_a_chain_of_maximums_does(seed):
    """Small integers make ties everywhere (between children, and with the zeros each
    running value starts from), computed exactly: the gradients of the reduction over any
    number of children are those of the unrolled chain, bit for bit."""
    rng = np.random.default_rng(seed)
    forest = rj.Forest.from_nested([((1, 2, 0), (3, 3, 3), 4), (0, 0, 0), (5, (1, 2, 3), 1)])
    p = rj.Params(E=rng.integers(-2, 3, (VOCAB, HIDDEN)).astype(float),
                  W=rng.integers(-1, 2, (HIDDEN, HIDDEN)).astype(float),
                  b=rng.integers(-1, 2, HIDDEN).astype(float))
    pullbacks = []
    for model in (pooled_any, pooled_three):
        out, pullback = model.vjp(forest, p)
        pullbacks.append(pullback)
    roots = rng.integers(-2, 3, out.roots[0].shape).astype(float)
    nodes = rng.integers(-2, 3, out.nodes[0].shape).astype(float)
    assert_same_gradients(*(pullback(roots=roots, nodes=nodes) for pullback in pullbacks),
                          rtol=0, atol=0)
    assert_same_gradients(pullbacks[0](roots=roots, nodes=nodes),
                          pullbacks[0].interpreted()(roots=roots, nodes=nodes), rtol=0, atol=0)


@few
@given(forest=word_sequences(VOCAB, max_length=5, max_sequences=2), seed=seeds)
def test_a_float_scalar_fields_gradient_is_the_recursions(forest, seed):
    p = rj.Params(E=np.random.default_rng(seed).normal(size=(VOCAB, HIDDEN)),
                  W=np.eye(HIDDEN) / 2, alpha=0.7)
    gradients = assert_gradients_are_differences(time_aware_rnn, with_time_steps(forest, seed),
                                                 p, seed)
    assert isinstance(gradients.params.alpha, float)  # a Python number's gradient is one too


@rj.recursive_model(arity=2)
def kinked(node, p, floor):
    """maximum, minimum, abs, sqrt, log and relu, and a context argument."""
    if node.is_leaf:
        return rj.maximum(p.E[node.word], floor)
    h = kinked(node.left, p, floor) + kinked(node.right, p, floor)
    return rj.minimum(rj.sqrt(rj.abs(h) + 1.0), rj.log(2.0 + rj.relu(p.W @ h))) * floor


def test_the_context_and_kinked_functions_get_the_recursions_gradients():
    rng = np.random.default_rng(3)
    p = rj.Params(E=rng.normal(size=(VOCAB, HIDDEN)), W=rng.normal(size=(HIDDEN, HIDDEN)))
    forest = rj.Forest.from_nested([((0, 1), (2, 3)), (4, (5, 0))])
    gradients = assert_gradients_are_differences(kinked, forest, p, 5,
                                                 context=(rng.normal(size=HIDDEN) * 0.3,))
    assert len(gradients.context) == 1 and "floor" not in vars(gradients.params)


def test_a_table_only_gathered_from_gets_its_rows_gradients_summed():
    forest = rj.Forest.from_nested([((0, 4), (4, 4))])
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", seed=2)
    out, pullback = tree_rnn.vjp(forest, p)
    rows = pullback(roots=np.ones_like(out.roots[0])).params.E
    assert isinstance(rows, rj.RowGrad)
    assert rows.indices.tolist() == [0, 4]
    dense = np.asarray(rows)
    assert dense.shape == p.E.shape and not dense[[1, 2, 3, 5]].any()
    np.testing.assert_array_equal(dense[[0, 4]], rows.values)


def compiled_segment_sums(values, order, bounds):
    """The CPU backend's sums of rows by segment, as a pullback hands them to `RowGrad`."""
    totals = np.empty((bounds.size - 1, values.shape[1]), values.dtype)
    calls.segment_sums(1, values, order, bounds, totals)
    return totals


@pytest.mark.parametrize("segment_sums", [None, compiled_segment_sums],
                         ids=["numpy", "compiled"])
@pytest.mark.parametrize("width", [3, 300], ids=["narrow rows", "wide rows"])
def test_a_row_gradient_sums_each_rows_values_whatever_their_order(width, segment_sums):
    """`RowGrad.summed`, the rows of a table gathered several times, in any order: added
    down the rows by NumPy, or, for wide rows, a row at a time, or by the backend's
    compiled sums by segment."""
    rng = np.random.default_rng(width)
    indices = np.array([5, 2, 5, 9, 2, 5, 0])
    values = rng.normal(size=(indices.size, width))
    rows = rj.RowGrad.summed(indices, values, (10, width), np.float64, segment_sums)
    expected = np.zeros((10, width))
    np.add.at(expected, indices, values)
    assert rows.indices.tolist() == [0, 2, 5, 9]
    np.testing.assert_allclose(rows.to_dense(), expected, rtol=1e-14, atol=1e-14)


def test_row_gradients_of_two_batches_add_up_to_the_rows_of_both():
    """Gradients accumulated over batches, as a training loop sums them."""
    forests = [rj.Forest.from_nested([((0, 4), 4)]), rj.Forest.from_nested([(2, (4, 5))])]
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", seed=3)
    rows = [pullback(roots=np.ones_like(out.roots[0])).params.E
            for out, pullback in (tree_rnn.vjp(forest, p) for forest in forests)]
    total = rows[0] + rows[1]
    assert isinstance(total, rj.RowGrad) and total.indices.tolist() == [0, 2, 4, 5]
    np.testing.assert_allclose(total.to_dense(), rows[0].to_dense() + rows[1].to_dense(),
                               rtol=1e-15)


def test_a_row_gradient_times_a_learning_rate_keeps_its_rows_and_steps_the_table():
    forest = rj.Forest.from_nested([((0, 4), 4)])
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", seed=4)
    out, pullback = tree_rnn.vjp(forest, p)
    rows = pullback(roots=np.ones_like(out.roots[0])).params.E
    scaled = 0.1 * rows
    assert isinstance(scaled, rj.RowGrad) and scaled.indices.tolist() == [0, 4]
    np.testing.assert_array_equal(p.E - scaled, p.E - 0.1 * rows.to_dense())


def test_a_pullback_may_be_called_again_and_a_missing_cotangent_is_zero():
    forest = rj.Forest.from_nested([((0, 1), 2)])
    out, pullback = tree_lstm.vjp(forest, tree_lstm_params(HIDDEN, VOCAB, "float64"))
    h_only = (np.ones_like(out.roots[0]), None)
    first, second = pullback(roots=h_only), pullback(roots=h_only)
    np.testing.assert_array_equal(first.params.U_iou, second.params.U_iou)
    nothing = pullback()
    assert not np.asarray(nothing.params.U_iou).any() and not np.asarray(nothing.params.E).any()


def test_a_pullback_after_a_gathered_row_changed_in_place_gives_the_forwards_gradients():
    """The forward keeps the rows it gathered, and the backward reads those, not the table:
    an optimizer's in-place step on an embedding before the pullback does not reach them."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    out, pullback = tree_lstm.vjp(forest, p)
    roots = (np.ones_like(out.roots[0]), None)
    before = pullback(roots=roots)
    p.E[:3] += 1
    assert_same_gradients(pullback(roots=roots), before, rtol=0, atol=0)


def test_an_interpreted_pullback_after_a_gathered_row_changed_in_place_is_refused():
    """The interpreted adjoint reads the table: it compares the rows the forward kept."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    out, pullback = tree_lstm.vjp(forest, p)
    p.E[1] += 1
    with pytest.raises(rj.InputError, match="parameter 'E' changed in place after vjp, in "
                                            "rows its forest gathers"):
        pullback.interpreted()(roots=(np.ones_like(out.roots[0]), None))


@rj.recursive_model(arity=2)
def matrix_leaves(node, p):
    """A leaf's product multiplies a matrix gathered by its word: kept a column a row."""
    if node.is_leaf:
        return rj.tanh((p.W @ p.M[node.word]) @ p.v)
    return rj.tanh(p.U @ (matrix_leaves(node.left, p) + matrix_leaves(node.right, p)))


def test_a_gathered_matrix_is_kept_as_its_forward_read_it():
    """The compiled pullback reads the matrices the forward packed; the interpreted one
    compares the table with them, so it passes unchanged and refuses a change."""
    rng = np.random.default_rng(11)
    p = rj.Params(W=rng.normal(size=(HIDDEN, HIDDEN)), M=rng.normal(size=(VOCAB, HIDDEN, 4)),
                  v=rng.normal(size=4), U=rng.normal(size=(HIDDEN, HIDDEN)))
    out, pullback = matrix_leaves.vjp(rj.Forest.from_nested([((0, 1), (2, 0)), (3, 4)]), p)
    roots = np.ones_like(out.roots[0])
    before = pullback(roots=roots)
    assert_same_gradients(pullback.interpreted()(roots=roots), before)
    p.M[1] += 1
    assert_same_gradients(pullback(roots=roots), before, rtol=0, atol=0)
    with pytest.raises(rj.InputError, match="parameter 'M' changed in place after vjp"):
        pullback.interpreted()(roots=roots)


RECOMPUTING = rj.Schedule(remat=True)  # the backward recomputes the gathers from the table


def test_a_recomputing_pullback_after_a_gathered_row_changed_in_place_is_refused_naming_it():
    """An optimizer's in-place update between vjp and a pullback would otherwise give a
    gradient mixing the new rows with the forward's states: a gathered table (an embedding,
    perhaps large) is not copied at vjp, its gathered rows are compared."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    out, pullback = tree_lstm.vjp(forest, p, schedule=RECOMPUTING)
    p.E[1] += 1
    with pytest.raises(rj.InputError, match="parameter 'E' changed in place after vjp, in "
                                            "rows its forest gathers"):
        pullback(roots=(np.ones_like(out.roots[0]), None))


def test_a_gathered_tables_rows_are_compared_bit_for_bit_and_only_those_gathered():
    """A NaN the forward read equals itself; a row no node gathers may change; a zero that
    changed sign changed."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    p.E[1, 1], p.E[2, 0] = np.nan, 0.0
    out, pullback = tree_lstm.vjp(forest, p, schedule=RECOMPUTING)
    h_only = (np.ones_like(out.roots[0]), None)
    p.E[VOCAB - 1] += 1
    pullback(roots=h_only)
    p.E[2, 0] = -0.0
    with pytest.raises(rj.InputError, match="parameter 'E' changed in place after vjp"):
        pullback(roots=h_only)


def test_a_pullback_after_a_weight_changed_in_place_gives_the_forwards_gradients():
    """A weight is copied at vjp: an optimizer's in-place step before the pullback does not
    reach the values it reads."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    out, pullback = tree_lstm.vjp(forest, p)
    roots = (np.ones_like(out.roots[0]), None)
    before = pullback(roots=roots)
    p.U_iou += 1
    p.b_f[:] = np.nan
    assert_same_gradients(pullback(roots=roots), before, rtol=0, atol=0)


def test_a_pullback_after_its_parameters_were_set_to_new_arrays_gives_the_forwards_gradients():
    """`p.W = p.W - lr * g`, a NumPy training loop's update, leaves the arrays the forward
    read as they were: the pullback reads those, not the caller's object again."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    out, pullback = tree_lstm.vjp(forest, p)
    roots = (np.ones_like(out.roots[0]), None)
    before = pullback(roots=roots)
    for name in ("U_iou", "E"):
        setattr(p, name, getattr(p, name) - 0.5)
    assert_same_gradients(pullback(roots=roots), before, rtol=0, atol=0)


def test_a_pullback_after_a_context_argument_changed_in_place_gives_the_forwards_gradients():
    """A context array is read as a parameter, and copied at vjp as one."""
    rng = np.random.default_rng(4)
    p = rj.Params(E=rng.normal(size=(VOCAB, HIDDEN)), W=rng.normal(size=(HIDDEN, HIDDEN)))
    floor = rng.normal(size=HIDDEN) * 0.3
    out, pullback = kinked.vjp(rj.Forest.from_nested([((0, 1), 2)]), p, context=(floor,))
    roots = np.ones_like(out.roots[0])
    before = pullback(roots=roots)
    floor *= 2
    after = pullback(roots=roots)
    assert_same_gradients(after, before, rtol=0, atol=0)
    np.testing.assert_array_equal(after.context[0], before.context[0])


def test_vjp_takes_parameters_as_any_object_of_arrays():
    """As `run` does (docs/cell_language.md): a namespace's attributes are the parameters."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", seed=3)
    namespace = SimpleNamespace(**{name: getattr(p, name) for name in p.names()})
    roots = np.ones((1, HIDDEN))
    assert_same_gradients(tree_rnn.vjp(forest, namespace)[1](roots=roots),
                          tree_rnn.vjp(forest, p)[1](roots=roots))


def test_a_pullback_takes_a_change_to_rows_its_forest_does_not_gather():
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64")
    out, pullback = tree_lstm.vjp(forest, p)
    h_only = (np.ones_like(out.roots[0]), None)
    before = pullback(roots=h_only)
    p.E[VOCAB - 1] += 1
    np.testing.assert_array_equal(pullback(roots=h_only).params.U_iou, before.params.U_iou)


@pytest.mark.parametrize("roots, message", [
    ((np.ones((1, HIDDEN)),), r"must be 2 array\(s\), one per state component"),
    ((np.ones((2, HIDDEN)), None), (r"roots, component 0, has shape \(2, 3\); the run's "
                                    r"Result.roots\[0\] has \(1, 3\)")),
    ((np.array([["a"] * HIDDEN]), None), "holds <U1, not numbers"),
    ((np.ma.masked_array(np.ones((1, HIDDEN)), mask=[[0, 1, 0]]), None),
     r"roots, component 0, is a masked array with masked elements")],
    ids=["too few", "wrong shape", "text", "masked"])
def test_a_cotangent_that_does_not_fit_the_states_is_refused_naming_it(roots, message):
    _, pullback = tree_lstm.vjp(rj.Forest.from_nested([(0, 1)]),
                                tree_lstm_params(HIDDEN, VOCAB, "float64"))
    with pytest.raises(rj.InputError, match=message):
        pullback(roots=roots)


def test_a_nan_cotangent_is_refused_naming_where_when_asked_to_check():
    out, pullback = tree_rnn.vjp(rj.Forest.from_nested([(0, 1)]),
                                 tree_rnn_params(HIDDEN, VOCAB, "float64"))
    nodes = np.zeros_like(out.nodes[0])
    nodes[0, 1] = np.nan  # the root's
    with pytest.raises(rj.InputError, match=r"nodes, component 0, holds nan at index \(0, 1\)"):
        pullback(nodes=nodes, check_finite=True)
    assert np.isnan(pullback(nodes=nodes).params.W).any()  # unchecked, NaN flows through


def test_float32_gradients_stay_within_a_thousandth_of_float64s():
    """The forward in float32 with fast math on (docs/fast_math.md), the backward in float32:
    within the tolerance docs/training.md states."""
    forest = rj.Forest.from_nested([((0, 1), (2, (3, 4))), (5, 0)])
    gradients = {}
    for dtype in ("float64", "float32"):
        out, pullback = tree_lstm.vjp(forest, tree_lstm_params(16, VOCAB, dtype, seed=3))
        roots = tuple(np.linspace(-1, 1, state.size).reshape(state.shape) for state in out.roots)
        gradients[dtype] = pullback(roots=roots)
    for name in vars(gradients["float64"].params):
        exact = np.asarray(getattr(gradients["float64"].params, name))
        fast = np.asarray(getattr(gradients["float32"].params, name))
        assert fast.dtype == np.float32
        np.testing.assert_allclose(fast, exact, rtol=1e-3, atol=1e-4, err_msg=name)


def test_the_gradient_of_a_run_on_an_unknown_backend_is_refused_naming_it():
    with pytest.raises(rj.RecJitError, match="backend must be one of .* not 'tpu'"):
        tree_rnn.vjp(rj.Forest.from_nested([(0, 1)]), tree_rnn_params(HIDDEN, VOCAB, "float64"),
                     backend="tpu")


def tree_cotangents(out, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=out.roots[0].shape), rng.normal(size=out.nodes[0].shape)


def trees_own(forest, tree, nodes):
    """`nodes` (a cotangent per node) zero but on the nodes of root `tree`."""
    own = np.zeros(forest.num_nodes, dtype=bool)
    stack = [int(forest.roots[tree])]
    while stack:
        node = stack.pop()
        own[node] = True
        stack.extend(int(child) for child in forest.children(node))
    return nodes * own[:, None]


@few
@given(forest=BINARY, seed=seeds)
def test_per_tree_gradients_are_each_trees_own_pullback_and_sum_to_the_forests(forest, seed):
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", seed % 7)
    out, pullback = tree_rnn.vjp(forest, p)
    roots, nodes = tree_cotangents(out, seed)
    per_tree = pullback(roots=roots, nodes=nodes, per_tree=True)
    whole = pullback(roots=roots, nodes=nodes)
    for name in ("W", "U", "b"):
        got = getattr(per_tree.params, name)
        assert got.shape == (forest.roots.size,) + getattr(p, name).shape
        np.testing.assert_allclose(got.sum(axis=0), getattr(whole.params, name), atol=1e-12)
    assert len(per_tree.params.E) == forest.roots.size
    np.testing.assert_allclose(sum(np.asarray(rows) for rows in per_tree.params.E),
                               np.asarray(whole.params.E), atol=1e-12)
    for tree in range(forest.roots.size):
        alone = np.zeros_like(roots)
        alone[tree] = roots[tree]
        own = pullback(roots=alone, nodes=trees_own(forest, tree, nodes))
        np.testing.assert_allclose(per_tree.params.W[tree], own.params.W, atol=1e-12)
        np.testing.assert_allclose(np.asarray(per_tree.params.E[tree]), np.asarray(own.params.E),
                                   atol=1e-12)


def test_per_tree_gradients_and_jacobians_refuse_a_node_two_trees_share_naming_it():
    forest = rj.Forest.from_edges(3, [(0, 2), (1, 2)], fields={"x": np.ones((3, HIDDEN))})
    p = dag_rnn_params(HIDDEN, dtype="float64")
    out, pullback = dag_rnn.vjp(forest, p)
    with pytest.raises(rj.InputError, match="node 2 belongs to two trees"):
        pullback(roots=np.ones_like(out.roots[0]), per_tree=True)
    with pytest.raises(rj.InputError, match="node 2 belongs to two trees"):
        dag_rnn.jacobian(forest, p, wrt="x")


def listed_twice():
    """(a forest of two trees, the same forest listing its first tree's root twice)."""
    nested = rj.Forest.from_nested([((0, 1), 2), (3, 4)])
    return nested, rj.Forest(nested.child_ptr, nested.child_idx, nested.roots[[0, 1, 0]],
                             nested.fields, nested.kind)


def test_per_tree_gradients_and_jacobians_refuse_a_root_listed_twice_naming_it():
    """Both listings are trees of the forest holding every node of that tree: the per-tree
    gradients would give one of them all, and a jacobian its unit cotangents twice."""
    nested, forest = listed_twice()
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", seed=1)
    out, pullback = tree_rnn.vjp(forest, p)
    listed = f"node {nested.roots[0]} belongs to two trees of the forest \\(it is listed 2 times"
    with pytest.raises(rj.InputError, match=listed):
        pullback(roots=np.ones_like(out.roots[0]), per_tree=True)
    with pytest.raises(rj.InputError, match=listed):
        tree_rnn.jacobian(forest, p, wrt="E")


def test_a_root_listed_twice_takes_both_of_its_cotangents():
    """Whole gradients of a forest listing one tree twice are those of the sum of both
    listings' cotangents given to one listing."""
    nested, twice = listed_twice()
    p = tree_rnn_params(HIDDEN, VOCAB, "float64", seed=2)
    roots = np.random.default_rng(3).normal(size=(3, HIDDEN))
    _, pullback = tree_rnn.vjp(twice, p)
    _, once = tree_rnn.vjp(nested, p)
    assert_same_gradients(pullback(roots=roots), once(roots=roots[:2] + [roots[2], 0 * roots[2]]))


@pytest.mark.parametrize("nodes_at_once", [8192, 25], ids=["one pass", "passes of 2 copies"])
@pytest.mark.parametrize("wrt", ["x", "E"], ids=["a field", "gathered rows"])
def test_a_jacobians_rows_are_the_pullbacks_of_unit_cotangents(wrt, nodes_at_once,
                                                               monkeypatch):
    monkeypatch.setattr(jacobian_module, "JACOBIAN_NODES", nodes_at_once)
    forest = rj.Forest.from_nested([((0, 1), 2), (3, (4, 5))])
    forest.fields["x"] = np.random.default_rng(4).normal(size=(forest.num_nodes, 2))
    p = fielded_params(4)
    jacobian = fielded.jacobian(forest, p, wrt=wrt)
    width = 2 if wrt == "x" else HIDDEN
    assert jacobian.shape == (forest.num_nodes, HIDDEN, width)
    assert_rows_are_unit_pullbacks(jacobian, *fielded.vjp(forest, p), wrt)


def assert_rows_are_unit_pullbacks(jacobian, out, pullback, wrt):
    """`jacobian`'s rows for each element of the roots' first state component, against the
    pullback of that element's unit cotangent: a float field's gradient, or a gathered
    table's row per node."""
    for element in range(out.roots[0].shape[1]):
        unit = np.zeros_like(out.roots[0])
        unit[:, element] = 1
        if wrt in pullback.cell.fields:
            expected = pullback(roots=unit).fields[wrt]
        else:  # the gathered row of each node, as the jacobian gives it per node
            expected = pullback.backward(roots=unit).gathered_by_node(
                wrt, pullback.cell.parameters[wrt][1:])
        np.testing.assert_allclose(jacobian[:, element], expected, atol=1e-12)


@pytest.mark.parametrize("name", ["child_sum_tree_lstm", "tree_gru", "gru"])
@few
@given(data=st.data(), seed=seeds)
def test_each_copy_of_a_jacobians_forest_reads_the_products_the_forward_kept(name, data,
                                                                             seed):
    """Kept a row per internal node, per edge and per distinct word: each copy reads the row
    of the node, edge or word it copies, and the rows are the pullbacks' again."""
    model, make, forests = ZOO[name]
    forest, p = data.draw(forests), make(HIDDEN, VOCAB, "float64", seed % 7)
    jacobian = model.jacobian(forest, p, wrt="E")
    out, pullback = model.vjp(forest, p)
    assert pullback.kept
    for element in range(out.roots[0].shape[1]):
        units = [None] * len(out.roots)
        units[0] = np.zeros_like(out.roots[0])
        units[0][:, element] = 1
        expected = pullback.interpreted().backward(
            roots=tuple(units) if len(units) > 1 else units[0])
        np.testing.assert_allclose(jacobian[:, element],
                                   expected.gathered_by_node("E", p.E.shape[1:]), atol=1e-12)


def test_an_empty_forests_pullback_gives_every_gradient_zero_in_its_usual_form():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    out, pullback = tree_lstm.vjp(rj.Forest.from_nested([]), p)
    gradients = pullback(roots=tuple(np.zeros(state.shape) for state in out.roots))
    assert isinstance(gradients.params.E, rj.RowGrad) and gradients.params.E.indices.size == 0
    for name in ("W_iou", "U_iou", "U_f", "b_iou", "b_f"):
        gradient = getattr(gradients.params, name)
        assert gradient.shape == getattr(p, name).shape and not gradient.any()
    assert pullback(per_tree=True).params.W_iou.shape == (0,) + p.W_iou.shape


def test_an_empty_forests_jacobian_has_no_rows():
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 1)
    jacobian = tree_lstm.jacobian(rj.Forest.from_nested([]), p, wrt="E")
    assert jacobian.shape == (0, HIDDEN, p.E.shape[1])


@rj.recursive_model(arity=2)
def fielded(node, p):
    """A vector field at every node and an embedding at the leaves."""
    if node.is_leaf:
        return rj.tanh(p.E[node.word] + p.W @ node.x)
    return rj.tanh(p.U @ (fielded(node.left, p) + fielded(node.right, p)) + p.W @ node.x)


def fielded_params(seed):
    """`fielded`'s parameters, for a field `x` of 2 numbers a node."""
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(VOCAB, HIDDEN)), W=rng.normal(size=(HIDDEN, 2)),
                     U=rng.normal(size=(HIDDEN, HIDDEN)) / 2)


def test_a_jacobian_refuses_what_the_cell_does_not_read_naming_it():
    forest = rj.Forest.from_nested([(0, 1)])
    with pytest.raises(rj.InputError, match="wrt must name a float field the cell reads or a "
                                            "table it gathers rows from, not 'W'"):
        tree_rnn.jacobian(forest, tree_rnn_params(HIDDEN, VOCAB, "float64"), wrt="W")


@pytest.mark.parametrize("wrt", [["E"], ("E", "x"), None], ids=["a list", "a tuple", "None"])
def test_a_jacobians_wrt_that_is_not_one_name_is_refused_saying_so(wrt):
    forest = rj.Forest.from_nested([(0, 1)])
    with pytest.raises(rj.InputError, match="wrt must be the name of one float field or "
                                            "gathered table, a string"):
        tree_rnn.jacobian(forest, tree_rnn_params(HIDDEN, VOCAB, "float64"), wrt=wrt)


@rj.recursive_model(arity=2)
def tagged(node, p):
    """Two rows of one table at every leaf, by two fields."""
    if node.is_leaf:
        return rj.tanh(p.E[node.word] + 0.5 * p.E[node.tag])
    return rj.tanh(p.U @ (tagged(node.left, p) + tagged(node.right, p)))


@rj.recursive_model(arity=2)
def phrased(node, p):
    """One row of one table at every node: by one field at the leaves, another inside."""
    if node.is_leaf:
        return rj.tanh(p.E[node.word])
    return rj.tanh(p.U @ (phrased(node.left, p) + phrased(node.right, p)) + p.E[node.phrase])


def test_a_jacobian_refuses_a_table_one_case_gathers_by_two_fields_naming_them():
    """A leaf's derivatives with respect to its word's row and its tag's would be added
    into its one row of the jacobian: a number that is neither."""
    forest = rj.Forest.from_nested([((0, 1), 2)])
    forest.fields.update(tag=np.array([3, 3, 4, 3, 1]), phrase=np.array([5, 2, 0, 1, 4]))
    p = fielded_params(2)
    with pytest.raises(rj.InputError, match=r"wrt='E': the cell's leaf case gathers a row of "
                                            r"E by each of fields \['tag', 'word'\]"):
        tagged.jacobian(forest, p, wrt="E")


def test_a_jacobian_takes_a_table_each_case_gathers_by_a_field_of_its_own():
    forest = rj.Forest.from_nested([((0, 1), 2), (3, 4)])
    forest.fields["phrase"] = np.arange(forest.num_nodes) % VOCAB
    p = fielded_params(3)
    jacobian = phrased.jacobian(forest, p, wrt="E")
    assert_rows_are_unit_pullbacks(jacobian, *phrased.vjp(forest, p), "E")
    assert (np.abs(jacobian).max(axis=(1, 2)) > 0).all()  # every node has a row, leaf or not


@pytest.mark.parametrize("output", [True, 2, 1.0, "c"])
def test_a_jacobians_output_that_is_not_a_state_component_is_refused(output):
    """True would be component 1 to Python."""
    forest = rj.Forest.from_nested([(0, 1)])
    with pytest.raises(rj.InputError, match="output must be a state component, 0 to 1"):
        tree_lstm.jacobian(forest, tree_lstm_params(HIDDEN, VOCAB, "float64"), wrt="E",
                           output=output)


def test_a_jacobians_output_may_be_a_numpy_integer():
    forest = rj.Forest.from_nested([(0, 1)])
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", 2)
    np.testing.assert_array_equal(tree_lstm.jacobian(forest, p, wrt="E", output=np.int64(1)),
                                  tree_lstm.jacobian(forest, p, wrt="E", output=1))


def pullback_and_cotangents(model, forest, p, seed):
    out, pullback = model.vjp(forest, p)
    roots = cotangents([state.shape for state in out.roots], seed)
    nodes = cotangents([state.shape for state in out.nodes], seed + 1)
    single = len(roots) == 1
    return pullback, (roots[0] if single else roots), (nodes[0] if single else nodes)


@pytest.mark.parametrize("name", sorted(ZOO))
@few
@given(data=st.data(), seed=seeds)
def test_a_zoo_models_compiled_backward_gives_the_adjoints_gradients(name, data, seed):
    model, make, forests = ZOO[name]
    pullback, roots, nodes = pullback_and_cotangents(
        model, data.draw(forests), make(HIDDEN, VOCAB, "float64", seed % 7), seed)
    assert pullback.compiled is not None
    assert_same_gradients(pullback(roots=roots, nodes=nodes),
                          pullback.interpreted()(roots=roots, nodes=nodes))


@pytest.mark.parametrize("name", sorted(CELLS))
@few
@given(data=st.data(), seed=seeds)
def test_a_cell_of_the_languages_constructs_gets_a_compiled_backward(name, data, seed):
    """Child sums inside a value read per child, inner products, transposed and stacked
    matrices: the constructs whose adjoints nest loops over children and split columns."""
    model, make, forests = CELLS[name]
    forest = data.draw(forests(VOCAB, max_trees=2, max_leaves=5))
    pullback, roots, nodes = pullback_and_cotangents(model, forest, make(HIDDEN, VOCAB,
                                                                         seed % 7), seed)
    assert pullback.compiled is not None
    assert_same_gradients(pullback(roots=roots, nodes=nodes),
                          pullback.interpreted()(roots=roots, nodes=nodes))
