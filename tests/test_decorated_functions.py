"""A cell compiles what the plain recursion calls: a decorator's wrapper rather than the function
it wraps (`functools.wraps` points there), a bound method with its object, positional-only
parameters in their places; what it cannot compile is refused at its line."""
import functools

import numpy as np
import pytest

import recjit as rj

from conftest import assert_same_result

FOREST = rj.Forest.from_nested([((0, 1), 1)])
P = rj.Params(E=np.array([[1.0, -2.0], [0.5, 3.0]]), W=np.array([[0.5, 1.0], [-1.0, 0.25]]))


def assert_run_is_reference(model):
    assert_same_result(model.run(FOREST, P), model.reference(FOREST, P))


def doubled_any(function):
    @functools.wraps(function)
    def wrapper(*args):
        return 2.0 * function(*args)
    return wrapper


def doubled(function):
    @functools.wraps(function)
    def wrapper(weight, h):
        return 2.0 * function(weight, h)
    return wrapper


@doubled_any
def project_any(weight, h):
    return weight @ h


@doubled
def project(weight, h):
    return weight @ h


@rj.recursive_model(arity=2)
def through_a_wrapper_of_any_arguments(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return project_any(p.W, through_a_wrapper_of_any_arguments(node.left, p)) + \
        through_a_wrapper_of_any_arguments(node.right, p)


@rj.recursive_model(arity=2)
def through_a_wrapper(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return project(p.W, through_a_wrapper(node.left, p)) + through_a_wrapper(node.right, p)


def test_a_wrapped_helper_whose_wrapper_takes_any_arguments_is_refused_naming_the_wrapper():
    with pytest.raises(rj.UnsupportedError, match=r"helper project_any \(a decorator's "
                                                  r"`wrapper`, .*\) takes \*args") as error:
        through_a_wrapper_of_any_arguments.run(FOREST, P)
    assert "project_any(p.W" in error.value.expression


def test_a_wrapped_helper_compiles_as_its_wrapper():
    assert_run_is_reference(through_a_wrapper)


def halved_cell(cell):
    @functools.wraps(cell)
    def wrapper(node, p):
        return 0.5 * cell(node, p)
    return wrapper


@rj.recursive_model(arity=2)
@halved_cell
def wrapped_cell(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return rj.tanh(wrapped_cell(node.left, p) + wrapped_cell(node.right, p))


def test_a_wrapped_cell_compiles_as_its_wrapper():
    assert_run_is_reference(wrapped_cell)


def test_a_cell_that_is_not_a_plain_function_is_refused_saying_what_it_wraps():
    def cached(node, p):
        return p.E[node.word] if node.is_leaf else cached(node.left, p)

    with pytest.raises(rj.UnsupportedError, match="_lru_cache_wrapper wrapped around .*cached, "
                                                  "not a plain function"):
        rj.recursive_model(arity=2)(functools.lru_cache(maxsize=None)(cached))


def test_a_lambda_cell_is_refused_saying_it_takes_a_def():
    """Even where the lambda's line is no statement of its own, as in a dict's entries."""
    cells = {
        "leaf": rj.recursive_model(arity=2)(lambda node, p: p.E[node.word]),
    }
    with pytest.raises(rj.UnsupportedError, match="not defined by a plain `def` statement"):
        cells["leaf"].run(rj.Forest.from_nested([(0, 1)]), rj.Params(E=np.ones((2, 3))))


def scale_positionally(h, /, factor=3.0):
    return factor * h


@rj.recursive_model(arity=2)
def through_positional_only(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return scale_positionally(through_positional_only(node.left, p)) + \
        scale_positionally(through_positional_only(node.right, p), 0.5)


def test_a_helpers_positional_only_parameters_take_their_arguments():
    assert_run_is_reference(through_positional_only)


class Mixer:
    def mix(self, h, g, weight=1.0):
        return h + weight * g


MIXER = Mixer()


@rj.recursive_model(arity=2)
def through_a_method(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return MIXER.mix(through_a_method(node.left, p), through_a_method(node.right, p), -2.0)


def test_a_methods_arguments_follow_its_object():
    assert_run_is_reference(through_a_method)
