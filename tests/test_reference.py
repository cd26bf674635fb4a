"""`reference`, the naive recursion that every compiled result is checked against: it checks
what `run` checks before it runs, and each node's cell runs once with the parameters it is
given."""
import numpy as np
import pytest

import recjit as rj
from recjit.reference import run_reference

FOREST = rj.Forest.from_nested([(0, 1)])
P = rj.Params(E=np.ones((2, 1)))


@rj.recursive_model(arity=2)
def summed(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return summed(node.left, p) + summed(node.right, p)


@pytest.mark.parametrize("word", [-2, 5], ids=["negative", "past the table"])
def test_a_word_outside_the_table_is_refused_naming_the_node_as_run_refuses_it(word):
    forest = rj.Forest.from_nested([(0, word)])
    for method in (summed.run, summed.reference):
        with pytest.raises(rj.InputError, match=f"node 2: field 'word' = {word} is outside the 2 "
                                                "rows of parameter 'E'"):
            method(forest, P)


TENFOLD = rj.Params(E=10 * np.ones((2, 1)))


@rj.recursive_model(arity=2)
def with_other_parameters(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return with_other_parameters(node.left, TENFOLD) + with_other_parameters(node.right, p)


def test_a_cell_run_refuses_is_refused_by_the_reference_with_the_same_error():
    errors = []
    for method in (with_other_parameters.run, with_other_parameters.reference):
        with pytest.raises(rj.UnsupportedError, match="must pass the parameters") as error:
            method(FOREST, P)
        errors.append(str(error.value))
    assert errors[0] == errors[1]


def test_a_child_called_with_other_parameters_is_computed_as_a_plain_call_computes_it():
    """The recursion's memo of child states holds the states for the parameters it runs with;
    a call with others is computed as the plain recursion would."""
    states = run_reference(with_other_parameters, FOREST, P)
    assert states[0].tolist() == [11.0]
    assert with_other_parameters(rj.NodeView(FOREST, 0), P).tolist() == [11.0]


def test_an_empty_forest_gives_empty_states_of_the_cells_shapes_without_compiling():
    @rj.recursive_model(arity=2)
    def never_run(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return never_run(node.left, p) - never_run(node.right, p)

    result = never_run.reference(rj.Forest.from_nested([]), P)
    assert [state.shape for state in result.nodes] == [(0, 1)]
    with pytest.raises(rj.RecJitError, match="no cpu kernel has been compiled yet"):
        never_run.kernel_source("cpu")
