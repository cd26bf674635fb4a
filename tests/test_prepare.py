"""`model.prepare`: everything `run` does before its kernel, done ahead (a data loader's job),
so that `run(prepared, p)` goes straight to the kernel and still equals the reference; a
forest prepared for other parameters, another backend or another model is refused."""
import pickle

import numpy as np
import pytest
from hypothesis import given, settings

import recjit as rj
from tree_lstm import make_params, tree_lstm
from tree_rnn import make_params as tree_rnn_params, tree_rnn

from conftest import assert_same_result, binary_forests, seeds

VOCAB = 10
HIDDEN = 3


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@settings(max_examples=5)
@given(forest=binary_forests(VOCAB, max_trees=3, max_leaves=6), seed=seeds)
def test_a_prepared_forest_runs_to_the_reference_result(backend, forest, seed):
    p = make_params(HIDDEN, VOCAB, "float64", seed)
    prepared = tree_lstm.prepare(forest, p, backend=backend)
    assert_same_result(tree_lstm.run(prepared, p, backend=backend),
                       tree_lstm.reference(forest, p))


def test_a_prepared_run_neither_linearizes_nor_checks_indices_again(monkeypatch):
    forest, p = rj.Forest.from_nested([((1, 2), 3)]), make_params(HIDDEN, VOCAB, "float64")
    prepared, reference = tree_lstm.prepare(forest, p), tree_lstm.reference(forest, p)

    def refuse(*_):
        raise AssertionError("done at run time")

    monkeypatch.setattr(type(tree_lstm), "linearize", refuse)
    monkeypatch.setattr(type(tree_lstm), "check_gathers", staticmethod(refuse))
    assert_same_result(tree_lstm.run(prepared, p), reference)


def test_preparing_checks_the_gathered_indices():
    with pytest.raises(rj.InputError, match="field 'word' = 99"):
        tree_lstm.prepare(rj.Forest.from_nested([(1, 99)]), make_params(HIDDEN, VOCAB))


def test_a_forest_prepared_for_other_parameter_shapes_is_refused():
    forest = rj.Forest.from_nested([(1, 2)])
    prepared = tree_lstm.prepare(forest, make_params(HIDDEN, VOCAB, "float64"))
    with pytest.raises(rj.InputError, match="prepared for another backend, schedule or "
                                            "parameter shapes"):
        tree_lstm.run(prepared, make_params(HIDDEN + 1, VOCAB, "float64"))


def test_a_forest_prepared_for_another_backend_is_refused():
    forest, p = rj.Forest.from_nested([(1, 2)]), make_params(HIDDEN, VOCAB, "float64")
    prepared = tree_lstm.prepare(forest, p, backend="cuda")
    with pytest.raises(rj.InputError, match="backend='cpu'"):
        tree_lstm.run(prepared, p)


def test_a_forest_prepared_by_another_model_is_refused():
    forest = rj.Forest.from_nested([(1, 2)])
    prepared = tree_rnn.prepare(forest, tree_rnn_params(HIDDEN, VOCAB, "float64"))
    with pytest.raises(rj.InputError, match="prepared by tree_rnn, not tree_lstm"):
        tree_lstm.run(prepared, make_params(HIDDEN, VOCAB, "float64"))


def test_check_finite_applies_to_a_prepared_run():
    forest, p = rj.Forest.from_nested([(1, 2)]), make_params(HIDDEN, VOCAB, "float64")
    prepared = tree_lstm.prepare(forest, p)
    p.U_f[1, 2] = np.inf
    with pytest.raises(rj.InputError, match="parameter 'U_f' holds inf"):
        tree_lstm.run(prepared, p, check_finite=True)


def test_an_empty_prepared_forest_runs_to_an_empty_result():
    p = make_params(HIDDEN, VOCAB, "float64")
    result = tree_lstm.run(tree_lstm.prepare(rj.Forest.from_nested([]), p), p)
    assert [state.shape for state in result.nodes] == [(0, HIDDEN), (0, HIDDEN)]


@pytest.mark.parametrize("call", ["vjp", "reference", "prepare"])
def test_a_prepared_forest_given_to_another_method_is_refused_saying_what_to_pass(call):
    forest, p = rj.Forest.from_nested([(1, 2)]), make_params(HIDDEN, VOCAB, "float64")
    prepared = tree_lstm.prepare(forest, p)
    with pytest.raises(rj.InputError, match=r"for run\(\) alone: pass the forest itself here "
                                            r"\(prepared.forest\)"):
        getattr(tree_lstm, call)(prepared, p)


def test_pickling_a_prepared_forest_is_refused_saying_what_to_send():
    """A DataLoader's worker process sends its batches back pickled."""
    forest, p = rj.Forest.from_nested([(1, 2)]), make_params(HIDDEN, VOCAB, "float64")
    with pytest.raises(rj.RecJitError, match=r"cannot be pickled: .* send its forest "
                                             r"\(prepared.forest\)"):
        pickle.dumps(tree_lstm.prepare(forest, p))
