"""Every model of docs/design.md §7 (and every other example), compiled for the CPU, equals its
naive recursion on generated structures of its kind and random parameters (within 1e-5
relative, float64)."""
import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import recjit as rj
from dag_rnn import dag_rnn, grids, make_params as dag_rnn_params
from gru import gru, make_params as gru_params
from lstm import lstm, make_params as lstm_params
from mv_rnn import make_params as mv_rnn_params, mv_rnn
from simple_tree_gru import simple_tree_gru
from tree_attention import make_params as tree_attention_params, tree_attention
from tree_fc import make_params as tree_fc_params, tree_fc
from tree_gru import make_params as tree_gru_params, tree_gru
from tree_lstm import child_sum_tree_lstm, make_params as tree_lstm_params, tree_lstm

from recjit.codegen_cpu.runtime import panel_width

from conftest import (assert_same_result, binary_forests, nary_forests, random_dags, scales,
                      seeds, word_sequences)

VOCAB = 50
HIDDEN = 6


def scaled(params, scale):
    return rj.Params(**{name: getattr(params, name) * scale for name in params.names()})


def check(model, forest, p):
    assert_same_result(model.run(forest, p), model.reference(forest, p))


@given(st.integers(0, 7), st.integers(1, 3), seeds, scales)
def test_tree_fc_equals_reference_on_perfect_trees(height, num_trees, seed, scale):
    forest = rj.Forest.perfect(height, num_trees=num_trees, seed=seed, vocab_size=VOCAB)
    check(tree_fc, forest, scaled(tree_fc_params(HIDDEN, VOCAB, "float64", seed), scale))


@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 2), seeds, scales)
def test_dag_rnn_equals_reference_on_grids(rows, cols, num_grids, seed, scale):
    forest = grids(num_grids, HIDDEN, rows, cols, dtype="float64", seed=seed)
    check(dag_rnn, forest, scaled(dag_rnn_params(HIDDEN, dtype="float64", seed=seed), scale))


@given(random_dags(features=HIDDEN), seeds, scales)
def test_dag_rnn_equals_reference_on_random_dags_with_shared_nodes(forest, seed, scale):
    check(dag_rnn, forest, scaled(dag_rnn_params(HIDDEN, dtype="float64", seed=seed), scale))


@given(nary_forests(VOCAB), seeds, scales)
def test_tree_gru_equals_reference_on_trees_with_0_to_6_children(forest, seed, scale):
    check(tree_gru, forest, scaled(tree_gru_params(HIDDEN, VOCAB, "float64", seed), scale))


@given(nary_forests(VOCAB), seeds, scales)
def test_tree_attention_equals_reference_on_trees_with_0_to_6_children(forest, seed, scale):
    p = scaled(tree_attention_params(HIDDEN, VOCAB, "float64", seed), scale)
    check(tree_attention, forest, p)


@given(nary_forests(VOCAB), seeds, scales)
def test_simple_tree_gru_equals_reference_on_trees_with_0_to_6_children(forest, seed, scale):
    p = scaled(tree_gru_params(HIDDEN, VOCAB, "float64", seed), scale)
    check(simple_tree_gru, forest, p)


@given(nary_forests(VOCAB), seeds, scales)
def test_child_sum_tree_lstm_equals_reference_on_trees_with_0_to_6_children(forest, seed,
                                                                            scale):
    p = scaled(tree_lstm_params(HIDDEN, VOCAB, "float64", seed), scale)
    check(child_sum_tree_lstm, forest, p)


@given(binary_forests(VOCAB, max_trees=10), seeds, scales)
def test_mv_rnn_with_matrix_states_equals_reference(forest, seed, scale):
    check(mv_rnn, forest, scaled(mv_rnn_params(HIDDEN, VOCAB, "float64", seed), scale))


@given(word_sequences(VOCAB), seeds, scales)
def test_lstm_equals_reference_on_sequences_of_length_1_to_300(forest, seed, scale):
    check(lstm, forest, scaled(lstm_params(HIDDEN, VOCAB, "float64", seed), scale))


@given(word_sequences(VOCAB), seeds, scales)
def test_gru_equals_reference_on_sequences_of_length_1_to_300(forest, seed, scale):
    check(gru, forest, scaled(gru_params(HIDDEN, VOCAB, "float64", seed), scale))


PLAIN = rj.Schedule(refactor=False)


PACKED = rj.Schedule(pack_from_nodes=0)
PANEL_HIDDEN = panel_width(4) + 4  # a float32 panel's rows and some left over
PACKED_CASES = {
    "tree_lstm": (lambda seed: rj.Forest.random_binary(3, seed=seed, vocab_size=VOCAB),
                  lambda: tree_lstm_params(PANEL_HIDDEN, VOCAB, "float32")),
    "mv_rnn": (lambda seed: rj.Forest.random_binary(3, seed=seed, vocab_size=VOCAB),
               lambda: mv_rnn_params(PANEL_HIDDEN, VOCAB, "float32")),
    "dag_rnn": (lambda seed: grids(2, PANEL_HIDDEN, 3, 4, dtype="float32", seed=seed),
                lambda: dag_rnn_params(PANEL_HIDDEN, dtype="float32")),
    "gru": (lambda seed: rj.Forest.from_sequences(
                [5, 9], fields={"word": np.random.default_rng(seed).integers(0, VOCAB, 14)}),
            lambda: gru_params(PANEL_HIDDEN, VOCAB, "float32"))}
MODELS = {"tree_lstm": tree_lstm, "mv_rnn": mv_rnn, "dag_rnn": dag_rnn, "gru": gru}


@pytest.mark.parametrize("name", sorted(PACKED_CASES))
@settings(max_examples=5)
@given(seed=seeds)
def test_weights_packed_into_panels_give_the_reference_in_float32(name, seed):
    """The outer-product path on every kind of product: hoisted distinct leaves (TreeLSTM),
    matrix states (MV-RNN), field rows read in place (DAG-RNN), the column blocks of a
    refactored weight (GRU)."""
    make_forest, make_params = PACKED_CASES[name]
    model, forest, p = MODELS[name], make_forest(seed), make_params()
    assert "weight_panels(" in model.kernel_source("cpu", forest, p)
    assert_same_result(model.run(forest, p, schedule=PACKED), model.reference(forest, p),
                       rtol=2e-4, atol=2e-5)


def test_a_node_with_a_matrix_state_counts_once_per_column_toward_packing_the_weights():
    """MV-RNN's products multiply a node's matrix a column a row: at H=16 its kernels pack
    from a 16th of `pack_from_nodes` nodes; a vector model's count each node once."""
    forest = rj.Forest.random_binary(1, seed=0, vocab_size=VOCAB)
    matrices, vectors = mv_rnn_params(16, VOCAB, "float32"), tree_lstm_params(8, VOCAB)
    assert "pack = num_nodes * 16 >= 64" in mv_rnn.kernel_source("cpu", forest, matrices)
    assert "in forests of at least 4 nodes (each a product's 16 rows" in mv_rnn.explain(
        forest, matrices)
    assert "pack = num_nodes >= 64" in tree_lstm.kernel_source("cpu", forest, vectors)


def barriers_per_batch(model, forest, p, schedule=PLAIN):
    text = model.explain(forest, p, schedule=schedule, file=io.StringIO())
    return int(text.rsplit("barriers per batch: ", 1)[1].split()[0])


def test_tree_gru_multiplies_its_reset_gated_sum_in_a_second_phase():
    forest = rj.Forest.from_nested([((1, 2, 3), 4)])
    p = tree_gru_params(HIDDEN, VOCAB, "float64")
    assert barriers_per_batch(tree_gru, forest, p) == 5
    assert "phase 2 multiplies values computed in phase 1" in tree_gru.explain(
        forest, p, file=io.StringIO())


def test_gru_steps_have_two_phases_and_lstm_steps_one():
    """A phase is pack, barrier, products, barrier; then the elementwise ops and the barrier
    before the next step."""
    forest = rj.Forest.from_sequences([3], fields={"word": [1, 2, 3]})
    assert barriers_per_batch(gru, forest, gru_params(HIDDEN, VOCAB, "float64")) == 5
    assert barriers_per_batch(lstm, forest, lstm_params(HIDDEN, VOCAB, "float64")) == 3


def test_refactoring_removes_the_pack_barrier_of_every_step():
    """The products of the previous step's state move to the end of that step: no pack."""
    forest = rj.Forest.from_sequences([3], fields={"word": [1, 2, 3]})
    refactored = rj.Schedule(refactor=True)
    assert barriers_per_batch(gru, forest, gru_params(HIDDEN, VOCAB, "float64"),
                              refactored) == 4
    assert barriers_per_batch(lstm, forest, lstm_params(HIDDEN, VOCAB, "float64"),
                              refactored) == 2


def test_a_dag_node_reached_by_k_parents_is_computed_once(monkeypatch):
    """Node 5 feeds four parents. The linearized forest gives every node exactly one slot in
    one batch (the kernel's only evaluation of it), and the reference calls the cell once per
    node."""
    edges = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (2, 5), (3, 5), (4, 5), (4, 6)]
    forest = rj.Forest.from_edges(7, edges, fields={"x": np.ones((7, HIDDEN))})
    linearized = dag_rnn.linearize(forest)
    assert linearized.batch_begin[-1] == forest.num_nodes
    assert sorted(linearized.old_of_new.tolist()) == list(range(forest.num_nodes))
    calls = []
    cell = dag_rnn.function
    dag_rnn.analyse()  # the model reads its cell's source once, before the counting wrapper
    monkeypatch.setattr(dag_rnn, "function", lambda node, p: calls.append(node.index)
                        or cell(node, p))
    p = dag_rnn_params(HIDDEN, dtype="float64")
    reference = dag_rnn.reference(forest, p)
    assert sorted(calls) == list(range(forest.num_nodes))
    assert_same_result(dag_rnn.run(forest, p), reference)
