"""Context arguments: a cell's arguments after `p`, handed down unchanged to every recursive
call (docs/design.md §1). `run(..., context=...)` and `reference(..., context=...)` take their
values; the kernel reads them as parameters."""
import numpy as np
import pytest
from hypothesis import given, settings

import recjit as rj

from conftest import assert_same_result, binary_forests, nary_forests, seeds

VOCAB = 12
HIDDEN = 4


@rj.recursive_model(arity=2)
def biased_rnn(node, p, bias, mix):
    if node.is_leaf:
        return rj.tanh(p.E[node.word] + bias)
    children = biased_rnn(node.left, p, bias, mix) + biased_rnn(node.right, p, bias, mix)
    return rj.tanh(p.W @ children + mix @ children + bias)


@rj.recursive_model(arity=None)
def gated_sum(node, p, gate):
    if node.is_leaf:
        return rj.tanh(p.E[node.word])
    total = sum(gated_sum(c, p, gate) for c in node.children)
    return rj.tanh(p.W @ total) * rj.sigmoid(gate)


@rj.recursive_model(arity=2)
def doubled(node, p, bias):
    if node.is_leaf:
        return rj.tanh(p.E[node.word] + bias)
    return rj.tanh(p.W @ (doubled(node.left, p, bias * 2) + doubled(node.right, p, bias)))


@rj.recursive_model(arity=2)
def swapped(node, p, a, b):
    if node.is_leaf:
        return rj.tanh(p.E[node.word] + a - b)
    return rj.tanh(p.W @ (swapped(node.left, p, b, a) + swapped(node.right, p, a, b)))


DEFAULT_BIAS = np.ones(HIDDEN)


@rj.recursive_model(arity=2)
def scaled_by_default(node, p, scale=0.5, bias=DEFAULT_BIAS):
    if node.is_leaf:
        return rj.tanh(p.E[node.word] * scale + bias)
    children = scaled_by_default(node.left, p, scale, bias)
    return rj.tanh(p.W @ (children + scaled_by_default(node.right, p, scale, bias)) * scale)


@rj.recursive_model(arity=None)
def passes_the_context_by_keyword(node, p, gate, scale=0.5):
    total = rj.tanh(p.E[node.word]) * scale if node.is_leaf else rj.zeros(HIDDEN)
    for child in node.children:
        total = total + passes_the_context_by_keyword(child, p, scale=scale, gate=gate)
    return rj.tanh(p.W @ total) * rj.sigmoid(gate)


def params(seed):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(VOCAB, HIDDEN)),
                     W=rng.normal(size=(HIDDEN, HIDDEN)) / HIDDEN)


def vectors(seed, *shapes):
    rng = np.random.default_rng(seed + 1)
    return tuple(rng.normal(size=shape) for shape in shapes)


@given(forest=binary_forests(VOCAB, max_trees=6, max_leaves=10), seed=seeds)
def test_vector_and_matrix_context_arguments_equal_the_reference(forest, seed):
    p, context = params(seed), vectors(seed, (HIDDEN,), (HIDDEN, HIDDEN))
    assert_same_result(biased_rnn.run(forest, p, context=context),
                       biased_rnn.reference(forest, p, context=context))


@given(forest=nary_forests(VOCAB, max_trees=4, max_leaves=8), seed=seeds)
def test_a_context_argument_passed_through_a_child_sum(forest, seed):
    p, context = params(seed), vectors(seed, (HIDDEN,))
    assert_same_result(gated_sum.run(forest, p, context=context),
                       gated_sum.reference(forest, p, context=context))


@settings(max_examples=3)
@given(forest=binary_forests(VOCAB, max_trees=3, max_leaves=5), seed=seeds)
def test_context_arguments_reach_the_cuda_kernel(forest, seed):
    p, context = params(seed), vectors(seed, (HIDDEN,), (HIDDEN, HIDDEN))
    assert_same_result(biased_rnn.run(forest, p, backend="cuda", context=context),
                       biased_rnn.reference(forest, p, context=context))


def test_the_reference_is_the_plain_function_called_with_the_context():
    forest = rj.Forest.from_nested([((1, 2), 3)])
    p, (bias, mix) = params(0), vectors(0, (HIDDEN,), (HIDDEN, HIDDEN))
    root = biased_rnn(rj.NodeView(forest, int(forest.roots[0])), p, bias, mix)
    np.testing.assert_array_equal(biased_rnn.reference(forest, p, context=(bias, mix)).roots[0][0],
                                  root)


def test_a_missing_context_value_names_the_arguments():
    forest = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.InputError, match=r"takes 2 context argument\(s\) after the "
                                            r"parameters \(bias, mix\); context= gave 1"):
        biased_rnn.run(forest, params(0), context=vectors(0, (HIDDEN,)))


@pytest.mark.parametrize("context", [0.5, np.array([0.5]), {"gate": 0.5}],
                         ids=["a number", "an array", "a dict"])
def test_a_context_that_is_not_a_tuple_is_refused_showing_the_tuple(context):
    """A number alone was iterated over (Python's TypeError); an array, element by element."""
    for method in (gated_sum.run, gated_sum.reference):
        with pytest.raises(rj.InputError, match=r"context= takes the cell's arguments after p "
                                                r"as a tuple, context=\(value,\) for one"):
            method(rj.Forest.from_nested([(1, 2)]), params(3), context=context)


def test_a_context_argument_named_like_a_parameter_is_refused():
    forest = rj.Forest.from_nested([(1, 2)])
    p = params(0)
    p_with_gate = rj.Params(E=p.E, W=p.W, gate=np.zeros(HIDDEN))
    with pytest.raises(rj.InputError, match="context argument 'gate' has the name of a "
                                            "parameter"):
        gated_sum.run(forest, p_with_gate, context=(np.zeros(HIDDEN),))


def test_a_context_computed_in_the_node_breaks_p2():
    forest = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.RecursionPropertyError, match="P.2"):
        doubled.run(forest, params(0), context=vectors(0, (HIDDEN,)))


def test_a_recursive_call_that_reorders_the_context_is_refused_at_its_line():
    forest = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.UnsupportedError, match=r"test_context.py:\d+: a recursive call must "
                                                  r"pass the parameters and the context on "
                                                  r"unchanged: cell\(child, p, a, b\)"):
        swapped.run(forest, params(0), context=vectors(0, (HIDDEN,), (HIDDEN,)))


def test_a_context_argument_of_integers_is_named_as_a_context_argument():
    with pytest.raises(rj.InputError, match="context argument 'bias' has dtype int64"):
        biased_rnn.run(rj.Forest.from_nested([(1, 2)]), params(0),
                       context=(np.ones(HIDDEN, dtype=np.int64), np.eye(HIDDEN)))


def test_a_scalar_context_argument_equals_the_reference():
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5)])
    assert_same_result(gated_sum.run(forest, params(3), context=(0.5,)),
                       gated_sum.reference(forest, params(3), context=(0.5,)))


def test_a_python_number_context_argument_takes_the_parameters_dtype():
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5)])
    double = params(4)
    single = rj.Params(E=double.E.astype(np.float32), W=double.W.astype(np.float32))
    result = gated_sum.run(forest, single, context=(0.5,))
    expected = gated_sum.reference(forest, single, context=(0.5,))
    assert result.roots[0].dtype == expected.roots[0].dtype == np.float32
    assert_same_result(result, expected, rtol=1e-5)


@pytest.mark.parametrize("context", [(), (2.0,), (2.0, np.zeros(HIDDEN))],
                         ids=["both defaults", "one default", "no default"])
def test_context_arguments_left_out_take_the_cells_defaults(context):
    """As a plain call of the cell does: `run(forest, p)` runs `scale=0.5`."""
    forest = rj.Forest.from_nested([((1, 2), 3), (4, 5)])
    p = params(5)
    result = scaled_by_default.run(forest, p, context=context)
    assert_same_result(result, scaled_by_default.reference(forest, p, context=context))
    root = scaled_by_default(rj.NodeView(forest, int(forest.roots[0])), p, *context)
    np.testing.assert_allclose(result.roots[0][0], root, rtol=1e-12)


@given(forest=nary_forests(VOCAB, max_trees=4, max_leaves=8), seed=seeds)
def test_a_recursive_call_may_pass_the_context_by_keyword(forest, seed):
    p = params(seed)
    for context in ((0.3,), (0.3, 2.0)):
        assert_same_result(passes_the_context_by_keyword.run(forest, p, context=context),
                           passes_the_context_by_keyword.reference(forest, p, context=context))
