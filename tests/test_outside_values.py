"""Values a cell reads from outside its body. A kernel computes with the values its build read;
the plain recursion reads them live. So a run re-reads every value by the path it was read by
(a name, attributes, constant items, a helper's defaults, a method's object) and builds again
where one changed, or refuses a read it could not check at every run."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

import recjit as rj

from conftest import assert_gradients_are_differences, assert_same_result

FOREST = rj.Forest.from_nested([(0, (1, 0))])
P = rj.Params(E=np.array([[0.25, -0.5], [1.0, 0.75]]))


def assert_run_is_reference(model, forest=FOREST, p=P):
    assert_same_result(model.run(forest, p), model.reference(forest, p))


CONFIGS = [SimpleNamespace(scale=1.0)]


@rj.recursive_model
def scaled_by_an_item(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return CONFIGS[0].scale * (scaled_by_an_item(node.left, p) + scaled_by_an_item(node.right, p))


def test_an_attribute_of_a_list_item_changed_in_place_is_read_again():
    try:
        for scale in (1.0, 3.0):
            CONFIGS[0].scale = scale
            assert_run_is_reference(scaled_by_an_item)
    finally:
        CONFIGS[0].scale = 1.0


def test_a_list_item_bound_to_another_object_is_read_again():
    try:
        for config in (SimpleNamespace(scale=1.0), SimpleNamespace(scale=-2.0)):
            CONFIGS[0] = config
            assert_run_is_reference(scaled_by_an_item)
    finally:
        CONFIGS[0] = SimpleNamespace(scale=1.0)


HYPER = {"scale": 1.0, "inner": SimpleNamespace(shift=0.0)}


@rj.recursive_model
def scaled_by_a_key(node, p):
    if node.is_leaf:
        return p.E[node.word] + HYPER["inner"].shift
    return HYPER["scale"] * (scaled_by_a_key(node.left, p) + scaled_by_a_key(node.right, p))


def test_a_dicts_item_changed_in_place_is_read_again():
    try:
        for scale in (1.0, -2.5):
            HYPER["scale"] = scale
            assert_run_is_reference(scaled_by_a_key)
    finally:
        HYPER["scale"] = 1.0


def test_an_attribute_of_a_dicts_item_changed_in_place_is_read_again():
    try:
        for shift in (0.0, 0.75):
            HYPER["inner"].shift = shift
            assert_run_is_reference(scaled_by_a_key)
    finally:
        HYPER["inner"].shift = 0.0


@rj.recursive_model
def scaled_by_a_missing_key(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return HYPER["scael"] * scaled_by_a_missing_key(node.left, p)


def test_a_key_the_dict_does_not_hold_is_refused_at_its_line():
    with pytest.raises(rj.UnsupportedError, match="`HYPER` has no key 'scael'; did you mean 'scale'") as error:
        scaled_by_a_missing_key.run(FOREST, P)
    assert error.value.expression == 'HYPER["scael"]'


WEIGHTS = [0.5]


def weighted(h, weights=WEIGHTS):
    return weights[0] * h


@rj.recursive_model
def weighted_by_a_default(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return weighted(weighted_by_a_default(node.left, p) + weighted_by_a_default(node.right, p))


def test_a_helpers_default_list_changed_in_place_is_read_again():
    try:
        for weight in (0.5, 2.0):
            WEIGHTS[0] = weight
            assert_run_is_reference(weighted_by_a_default)
    finally:
        WEIGHTS[0] = 0.5


def test_a_helpers_defaults_bound_again_are_read_again():
    try:
        for defaults in (([0.5],), ([4.0],)):
            weighted.__defaults__ = defaults
            assert_run_is_reference(weighted_by_a_default)
    finally:
        weighted.__defaults__ = (WEIGHTS,)


SETTINGS = SimpleNamespace(offset=0.0)


def shifted(h, *, settings=SETTINGS):
    return h + settings.offset


@rj.recursive_model
def shifted_by_a_keyword_default(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return shifted(shifted_by_a_keyword_default(node.left, p)
                   * shifted_by_a_keyword_default(node.right, p))


def test_an_attribute_of_a_keyword_default_changed_in_place_is_read_again():
    try:
        for offset in (0.0, 1.5):
            SETTINGS.offset = offset
            assert_run_is_reference(shifted_by_a_keyword_default)
    finally:
        SETTINGS.offset = 0.0


class Scaler:
    def __init__(self, scale):
        self.scale = scale

    def apply(self, h):
        return self.scale * h


SCALER = Scaler(2.0)


@rj.recursive_model
def scaled_by_a_method(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return SCALER.apply(scaled_by_a_method(node.left, p) + scaled_by_a_method(node.right, p))


def test_a_method_binds_its_object_first_and_reads_its_attributes_again():
    try:
        for scale in (2.0, -0.5):
            SCALER.scale = scale
            assert_run_is_reference(scaled_by_a_method)
    finally:
        SCALER.scale = 2.0


def test_a_method_read_again_at_every_run_is_the_same_binding():
    """A bound method is a new object at every read: it is compared by its function and its
    object, so an unchanged one reuses its kernel."""
    first = scaled_by_a_method.compile(FOREST, P)
    assert scaled_by_a_method.compile(FOREST, P) is first


SCALES = (SimpleNamespace(value=1.0), SimpleNamespace(value=0.5))


@rj.recursive_model
def scaled_in_a_loop(node, p):
    if node.is_leaf:
        return p.E[node.word]
    total = scaled_in_a_loop(node.left, p) + scaled_in_a_loop(node.right, p)
    for scale in SCALES:
        total = total * scale.value
    return total


@rj.recursive_model
def scaled_by_a_slice(node, p):
    if node.is_leaf:
        return p.E[node.word]
    total = scaled_by_a_slice(node.left, p) + scaled_by_a_slice(node.right, p)
    for scale in SCALES[1:]:
        total = total * scale.value
    return total


@pytest.mark.parametrize("model", [scaled_in_a_loop, scaled_by_a_slice],
                         ids=["the tuple", "a slice of it"])
def test_attributes_of_the_objects_a_loop_takes_from_a_tuple_are_read_again(model):
    try:
        for value in (0.5, 3.0):
            SCALES[1].value = value
            assert_run_is_reference(model)
    finally:
        SCALES[1].value = 0.5


@rj.recursive_model
def scaled_by_math(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return (scaled_by_math(node.left, p) + scaled_by_math(node.right, p)) / math.sqrt(2.0)


def test_a_math_function_of_numbers_is_computed_as_the_recursion_computes_it():
    assert_run_is_reference(scaled_by_math)


def test_a_math_function_of_numbers_scales_the_gradients_as_finite_differences_do():
    assert_gradients_are_differences(scaled_by_math, FOREST, P, seed=0)


@rj.recursive_model
def scaled_through_a_copy(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return tuple(CONFIGS)[0].scale * scaled_through_a_copy(node.left, p)


def test_an_attribute_of_an_object_not_read_by_a_path_is_refused_at_its_line():
    with pytest.raises(rj.UnsupportedError, match="did not read by a path") as error:
        scaled_through_a_copy.run(FOREST, P)
    assert error.value.expression == "tuple(CONFIGS)[0].scale"


def test_a_prepared_forest_names_the_value_that_changed_since():
    prepared = scaled_by_an_item.prepare(FOREST, P)
    try:
        CONFIGS[0].scale = 5.0
        with pytest.raises(rj.InputError, match=r"`CONFIGS\[0\]\.scale`.*prepare again"):
            scaled_by_an_item.run(prepared, P)
    finally:
        CONFIGS[0].scale = 1.0
    assert_same_result(scaled_by_an_item.run(prepared, P), scaled_by_an_item.reference(FOREST, P))
