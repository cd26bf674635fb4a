"""Bad forests and parameters raise `InputError` naming the culprit, before any kernel runs."""
import importlib.util
import math

import numba
import numpy as np
import pytest

import recjit as rj
from tree_lstm import make_params, tree_lstm
from tree_rnn import tree_rnn

from conftest import assert_same_result


def test_a_word_id_outside_the_embedding_names_the_node():
    forest = rj.Forest.from_nested([(1, (2, 99))])
    with pytest.raises(rj.InputError, match="node 4: field 'word' = 99 is outside the 10 rows "
                                            "of parameter 'E'"):
        tree_lstm.run(forest, make_params(4, 10, "float64"))


def test_a_negative_word_id_on_a_leaf_is_refused_but_minus_one_inside_is_fine():
    p = make_params(4, 10, "float64")
    assert rj.Forest.from_nested([(1, 2)]).fields["word"][0] == -1
    tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)
    with pytest.raises(rj.InputError, match="node 2: field 'word' = -3"):
        tree_lstm.run(rj.Forest.from_nested([(1, -3)]), p)


def test_something_other_than_a_forest_is_refused_naming_its_type():
    with pytest.raises(rj.InputError, match=r"expected a recjit.Forest, got list \(nested "
                                            r"tuples make one with rj.Forest.from_nested"):
        tree_lstm.run([(1, 2)], make_params(4, 10, "float64"))


def test_numba_disable_jit_is_refused_naming_it_while_the_reference_still_runs(monkeypatch):
    forest, p = rj.Forest.from_nested([(1, 2)]), make_params(4, 10, "float64")
    monkeypatch.setattr(numba.config, "DISABLE_JIT", True)
    assert tree_lstm.reference(forest, p).roots[0].shape == (1, 4)
    for call in (tree_lstm.run, tree_lstm.vjp):
        with pytest.raises(rj.RecJitError, match=r"NUMBA_DISABLE_JIT=1 .*model\.reference"):
            call(forest, p)


def test_more_children_than_the_declared_arity_names_the_node():
    with pytest.raises(rj.InputError, match="node 0 has 3 children; the model declares "
                                            "arity=2"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2, 3)]), make_params(4, 10, "float64"))


def test_a_shared_node_in_a_tree_model_is_refused():
    forest = rj.Forest.from_edges(5, [(0, 1), (0, 2), (1, 3), (1, 4), (2, 3), (2, 4)],
                                  fields={"word": [-1, -1, -1, 0, 1]})
    with pytest.raises(rj.InputError, match=r"node 3 has two parents, which a tree does not: "
                                            r".*@rj\.recursive_model\(kind='dag'\)"):
        tree_rnn.run(forest, rj.Params(E=np.ones((2, 3)), W=np.eye(3), U=np.eye(3),
                                       b=np.zeros(3)))


@pytest.mark.parametrize("method", ["run", "reference"])
def test_a_missing_parameter_is_named(method):
    p = make_params(4, 10, "float64")
    del p.U_f
    with pytest.raises(rj.InputError, match="parameter 'U_f' is missing"):
        getattr(tree_lstm, method)(rj.Forest.from_nested([(1, 2)]), p)


def test_a_misspelt_parameter_names_the_line_that_reads_it_and_the_closest_name():
    forest = rj.Forest.from_nested([(0, 1)])
    p = make_params(4, 10, "float64")
    misspelt = rj.Params(**{("U_ff" if name == "U_f" else name): getattr(p, name)
                            for name in vars(p)})
    with pytest.raises(rj.InputError, match=r"parameter 'U_f' is missing from the parameters "
                                            r"\(read at .*tree_lstm.py:\d+\); did you mean "
                                            r"'U_ff'\?"):
        tree_lstm.run(forest, misspelt)


def test_a_missing_field_is_named():
    forest = rj.Forest.from_nested([(1, 2)], leaf_field="token")
    with pytest.raises(rj.InputError, match="no field 'word'"):
        tree_lstm.run(forest, make_params(4, 10, "float64"))


def test_a_wrongly_shaped_parameter_names_the_operation_and_line():
    p = make_params(4, 10, "float64")
    p.U_f = np.ones((4, 5))
    with pytest.raises(rj.ShapeError, match=r"`@` of shapes \(4, 5\) and \(4,\)") as info:
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)
    assert isinstance(info.value, rj.InputError)
    assert info.value.filename.endswith("tree_lstm.py")


def test_mixed_parameter_dtypes_are_refused():
    p = make_params(4, 10, "float64")
    p.b_f = p.b_f.astype(np.float32)
    with pytest.raises(rj.InputError, match=r"mix dtypes \(float32: b_f; float64: E, U_f, "
                                            r"U_iou, W_iou, b_iou\)"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)


def test_parameters_in_a_dict_are_refused_with_what_to_pass_instead():
    p = make_params(4, 10, "float64")
    with pytest.raises(rj.InputError, match=r"pass rj.Params\(\*\*p\)"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), dict(vars(p)))


def test_a_ragged_parameter_is_refused_naming_it():
    with pytest.raises(rj.InputError, match="parameter 'E' is not an array"):
        rj.Params(E=[[1.0, 2.0], [3.0]], W=np.eye(2))


def test_a_float_index_field_is_refused_naming_the_field_and_the_line():
    forest = rj.Forest.from_edges(3, [(0, 1), (0, 2)], fields={"word": [0.0, 1.0, 2.0]})
    with pytest.raises(rj.UnsupportedError, match="tree_lstm.py:13: scalar field 'word' holds "
                                                  "floats; a row of parameter 'E' is gathered "
                                                  "by a field of integer indices"):
        tree_lstm.run(forest, make_params(4, 10, "float64"))


def test_check_finite_names_the_parameter_and_the_index_of_a_nan():
    p = make_params(4, 10, "float64")
    p.U_f[2, 3] = np.nan
    forest = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.InputError, match=r"parameter 'U_f' holds nan at index \(2, 3\)"):
        tree_lstm.run(forest, p, check_finite=True)


def test_check_finite_names_the_node_of_an_infinite_float_field():
    from dag_rnn import dag_rnn, grids, make_params as dag_params
    forest = grids(1, 3, rows=2, cols=2, dtype="float64")
    forest.fields["x"][1, 2] = np.inf
    with pytest.raises(rj.InputError, match=r"field 'x' holds inf at node 1, index \(1, 2\)"):
        dag_rnn.run(forest, dag_params(3, dtype="float64"), check_finite=True)


def test_kernel_source_called_with_a_forest_first_says_how_to_call_it():
    forest = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.RecJitError, match=r"kernel_source\(backend, forest, p\): backend "
                                             "must be one of"):
        tree_lstm.kernel_source(forest)


def test_half_precision_parameters_are_refused_naming_the_parameter():
    p = make_params(4, 10, "float32")
    p.U_f = p.U_f.astype(np.float16)
    with pytest.raises(rj.InputError, match="parameter 'U_f' has dtype float16; parameters "
                                            "must be float32 or float64"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)


def test_parameters_in_the_other_byte_order_are_refused_saying_how_to_convert_them():
    p = make_params(4, 10, "float32")
    p.U_f = p.U_f.astype(">f4")  # big-endian, as read from some files on a little-endian CPU
    with pytest.raises(rj.InputError, match=r"parameter 'U_f' has dtype >f4; parameters must "
                                            r"be float32 or float64 arrays in the machine's "
                                            r"byte order \(`.astype\(np.float32\)`\)"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)


def test_a_parameter_with_masked_elements_is_refused_naming_it():
    p = make_params(4, 10, "float32")
    p.U_f = np.ma.masked_array(p.U_f, mask=np.eye(4, dtype=bool))
    with pytest.raises(rj.InputError, match=r"parameter 'U_f' is a masked array with masked "
                                            r"elements; .* `.filled\(value\)`"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)


def test_params_refuse_an_array_with_masked_elements_where_it_is_given():
    with pytest.raises(rj.InputError, match="parameter 'W' is a masked array with masked"):
        rj.Params(W=np.ma.masked_array(np.ones((2, 2)), mask=[[0, 1], [0, 0]]))


def test_a_field_with_masked_elements_is_refused_naming_it():
    words = np.ma.masked_array([0, 1, 2], mask=[0, 1, 0])
    with pytest.raises(rj.InputError, match="field 'word' is a masked array with masked"):
        rj.Forest.from_edges(3, [(0, 1), (0, 2)], fields={"word": words})


def test_a_masked_array_with_nothing_masked_runs_as_its_data():
    p = make_params(4, 10, "float64")
    forest = rj.Forest.from_nested([(1, 2)])
    plain = tree_lstm.run(forest, p).roots[0]
    p.U_f = np.ma.masked_array(p.U_f)
    np.testing.assert_array_equal(tree_lstm.run(forest, p).roots[0], plain)


def test_a_vector_field_of_strings_is_refused_naming_the_field_and_the_line():
    from dag_rnn import dag_rnn
    from dag_rnn import make_params as dag_params
    forest = rj.Forest.grid_dag(1, 2, fields={"x": np.full((2, 3), "a")})
    with pytest.raises(rj.InputError, match=r"vector field 'x' holds <U1 \(read at "
                                            r".*dag_rnn.py:\d+\); a vector field holds numbers"):
        dag_rnn.run(forest, dag_params(3, dtype="float64"))


def test_parameters_of_zero_size_are_refused_as_an_empty_state():
    p = rj.Params(**{name: np.zeros(tuple(0 for _ in getattr(make_params(4, 10), name).shape))
                     for name in make_params(4, 10).names()})
    with pytest.raises(rj.ShapeError, match=r"the leaf case returns states of shapes "
                                            r"\(\(0,\), \(0,\)\); a state needs at least one"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)


def test_a_schedule_that_is_not_a_schedule_is_refused_naming_its_type():
    with pytest.raises(rj.ScheduleError, match="schedule must be a recjit.Schedule, not str"):
        tree_lstm.run(rj.Forest.from_nested([(1, 2)]), make_params(4, 10), schedule="fast")
    with pytest.raises(rj.ScheduleError, match="not dict"):
        rj.recursive_model(schedule={"unroll": 2})


@pytest.mark.parametrize("array", ["child_ptr", "child_idx", "roots"])
def test_a_structure_array_of_floats_is_refused_rather_than_truncated(array):
    arrays = {"child_ptr": [0, 2, 2, 2], "child_idx": [1, 2], "roots": [0]}
    arrays[array] = np.asarray(arrays[array], dtype=float) + 0.5
    with pytest.raises(rj.InputError, match=f"{array} must hold integers"):
        rj.Forest(**arrays)


def test_a_grid_of_fractional_rows_is_refused():
    with pytest.raises(rj.InputError, match="whole numbers of rows and columns"):
        rj.Forest.grid_dag(2.5, 3)


def test_an_update_in_place_of_a_childs_state_is_refused_naming_the_line():
    """NumPy's `h += x` would change the child's state (or a parameter's row) in the plain
    recursion, and the kernel would not: the two would disagree."""
    @rj.recursive_model(arity=2)
    def in_place(node, p):
        if node.is_leaf:
            return p.E[node.word]
        h = in_place(node.left, p)
        h += in_place(node.right, p)
        return h

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: `h \+= \.\.\.` changes "
                                                  r"h's array in place .* write `h = h \+ \.\.\.`"):
        in_place.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def cell_with_body(body, tmp_path):
    """A one-child cell whose internal case is `a = <the child's state> * 1`, then `body`."""
    path = tmp_path / "in_place.py"
    path.write_text("import numpy as np\nimport recjit as rj\n\n\n"
                    "def helper(x):\n    return x\n\n\n"
                    "@rj.recursive_model(arity=1)\ndef in_place(node, p):\n"
                    "    if node.is_leaf:\n        return p.E[node.word]\n"
                    "    a = in_place(node.children[0], p) * 1\n    " + body + "\n")
    spec = importlib.util.spec_from_file_location("in_place", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.in_place


@pytest.mark.parametrize("body, message", [
    ("return a / (1 / 0)", "ZeroDivisionError"),
    ("return a * 2.0 ** 5000", "OverflowError"),
    ("return a * 10 ** 400", "constant 1000.* is beyond the largest float"),
    ("return a * len(1, 2)", r"`len` raises TypeError here \(len\(\) takes exactly one"),
    ("return a * sum(range(3, step=1))", "`range` raises TypeError here"),
    ("for _ in range(10 ** 9):\n        a = a + 1\n    return a", "unrolls loops, up to 4096")],
    ids=["division by zero", "a power past the floats", "an int past the floats",
         "len of two", "a keyword range refuses", "a billion steps"])
def test_what_python_refuses_in_a_cells_arithmetic_is_refused_at_its_line(body, message,
                                                                          tmp_path):
    with pytest.raises(rj.UnsupportedError, match=message) as error:
        cell_with_body(body, tmp_path).run(IN_PLACE_FOREST, IN_PLACE_PARAMS)
    assert error.value.filename.endswith("in_place.py")


IN_PLACE_FOREST = rj.Forest.from_edges(2, [(0, 1)], fields={"word": [0, 1]}, kind="tree")
IN_PLACE_PARAMS = rj.Params(E=np.array([[1.0, 2.0], [3.0, 5.0]]), W=np.eye(2, 2), b=np.ones(2))


@pytest.mark.parametrize("body", [
    "g = a\n    a += g\n    return g + a",
    "y = p.W @ a\n    c, d = rj.split(y, 2)\n    c += d\n    return y",
    "for b in (a,):\n        pass\n    a += p.b\n    return a + b",
    "bs = [a for _ in range(1)]\n    a += p.b\n    return a + bs[0]",
    "b = a.T\n    a += p.b\n    return a + b",
    "b = sum((), a)\n    a += p.b\n    return a + b",
    "pair = (a, p.b)\n    a += p.b\n    return a + pair[0]",
    "b = a if node.num_children == 1 else p.b\n    a += p.b\n    return a + b",
    "b = helper(a)\n    a += p.b\n    return a + b",
    "b = a[0:2]\n    a += p.b\n    return a + b",
    "bs = list(zip([a], [p.b]))\n    a += p.b\n    return a + bs[0][0]",
    "b, = rj.split(a, 1)\n    a += p.b\n    return a + b",
    "b = np.split(a, [1])[1]\n    a *= p.b\n    return rj.concat([a[0:1], b])"],
    ids=["an alias", "a split part", "a loop target", "a list comprehension", "a transposed view",
         "the start of a sum", "a tuple", "a conditional expression", "a helper's argument",
         "a slice", "a zip", "a single split part", "a split at an index"])
def test_an_update_in_place_of_an_array_another_name_shares_is_refused(body, tmp_path):
    with pytest.raises(rj.UnsupportedError, match="in place"):
        cell_with_body(body, tmp_path).run(IN_PLACE_FOREST, IN_PLACE_PARAMS)


@pytest.mark.parametrize("body", [
    "b = a + 1\n    a += p.b\n    return a + b",
    "b = rj.tanh(a) * a.shape[0]\n    a -= p.b\n    return a * b",
    "b = sum([a, a])\n    a *= p.b\n    return a + b",
    "a += a\n    a += p.W @ a\n    return a"],
    ids=["read by an operator", "read by a function and for its shape", "summed", "twice"])
def test_an_update_in_place_of_an_array_only_operations_read_equals_the_recursion(body, tmp_path):
    model = cell_with_body(body, tmp_path)
    assert_same_result(model.run(IN_PLACE_FOREST, IN_PLACE_PARAMS),
                       model.reference(IN_PLACE_FOREST, IN_PLACE_PARAMS))


def test_a_call_to_a_function_outside_the_cell_language_is_named_before_its_arguments():
    @rj.recursive_model(arity=2)
    def logging(node, p):
        if node.is_leaf:
            np.savetxt("leaf.txt", "a leaf")
            return p.E[node.word]
        return logging(node.left, p) + logging(node.right, p)

    with pytest.raises(rj.UnsupportedError, match="calling np.savetxt is not part of the cell "
                                                  "language"):
        logging.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_numpys_zeros_are_refused_for_rj_zeros_which_take_the_parameters_dtype():
    @rj.recursive_model(arity=None)
    def numpy_sum(node, p):
        total = np.zeros(2)
        for child in node.children:
            total = total + numpy_sum(child, p)
        return rj.tanh(total + p.E[node.word]) if node.is_leaf else total

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: np.zeros makes float64 "
                                                  r"arrays.*use rj.zeros\(shape\)"):
        numpy_sum.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2), "f4")))


def test_cases_by_a_variable_number_of_children_are_refused_saying_what_is_compared():
    @rj.recursive_model(arity=None)
    def by_count(node, p):
        if node.is_leaf:
            return p.E[node.word]
        total = sum(by_count(c, p) for c in node.children)
        return rj.tanh(total) if node.num_children == 1 else total

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: with arity=None the "
                                                  r"number of children differs .* compares it "
                                                  r"with 0 only"):
        by_count.run(rj.Forest.from_nested([(1, 2, 0)]), rj.Params(E=np.ones((3, 2))))


def test_a_running_product_over_any_number_of_children_is_refused_saying_what_accumulates():
    @rj.recursive_model(arity=None)
    def product_pooled(node, p):
        product = rj.ones(p.E.shape[1:])
        for child in node.children:
            product = product * product_pooled(child, p)
        return p.E[node.word] if node.is_leaf else rj.tanh(product)

    update = product_pooled.function.__code__.co_firstlineno + 4  # from the decorator's line
    with pytest.raises(rj.UnsupportedError, match=rf"test_errors.py:{update + 1}: `product`, "
                                                  rf"changed per child at line {update} other "
                                                  r"than by a sum or a running maximum or "
                                                  r"minimum \(only `product = product \+ x`, "
                                                  r"`product \+= x`, `product = "
                                                  r"rj.maximum\(product, x\)` and `rj.minimum` "
                                                  r"accumulate over any number of children, "
                                                  r"not a product\)"):
        product_pooled.run(rj.Forest.from_nested([(1, 2, 0)]), rj.Params(E=np.ones((3, 2))))


def test_a_value_updated_twice_a_child_is_refused_at_its_return_naming_both_updates():
    @rj.recursive_model(arity=None)
    def pooled_twice(node, p):
        best = rj.zeros(p.E.shape[1:])
        for child in node.children:
            h = pooled_twice(child, p)
            best = rj.maximum(best, h)
            best = rj.maximum(best, -h)
        if node.is_leaf:
            return p.E[node.word]
        return best

    first = pooled_twice.function.__code__.co_firstlineno + 5  # from the decorator's line
    with pytest.raises(rj.UnsupportedError, match=rf"test_errors.py:{first + 4}: `best`, changed "
                                                  rf"per child at lines {first} and {first + 1} "
                                                  r"\(a value accumulates over any number of "
                                                  r"children by one update a child"):
        pooled_twice.run(rj.Forest.from_nested([(1, 2, 0)]), rj.Params(E=np.ones((3, 2))))


def test_a_running_maximum_over_a_fixed_number_of_children_equals_the_reference():
    """The loop unrolls, a step a child: any update compiles."""
    @rj.recursive_model(arity=3)
    def max_pooled(node, p):
        best = rj.zeros(p.E.shape[1:]) - 1e9
        for child in node.children:
            best = rj.maximum(best, max_pooled(child, p))
        return p.E[node.word] if node.is_leaf else rj.tanh(best)

    forest = rj.Forest.from_nested([(1, (2, 0, 1), 0), (2, 1, 0)])
    p = rj.Params(E=np.random.default_rng(0).normal(size=(3, 2)))
    assert_same_result(max_pooled.run(forest, p), max_pooled.reference(forest, p))


def test_node_is_leaf_called_as_a_method_is_refused_saying_it_is_a_property():
    @rj.recursive_model(arity=2)
    def called(node, p):
        if node.is_leaf():
            return p.E[node.word]
        return called(node.left, p) + called(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: `node.is_leaf` is a "
                                                  r"property of the node, not a method: write "
                                                  r"`node.is_leaf`, without `\(\)`"):
        called.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_state_returned_as_a_list_is_refused_saying_to_return_a_tuple():
    @rj.recursive_model(arity=2)
    def listed(node, p):
        if node.is_leaf:
            return [p.E[node.word], p.E[node.word]]
        a, b = listed(node.left, p)
        c, d = listed(node.right, p)
        return [a + c, b + d]

    with pytest.raises(rj.UnsupportedError, match=r"returns a tensor or a flat tuple of tensors, "
                                                  r"not a list: write `return a, b`"):
        listed.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_range_over_any_number_of_children_is_refused_saying_to_loop_over_them():
    @rj.recursive_model(arity=None)
    def indexed(node, p):
        total = rj.zeros(p.E.shape[1:])
        for k in range(len(node.children)):
            total = total + indexed(node.children[k], p)
        return p.E[node.word] if node.is_leaf else total

    with pytest.raises(rj.UnsupportedError, match=r"`range` of the number of children: with "
                                                  r"arity=None.*`for child in node.children:`"):
        indexed.run(rj.Forest.from_nested([(1, 2, 0)]), rj.Params(E=np.ones((3, 2))))


def test_any_number_of_children_reversed_are_refused_saying_how_to_count_from_the_end():
    @rj.recursive_model(arity=None)
    def backwards(node, p):
        total = rj.zeros(p.E.shape[1:])
        for child in reversed(node.children):
            total = total + backwards(child, p)
        return p.E[node.word] if node.is_leaf else total

    with pytest.raises(rj.UnsupportedError, match=r"`reversed` of the children with arity=None"
                                                  r": .*`node\.num_children - 1 - place` its "
                                                  r"place from the end"):
        backwards.run(rj.Forest.from_nested([(1, 2, 0)]), rj.Params(E=np.ones((3, 2))))


def test_the_children_sorted_are_refused_saying_they_come_in_the_forests_order():
    @rj.recursive_model(arity=None)
    def by_word(node, p):
        total = rj.zeros(p.E.shape[1:])
        for child in sorted(node.children, key=lambda child: child.word):
            total = total + by_word(child, p)
        return p.E[node.word] if node.is_leaf else total

    with pytest.raises(rj.UnsupportedError, match=r"sorted is not part of the cell language: "
                                                  r"the children are taken in the forest's "
                                                  r"order"):
        by_word.run(rj.Forest.from_nested([(1, 2, 0)]), rj.Params(E=np.ones((3, 2))))


def test_the_children_compared_with_an_empty_list_say_how_a_leaf_is_told():
    @rj.recursive_model(arity=None)
    def compared(node, p):
        if node.children == []:
            return p.E[node.word]
        return sum(compared(child, p) for child in node.children)

    with pytest.raises(rj.UnsupportedError, match=r"node\.children is compared: a leaf is "
                                                  r"`node\.is_leaf` \(or `not node\.children`\)"):
        compared.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_map_over_the_children_is_refused_saying_to_write_a_list_comprehension():
    @rj.recursive_model(arity=2)
    def mapped(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return sum(map(lambda child: mapped(child, p), node.children))  # noqa: C417

    with pytest.raises(rj.UnsupportedError, match=r"map is not part of the cell language: a "
                                                  r"list comprehension is \(`\[f\(child, p\) "
                                                  r"for child in node\.children\]`\)"):
        mapped.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_lambda_is_refused_at_its_line_saying_a_helper_is_a_def():
    @rj.recursive_model(arity=2)
    def halved(node, p):
        if node.is_leaf:
            return p.E[node.word]
        half = lambda h: h * 0.5  # noqa: E731
        return half(halved(node.left, p)) + halved(node.right, p)

    line = halved.function.__code__.co_firstlineno + 4
    with pytest.raises(rj.UnsupportedError, match=rf"test_errors.py:{line}: a lambda is not "
                                                  r"part of the cell language: a helper is a "
                                                  r"`def`"):
        halved.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_list_of_values_per_child_sliced_with_any_arity_is_refused_at_its_line():
    @rj.recursive_model(arity=None)
    def adjacent(node, p):
        states = [adjacent(child, p) for child in node.children]
        total = rj.zeros(p.E.shape[1:])
        for left, right in zip(states, states[1:]):  # noqa: RUF007
            total = total + left * right
        return p.E[node.word] if node.is_leaf else total

    with pytest.raises(rj.UnsupportedError, match=r"a list of values per child is sliced: with "
                                                  r"arity=None"):
        adjacent.run(rj.Forest.from_nested([(1, 2, 0)]), rj.Params(E=np.ones((3, 2))))


def test_a_matrix_times_a_vector_with_a_star_says_the_product_is_at():
    @rj.recursive_model(arity=2)
    def starred(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return p.W * (starred(node.left, p) + starred(node.right, p))

    with pytest.raises(rj.ShapeError, match=r"shapes \(2, 2\) and \(2,\) do not match in `mul` "
                                            r"\(`\*` is elementwise; the matrix product is `@`\)"):
        starred.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2)), W=np.eye(2)))


def test_a_row_read_with_two_indices_says_one_index_gathers_the_row():
    @rj.recursive_model(arity=2)
    def two_indices(node, p):
        if node.is_leaf:
            return p.E[node.word, :]
        return two_indices(node.left, p) + two_indices(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"`p.E\[node.word, :\]`: a parameter's row is "
                                                  r"gathered by one index, `p.E\[node.word\]`"):
        two_indices.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_an_index_field_computed_with_says_it_only_gathers_rows():
    @rj.recursive_model(arity=2)
    def scaled_by_word(node, p):
        if node.is_leaf:
            return p.E[node.word] * node.word
        return scaled_by_word(node.left, p) + scaled_by_word(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"field 'word' holds integer indices: it "
                                                  r"gathers a parameter's row"):
        scaled_by_word.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_print_in_a_cell_is_refused_saying_the_reference_runs_it():
    @rj.recursive_model(arity=2)
    def printing(node, p):
        if node.is_leaf:
            print(node.word)
            return p.E[node.word]
        return printing(node.left, p) + printing(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: print runs in "
                                                  r"model.reference\(forest, p\)"):
        printing.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_an_array_made_in_a_cell_is_refused_saying_to_pass_a_parameter():
    @rj.recursive_model(arity=2)
    def shifted(node, p):
        if node.is_leaf:
            return p.E[node.word] + np.array([1.0, 2.0])
        return shifted(node.left, p) + shifted(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"np.array makes an array inside the cell: "
                                                  r"pass a constant array as a parameter"):
        shifted.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_math_function_of_a_tensor_says_to_use_the_elementwise_one():
    @rj.recursive_model(arity=2)
    def squashed(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return math.tanh(squashed(node.left, p) + squashed(node.right, p))

    with pytest.raises(rj.UnsupportedError, match=r"math.tanh takes numbers, not a tensor of "
                                                  r"shape \(2,\): use rj.tanh"):
        squashed.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_tensor_methods_from_numpy_habits_say_what_to_write_instead():
    @rj.recursive_model(arity=2)
    def dotted(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return p.W.dot(dotted(node.left, p) + dotted(node.right, p))

    with pytest.raises(rj.UnsupportedError, match=r"tensor attribute `.dot` is not part of the "
                                                  r"cell language: write `a @ b`"):
        dotted.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2)), W=np.eye(2)))


def test_a_recursive_call_with_a_keyword_the_cell_does_not_take_is_refused_naming_it():
    @rj.recursive_model(arity=2)
    def misnamed(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return misnamed(node.left, params=p) + misnamed(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: a recursive call names "
                                                  r"'params', which is not one of the cell's "
                                                  r"parameters after the first 1 \(node, p\)"):
        misnamed.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_call_to_another_recursive_model_is_refused_saying_how_to_compose_them():
    @rj.recursive_model(arity=2)
    def inner(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return inner(node.left, p) + inner(node.right, p)

    @rj.recursive_model(arity=2)
    def outer(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return inner(node.left, p) * outer(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: calling another "
                                                  r"recursive model \(inner\) from a cell .* "
                                                  r"pass its states in as a field"):
        outer.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_vector_times_a_computed_matrix_is_refused_naming_the_line():
    @rj.recursive_model(arity=2)
    def row_times_state(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return row_times_state(node.left, p) @ (p.M @ p.M) + row_times_state(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: a vector @ a computed "
                                                  r"matrix \(shapes \(2,\) and \(2, 2\)\)"):
        row_times_state.run(rj.Forest.from_nested([(1, 2)]),
                            rj.Params(E=np.ones((3, 2)), M=np.eye(2)))


def test_a_gather_from_a_transposed_table_is_refused_naming_the_line():
    @rj.recursive_model(arity=2)
    def column_embedding(node, p):
        if node.is_leaf:
            return p.E.T[node.word]
        return column_embedding(node.left, p) + column_embedding(node.right, p)

    with pytest.raises(rj.UnsupportedError, match=r"test_errors.py:\d+: a row of `p\.E\.T` is "
                                                  r"a column of parameter 'E'"):
        column_embedding.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((2, 3))))


def test_a_parameter_named_as_another_ones_transpose_is_refused_naming_both():
    @rj.recursive_model(arity=2)
    def both(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return p.W_T @ both(node.left, p) + both(node.right, p) @ p.W

    with pytest.raises(rj.InputError, match=r"parameter 'W_T' and `p\.W\.T` would share"):
        both.run(rj.Forest.from_nested([(1, 2)]),
                 rj.Params(E=np.ones((3, 2)), W=np.eye(2), W_T=np.eye(2)))


def test_an_inner_product_of_vectors_of_different_lengths_names_the_line():
    @rj.recursive_model(arity=2)
    def mismatched(node, p):
        if node.is_leaf:
            return p.E[node.word]
        return np.dot(mismatched(node.left, p), p.b) * mismatched(node.right, p)

    with pytest.raises(rj.ShapeError, match=r"test_errors.py:\d+: the inner product of shapes "
                                            r"\(2,\) and \(3,\): lengths differ"):
        mismatched.run(rj.Forest.from_nested([(1, 2)]),
                       rj.Params(E=np.ones((3, 2)), b=np.ones(3)))


def test_a_split_that_leaves_an_empty_part_is_refused_naming_the_line():
    @rj.recursive_model(arity=2)
    def split_at_the_end(node, p):
        if node.is_leaf:
            return p.E[node.word]
        head, _ = np.split(split_at_the_end(node.left, p), [2])
        return head + split_at_the_end(node.right, p)

    with pytest.raises(rj.ShapeError, match=r"test_errors.py:\d+: splitting shape \(2,\) at "
                                            r"\[2\] leaves an empty part"):
        split_at_the_end.run(rj.Forest.from_nested([(1, 2)]), rj.Params(E=np.ones((3, 2))))


def test_a_word_field_set_in_big_endian_order_after_construction_runs_as_in_native_order():
    forest = rj.Forest.from_nested([(0, (1, 2))])
    p = make_params(4, 10, "float64")
    native = tree_lstm.run(forest, p)
    forest.fields["word"] = forest.fields["word"].astype(">i8")
    assert_same_result(tree_lstm.run(forest, p), native)


def test_calling_a_model_on_a_forest_says_to_run_it():
    forest = rj.Forest.from_nested([(1, 2)])
    with pytest.raises(rj.RecJitError, match=r"tree_lstm\.run\(forest, p\)"):
        tree_lstm(forest, make_params(4, 10, "float64"))


def test_a_node_with_more_children_than_the_arity_hints_at_arity_none():
    forest = rj.Forest.from_nested([(1, 2, 3)])
    with pytest.raises(rj.InputError, match=r"node 0 has 3 children; the model declares "
                                            r"arity=2 .*arity=None"):
        tree_lstm.run(forest, make_params(4, 10, "float64"))


@rj.recursive_model(arity=2)
def numpy_summed(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return np.sum(numpy_summed(node.left, p)) * numpy_summed(node.right, p)


def test_np_sum_is_refused_with_what_to_write_instead():
    with pytest.raises(rj.UnsupportedError, match=r"np\.sum is not part of the cell language: "
                                                  r"Python's sum adds up .*np\.dot\(v, "
                                                  r"rj\.ones\(v\.shape\)\)"):
        numpy_summed.run(rj.Forest.from_nested([(0, 1)]), rj.Params(E=np.ones((3, 4))))


def numpy_max(states):
    return np.max(np.stack(states), axis=0)


def numpy_amin(states):
    return np.amin(states, axis=0)


def numpy_maximum_reduce(states):
    return np.maximum.reduce(states)


def numpy_mean(states):
    return np.mean(states, axis=0)


def numpy_stack_max(states):
    return np.stack(states).max(axis=0)


def python_max(states):
    return max(states)


POOLED_BY = {"pooling": numpy_max}


@rj.recursive_model(arity=None)
def numpy_pooled(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return POOLED_BY["pooling"]([numpy_pooled(child, p) for child in node.children])


@pytest.mark.parametrize("pooling, message", [
    (numpy_max, (r"np\.max is not part of the cell language: a maximum over the children is "
                 r"a loop, `best = rj\.maximum\(best, h\)` for each child's state h")),
    (numpy_amin, (r"np\.amin is not part of the cell language: a minimum over the children "
                  r"is a loop, `best = rj\.minimum\(best, h\)`")),
    (numpy_maximum_reduce, (r"np\.maximum\.reduce is not part of the cell language: a "
                            r"maximum over the children is a loop")),
    (numpy_mean, (r"np\.mean is not part of the cell language: the children's mean is "
                  r"sum\(states\) / len\(states\)")),
    (numpy_stack_max, (r"np\.stack is not part of the cell language: keep the children's "
                       r"states a list and pool them with sum\(states\)")),
    (python_max, r"max takes numbers: a maximum over the children is a loop"),
], ids=["np.max", "np.amin", "np.maximum.reduce", "np.mean", "np.stack", "max"])
def test_numpys_pooling_of_the_childrens_states_is_refused_with_the_cells_way(
        pooling, message, monkeypatch):
    monkeypatch.setitem(POOLED_BY, "pooling", pooling)
    with pytest.raises(rj.UnsupportedError, match=rf"test_errors.py:{_line_of(pooling)}: "
                                                  rf"{message}"):
        numpy_pooled.run(rj.Forest.from_nested([(0, 1, 2)]), rj.Params(E=np.ones((3, 4))))


def _line_of(helper):
    """The line of a one-line helper's body."""
    return helper.__code__.co_firstlineno + 1


@rj.recursive_model(arity=2)
def indexed_by_name(node, p):
    if node.is_leaf:
        return p["E"][node.word]
    return indexed_by_name(node.left, p) + indexed_by_name(node.right, p)


@rj.recursive_model(arity=2)
def field_by_name(node, p):
    if node.is_leaf:
        return p.E[node["word"]]
    return field_by_name(node.left, p) + field_by_name(node.right, p)


@pytest.mark.parametrize("model, message", [
    (indexed_by_name, r"parameters are read as attributes: write `p\.E`, not `p\['E'\]`"),
    (field_by_name, r"a node's fields are read as attributes: write `node\.word`")],
    ids=["a parameter", "a field"])
def test_a_parameter_or_field_indexed_by_its_name_says_to_read_it_as_an_attribute(model,
                                                                                    message):
    with pytest.raises(rj.UnsupportedError, match=message):
        model.run(rj.Forest.from_nested([(0, 1)]), rj.Params(E=np.ones((3, 4))))


TRACEBACK = """
import sys
sys.path.insert(0, 'examples')
import recjit as rj
from tree_lstm import make_params, tree_lstm
p = make_params(4, 10, 'float64')
del p.U_f
tree_lstm.run(rj.Forest.from_nested([(1, 2)]), p)
"""


@pytest.mark.parametrize("setting, frames", [(None, 2), ("full", 4)],
                         ids=["the user's frames", "RECJIT_TRACEBACK=full"])
def test_a_recjit_errors_traceback_ends_at_the_users_call(setting, frames):
    """As JAX filters its own frames: the error names the input at fault already."""
    import os
    import subprocess
    import sys
    environment = {**os.environ, "RECJIT_TRACEBACK": setting or ""}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", TRACEBACK], cwd=root, capture_output=True,
                            text=True, env=environment)
    assert "parameter 'U_f' is missing" in result.stderr
    shown = result.stderr.count('  File "')
    assert shown == frames if setting is None else shown >= frames


@pytest.mark.parametrize("extra, needs", [("torch", "PyTorch"), ("dask", "Dask")])
def test_import_recjit_needs_no_extra_and_the_extra_says_how_to_get_it(extra, needs):
    """`rj.torch` and `rj.dask` are imported when first used, and say what to install."""
    import subprocess
    import sys
    code = (f"import sys; sys.modules[{extra!r}] = None\n"
            "import recjit as rj\n"
            f"try:\n    rj.{extra}\nexcept ImportError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert f"recjit.{extra} needs {needs}: pip install 'recjit[{extra}]'" in result.stdout


def test_the_names_a_notebook_completes_are_the_public_api_and_the_extras():
    names = dir(rj)
    assert set(rj.__all__) | {"torch", "dask", "abs"} <= set(names)
    assert not {"os", "autodiff", "lowering", "codegen_cpu", "model"} & set(names)


@pytest.mark.parametrize("option, call", [
    ("check_finite", lambda forest, p: tree_lstm.run(forest, p, check_finite="False")),
    ("device_output", lambda forest, p: tree_lstm.run(forest, p, device_output="no")),
    ("per_tree", lambda forest, p: tree_lstm.vjp(forest, p)[1](per_tree="yes")),
    ("shuffle", lambda forest, p: forest.batches(1, shuffle="False")),
    ("grad", lambda forest, p: tree_lstm.explain(forest, p, grad="no")),
    ("grad", lambda forest, p: tree_lstm.kernel_source(grad="no")),
], ids=["check_finite", "device_output", "per_tree", "shuffle", "explain", "kernel_source"])
def test_an_option_that_is_not_true_or_false_is_refused_naming_it(option, call):
    """A string such as "False" is true: taken as it is, it would turn the option on."""
    forest = rj.Forest.random_binary(2, seed=0, vocab_size=20)
    with pytest.raises(rj.InputError, match=f"{option} must be True or False"):
        call(forest, make_params(4, 20, "float32", 0))


def test_parameters_passed_as_a_dict_are_refused_with_the_keyword_form():
    with pytest.raises(rj.InputError, match=r"Params\(\*\*params\)"):
        rj.Params({"W": np.ones(2)})


@pytest.mark.parametrize("name", ["names", "to_device"])
def test_a_parameter_named_as_a_method_of_params_is_refused(name):
    with pytest.raises(rj.InputError, match=f"may not be named '{name}'"):
        rj.Params(**{name: np.ones(2)})
