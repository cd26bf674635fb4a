"""P.1–P.3 are proven on the AST before anything else; violations and unsupported constructs
raise errors that name the property, the file and the line (marked `# <- error` below)."""
import inspect

import numpy as np
import pytest

import recjit as rj


def marked_line(model):
    lines, first = inspect.getsourcelines(model.function)
    return first + next(i for i, line in enumerate(lines) if "# <- error" in line)


@rj.recursive_model(arity=2)
def branches_on_a_tensor_element(node, p):
    if node.is_leaf:
        return p.E[node.word]
    h = rj.tanh(p.W @ branches_on_a_tensor_element(node.left, p))
    if h[0] > 0:  # <- error
        return h
    return -h


@rj.recursive_model(arity=2)
def branches_on_a_call_result(node, p):
    if node.is_leaf:
        return p.E[node.word]
    left = branches_on_a_call_result(node.left, p)
    return left if left[0] > 0 else p.b  # <- error


@rj.recursive_model(arity=2)
def passes_a_computed_argument(node, p, scale):
    if node.is_leaf:
        return p.E[node.word] * scale
    s = rj.tanh(p.b)
    return (passes_a_computed_argument(node.left, p, s)  # <- error
            + passes_a_computed_argument(node.right, p, scale))


@rj.recursive_model(arity=2)
def chains_dependent_calls(node, p, context):
    if node.is_leaf:
        return p.E[node.word] + context
    left = chains_dependent_calls(node.left, p, context)
    return chains_dependent_calls(node.right, p, left)  # <- error


@rj.recursive_model(arity=2)
def branches_on_a_tensor_and_loops_unsupportedly(node, p):
    while node.num_children > 5:
        pass
    if node.is_leaf:
        return p.E[node.word]
    h = branches_on_a_tensor_and_loops_unsupportedly(node.left, p)
    if rj.tanh(h)[1] > 0.5:  # <- error
        return h
    return h


@rj.recursive_model(arity=2)
def loops_over_a_tensor(node, p):
    if node.is_leaf:
        return p.E[node.word]
    total = p.b
    for value in loops_over_a_tensor(node.left, p):  # <- error
        total = total + value
    return total


@rj.recursive_model(arity=2)
def recurses_on_a_state_zipped_with_its_child(node, p):
    if node.is_leaf:
        return p.E[node.word]
    states = [recurses_on_a_state_zipped_with_its_child(c, p) for c in node.children]
    total = p.b
    for child, state in zip(node.children, states):
        total = total + recurses_on_a_state_zipped_with_its_child(state, p)  # <- error
    return total


@rj.recursive_model(arity=2)
def passes_a_gate_zipped_with_its_child_on(node, p, scale):
    if node.is_leaf:
        return p.E[node.word] * scale
    gates = [rj.sigmoid(p.b), rj.tanh(p.b)]
    total = p.b
    for child, gate in zip(node.children, gates):
        total = total + passes_a_gate_zipped_with_its_child_on(child, p, gate)  # <- error
    return total


@rj.recursive_model(arity=2)
def recurses_on_a_state_paired_with_its_child(node, p):
    if node.is_leaf:
        return p.E[node.word]
    pairs = [(c, recurses_on_a_state_paired_with_its_child(c, p)) for c in node.children]
    total = p.b
    for child, state in pairs:
        total = total + recurses_on_a_state_paired_with_its_child(state, p)  # <- error
    return total


@pytest.mark.parametrize("model, prop", [
    (recurses_on_a_state_zipped_with_its_child, "P.3"),
    (recurses_on_a_state_paired_with_its_child, "P.3"),
    (passes_a_gate_zipped_with_its_child_on, "P.2"),
    (branches_on_a_tensor_element, "P.1"),
    (loops_over_a_tensor, "P.1"),
    (branches_on_a_call_result, "P.1"),
    (passes_a_computed_argument, "P.2"),
    (chains_dependent_calls, "P.3"),
    (branches_on_a_tensor_and_loops_unsupportedly, "P.1"),
])
def test_a_property_violation_names_the_property_file_and_line(model, prop):
    with pytest.raises(rj.RecursionPropertyError) as info:
        model.analyse()
    assert info.value.property == prop
    assert info.value.lineno == marked_line(model)
    assert info.value.filename == __file__
    assert f"{__file__}:{marked_line(model)}" in str(info.value)


@rj.recursive_model(arity=2)
def zips_children_with_gates(node, p):
    if node.is_leaf:
        return p.E[node.word]
    gates = [rj.sigmoid(p.W @ p.b), rj.tanh(p.b)]
    total = p.b
    for child, gate in zip(node.children, gates):
        total = total + gate * zips_children_with_gates(child, p)
    return rj.tanh(total)


@rj.recursive_model(arity=2)
def pairs_a_child_with_a_gate(node, p):
    if node.is_leaf:
        return p.E[node.word]
    child, gate = node.left, rj.sigmoid(p.W @ p.b)
    return rj.tanh(gate * pairs_a_child_with_a_gate(child, p)
                   + pairs_a_child_with_a_gate(node.right, p))


@rj.recursive_model(arity=2)
def unpacks_the_children(node, p):
    if node.is_leaf:
        return p.E[node.word]
    left, right = node.children
    return rj.tanh(p.W @ unpacks_the_children(left, p) + unpacks_the_children(right, p))


@rj.recursive_model(arity=2)
def lists_children_with_gates_in_reverse(node, p):
    if node.is_leaf:
        return p.E[node.word]
    pairs = [(child, rj.sigmoid(p.W @ p.b)) for child in node.children[::-1]]
    total = p.b
    for child, gate in pairs:
        total = p.W @ total + gate * lists_children_with_gates_in_reverse(child, p)
    return rj.tanh(total)


@pytest.mark.parametrize("model", [zips_children_with_gates, pairs_a_child_with_a_gate,
                                   unpacks_the_children, lists_children_with_gates_in_reverse])
def test_a_child_paired_with_a_value_computed_in_the_node_is_still_a_child(model):
    """Only the child is the recursive call's argument: the value beside it in the tuple
    (a gate, a state) does not make that argument computed."""
    forest = rj.Forest.from_nested([((0, 1), 2), (3, (4, 0))])
    rng = np.random.default_rng(0)
    p = rj.Params(E=rng.normal(size=(5, 3)), W=rng.normal(size=(3, 3)), b=rng.normal(size=3))
    np.testing.assert_allclose(model.run(forest, p).nodes[0], model.reference(forest, p).nodes[0],
                               rtol=1e-12, atol=1e-12)


def test_run_refuses_a_violation_before_any_kernel_runs():
    forest = rj.Forest.from_nested([(0, 1)])
    p = rj.Params(E=np.ones((2, 3)), W=np.ones((3, 3)), b=np.ones(3))
    with pytest.raises(rj.RecursionPropertyError):
        branches_on_a_tensor_element.run(forest, p)


@rj.recursive_model(arity=2)
def calls_print(node, p):
    if node.is_leaf:
        return p.E[node.word]
    print(node.num_children)  # <- error
    return calls_print(node.left, p) + calls_print(node.right, p)


@rj.recursive_model(arity=2)
def recurses_on_itself(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return recurses_on_itself(node, p)  # <- error


@rj.recursive_model(arity=2)
def transposes_a_computed_matrix(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return (p.W @ p.W).T @ transposes_a_computed_matrix(node.left, p)  # <- error


@rj.recursive_model(arity=2)
def branches_on_a_field(node, p):
    if node.word > 3:  # <- error
        return p.E[node.word]
    return branches_on_a_field(node.left, p) + branches_on_a_field(node.right, p)


@rj.recursive_model(arity=None)
def reads_node_left_with_any_arity(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return reads_node_left_with_any_arity(node.left, p)  # <- error


@rj.recursive_model(arity=None)
def reads_a_per_child_value_after_the_loop(node, p):
    total = rj.zeros(3)
    for child in node.children:
        h = reads_a_per_child_value_after_the_loop(child, p)
        total = total + h
    return total * h  # <- error


@rj.recursive_model(arity=None)
def overwrites_instead_of_summing(node, p):
    last = 0
    for child in node.children:
        last = overwrites_instead_of_summing(child, p) * 2
    return rj.ones(3) + last  # <- error


@rj.recursive_model(arity=None)
def adds_the_same_value_for_every_child(node, p):
    if node.is_leaf:
        return p.E[node.word]
    total = rj.zeros(3)
    for child in node.children:  # <- error
        adds_the_same_value_for_every_child(child, p)
        total = total + rj.ones(3)
    return total


@rj.recursive_model(arity=None)
def returns_inside_the_children_loop(node, p):
    for child in node.children:  # <- error
        return returns_inside_the_children_loop(child, p)
    return p.E[node.word]


@rj.recursive_model(arity=None)
def indexes_the_childrens_states(node, p):
    states = [indexes_the_childrens_states(child, p) for child in node.children]
    if node.is_leaf:
        return p.E[node.word]
    return states[0]  # <- error


@rj.recursive_model(arity=2)
def raises_to_a_fractional_power(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return raises_to_a_fractional_power(node.left, p) ** 0.5  # <- error


@rj.recursive_model(arity=2)
def takes_the_max_of_two_vectors(node, p):
    if node.is_leaf:
        return p.E[node.word]
    return max(takes_the_max_of_two_vectors(node.left, p),  # <- error
               takes_the_max_of_two_vectors(node.right, p))


@pytest.mark.parametrize("model", [calls_print, recurses_on_itself,
                                   transposes_a_computed_matrix,
                                   branches_on_a_field, reads_node_left_with_any_arity,
                                   reads_a_per_child_value_after_the_loop,
                                   overwrites_instead_of_summing,
                                   adds_the_same_value_for_every_child,
                                   returns_inside_the_children_loop,
                                   indexes_the_childrens_states,
                                   raises_to_a_fractional_power,
                                   takes_the_max_of_two_vectors])
def test_an_unsupported_construct_raises_unsupported_error_at_its_line(model):
    forest = rj.Forest.from_nested([(0, 1)])
    p = rj.Params(E=np.ones((5, 3)), W=np.ones((3, 3)))
    with pytest.raises(rj.UnsupportedError) as info:
        model.run(forest, p)
    assert info.value.lineno == marked_line(model)
    assert info.value.filename == __file__


def test_a_function_without_source_is_refused_with_a_clear_error():
    namespace = {"rj": rj}
    exec("def cell(node, p):\n    return p.E[node.word]\n", namespace)
    model = rj.recursive_model(namespace["cell"])
    with pytest.raises(rj.UnsupportedError, match="cannot read the source"):
        model.analyse()


def test_the_decorated_function_stays_the_plain_recursion():
    forest = rj.Forest.from_nested([(0, 1)])
    p = rj.Params(E=np.arange(6.0).reshape(2, 3), W=np.eye(3), b=np.zeros(3))
    h = branches_on_a_tensor_element(rj.NodeView(forest, 0), p)
    assert np.allclose(h, -np.tanh(np.arange(3.0)))


def test_a_cell_defined_in_a_notebook_cell_is_read_from_the_line_cache():
    """IPython compiles each cell under a pseudo file name and registers its lines in
    linecache; that is all `inspect` needs."""
    import linecache
    filename = "<ipython-input-7-0123456789ab>"
    text = ("import recjit as rj\n\n@rj.recursive_model(arity=2)\ndef cell(node, p):\n"
            "    if node.is_leaf:\n        return p.E[node.word]\n"
            "    return rj.tanh(cell(node.left, p)[0:2] + cell(node.right, p)[0:2])\n")
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace = {}
    exec(compile(text, filename, "exec"), namespace)
    model = namespace["cell"]
    forest = rj.Forest.from_nested([((0, 1), 2)])
    p = rj.Params(E=np.arange(6.0).reshape(3, 2))
    result = model.run(forest, p)
    np.testing.assert_allclose(result.roots[0], model.reference(forest, p).roots[0], rtol=1e-6)


@rj.recursive_model(arity=2)
def raises_where_no_node_goes(node, p):
    if node.num_children > 2:
        raise ValueError("a binary tree")
    if node.is_leaf:
        return p.E[node.word]
    return raises_where_no_node_goes(node.left, p) + raises_where_no_node_goes(node.right, p)


@rj.recursive_model(arity=2)
def asserts_at_every_leaf(node, p):
    if node.is_leaf:
        assert node.word >= 0  # <- error
        return p.E[node.word]
    return asserts_at_every_leaf(node.left, p) + asserts_at_every_leaf(node.right, p)


def test_a_statement_outside_the_cell_language_compiles_in_a_branch_no_node_takes():
    """As in the plain recursion, which never runs it: the proof passes over it, and no
    structural case builds it."""
    forest = rj.Forest.from_nested([(0, (1, 2))])
    p = rj.Params(E=np.arange(15.0).reshape(5, 3))
    np.testing.assert_array_equal(raises_where_no_node_goes.run(forest, p).roots[0],
                                  raises_where_no_node_goes.reference(forest, p).roots[0])


def test_a_statement_outside_the_cell_language_is_refused_at_its_line_where_a_node_takes_it():
    forest = rj.Forest.from_nested([(0, 1)])
    with pytest.raises(rj.UnsupportedError, match="`Assert` statements") as info:
        asserts_at_every_leaf.run(forest, rj.Params(E=np.ones((5, 3))))
    assert info.value.lineno == marked_line(asserts_at_every_leaf)
