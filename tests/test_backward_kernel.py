"""The compiled backward (`lowering.backward`) beyond the zoo's gradients (which
`test_gradients.py` checks against the adjoint NumPy evaluates, in the process that compiled
them): per-tree gradients, the DAG model's interpreted backward, and the kernel as `explain`
and `kernel_source` show it."""
import numpy as np
from hypothesis import given, settings, strategies as st

import recjit as rj
from dag_rnn import dag_rnn, make_params as dag_rnn_params
from tree_lstm import make_params as tree_lstm_params, tree_lstm

from conftest import random_dags, seeds
from test_gradients import HIDDEN, VOCAB, pullback_and_cotangents

few = settings(max_examples=3)


@few
@given(forest=st.sampled_from([0, 1]).map(
    lambda seed: rj.Forest.random_binary(3, seed=seed, mean_leaves=6, vocab_size=VOCAB)),
    seed=seeds)
def test_per_tree_gradients_from_the_compiled_backward_are_the_adjoints(forest, seed):
    p = tree_lstm_params(HIDDEN, VOCAB, "float64", seed % 7)
    pullback, roots, nodes = pullback_and_cotangents(tree_lstm, forest, p, seed)
    got = pullback(roots=roots, nodes=nodes, per_tree=True)
    expected = pullback.interpreted()(roots=roots, nodes=nodes, per_tree=True)
    for name in ("W_iou", "U_iou", "U_f", "b_iou", "b_f"):
        np.testing.assert_allclose(getattr(got.params, name), getattr(expected.params, name),
                                   rtol=1e-10, atol=1e-12, err_msg=name)
    for own, theirs in zip(got.params.E, expected.params.E):
        np.testing.assert_allclose(np.asarray(own), np.asarray(theirs), rtol=1e-10, atol=1e-12)


@settings(max_examples=1)
@given(forest=random_dags(HIDDEN, max_nodes=8))
def test_a_dag_models_backward_is_interpreted_and_explain_says_so(forest):
    """Two parents in one batch would add to a shared child's cotangent at once."""
    p = dag_rnn_params(HIDDEN, dtype="float64", seed=0)
    _, pullback = dag_rnn.vjp(forest, p)
    assert pullback.compiled is None
    assert "the backward is interpreted" in dag_rnn.explain(forest, p, grad=True)


def test_kernel_source_with_grad_prints_the_backward_kernel_of_the_last_vjp():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    tree_lstm.vjp(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0))
    source = tree_lstm.kernel_source(grad=True)
    assert "def tree_lstm_backward(" in source
    assert "cot_0[child0, e] = cot_0[child0, e] +" in source.replace("(", "").replace(")", "")


def test_explain_with_grad_prints_the_backward_ilir_roots_first():
    forest = rj.Forest.random_binary(2, seed=0, mean_leaves=5, vocab_size=VOCAB)
    text = tree_lstm.explain(forest, tree_lstm_params(HIDDEN, VOCAB, "float64", 0), grad=True)
    backward = text[text.index("== backward ILIR (cpu) =="):]
    assert "for b in [0, (num_batches - 1)):" in backward
    assert "grad_U_iou" in backward and "batch_x2_U_iou_T" in backward
    assert "the backward is one call of the numba parallel kernel" in backward
