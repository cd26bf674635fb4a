"""Random cell functions: hypothesis writes binary-tree cell functions, valid ones and
ones with one mistake, into a module file and imports them. recjit either computes what the
naive recursion computes, or raises a `RecJitError` (pointing at a line, where the mistake
is in the source); never another exception. A valid cell always compiles, and in float64 its
gradients are the recursion's finite differences."""
import tempfile

import numpy as np
from hypothesis import event, given, settings, strategies as st

import recjit as rj

from conftest import (assert_gradients_are_differences, assert_same_gradients, assert_same_result,
                      binary_forests, import_source, nary_forests)

HIDDEN, VOCAB = 3, 8
MODULES = tempfile.mkdtemp(prefix="recjit-fuzz-cells-")
FUNCTIONS = ("rj.tanh", "rj.sigmoid", "rj.relu", "rj.abs", "abs")
OPERATORS = ("+", "-", "*")
# A mistake: (what the cell function gets, where: "body" adds a line before the internal
# case's return, "left" replaces the left child's call).
MISTAKES = {
    "none": ("", None),
    "a while loop": ("while hl[0] > 10:\n        hl = hl * 0.5", "body"),
    "a print": ("print(hl)", "body"),
    "a lambda": ("halve = lambda v: v * 0.5", "body"),
    "a list comprehension": ("pair = [hl for _ in range(2)]", "body"),
    "numpy instead of rj": ("hl = np.tanh(hl)", "body"),
    "an item assignment": ("hl[0] = 1.0", "body"),
    "a try statement": ("try:\n        hl = hl\n    except ValueError:\n        pass", "body"),
    "a missing parameter": ("hl = hl + p.missing", "body"),
    "a wrongly shaped product": ("hl = p.W_wide @ hl", "body"),
    "recursion on the node itself": ("hl = cell(node, p)", "left"),
    "recursion on a grandchild": ("hl = cell(node.left.left, p)", "left"),
    "a call result reused as a node": ("hl = cell(hr, p)", "body"),
    "an update in place": ("hl += hr", "body"),  # of a child's state, or of a cell's own sum
}


@st.composite
def expressions(draw, atoms, depth=3):
    """A vector expression of size HIDDEN over `atoms`: every elementwise function and
    operator of the cell language, constants, scalar parameters, slices and concatenation,
    products with a parameter read as it is or transposed, inner products."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(atoms))
    kind = draw(st.sampled_from(["function", "operator", "product", "scaled", "divided",
                                 "softplus", "bounded", "negated", "rotated", "powered",
                                 "scored"]))
    inner = draw(expressions(atoms, depth - 1))
    if kind == "scored":  # by a number: an inner product, bounded
        return f"(rj.tanh({inner} @ {draw(expressions(atoms, depth - 1))}) * {inner})"
    if kind == "scaled":  # by a scalar parameter
        return f"({inner} * p.s)"
    if kind == "divided":  # by something that stays away from 0
        return f"({inner} / (1.5 + rj.sigmoid({draw(expressions(atoms, depth - 1))})))"
    if kind == "softplus":
        return f"rj.log(1.0 + rj.exp(-rj.relu({inner})))"
    if kind == "bounded":
        return f"{draw(st.sampled_from(['rj.maximum', 'rj.minimum']))}({inner}, 0.25)"
    if kind == "powered":  # of a bounded value, so that the powers stay finite; not `** 0`,
        # ones, which would make a child's term the same for every child (refused by design)
        return f"(rj.tanh({inner}) ** {draw(st.integers(1, 3))})"
    if kind == "negated":
        return f"(2 - -{inner})"
    if kind == "rotated":  # slices and a concatenation
        return f"rj.concat([{inner}[1:3], {inner}[0:1]])"
    if kind == "function":
        return f"{draw(st.sampled_from(FUNCTIONS))}({inner})"
    if kind == "operator":
        other = draw(expressions(atoms, depth - 1))
        return f"({inner} {draw(st.sampled_from(OPERATORS))} {other})"
    weight = f"p.W{draw(st.integers(0, 1))}"  # times a vector, read transposed or not
    return draw(st.sampled_from([f"({weight} @ {inner})", f"({inner} @ {weight})",
                                 f"({weight}.T @ {inner})"]))


@st.composite
def cells(draw):
    """(source of a module defining `cell`, the mistake in it). A binary cell reads `hl` and
    `hr`; a child-sum cell (any arity) sums a per-child expression of `h_k` into `hl` (or, in
    a loop, takes their running maximum or minimum), and reads `hr` = the plain sum of its
    children's states, in a loop or over a list of them. The
    per-child expression always reads `h_k`: adding the same value for every child is refused
    by design (a clear UnsupportedError, tested in test_properties), not a valid cell."""
    leaf = draw(expressions(["p.E[node.word]", "p.b0"]))
    internal = draw(expressions(["hl", "hr", "p.b1"]))
    mistake = draw(st.sampled_from(sorted(MISTAKES)))
    line, where = MISTAKES[mistake]
    body = f"    {line}\n" if where == "body" else ""
    header = "import numpy as np\n\nimport recjit as rj\n\n\n"
    if draw(st.booleans()):
        left = line if where == "left" else "hl = cell(node.left, p)"
        return (header + "@rj.recursive_model(arity=2)\n"
                "def cell(node, p):\n"
                "    if node.is_leaf:\n"
                f"        return {leaf}\n"
                f"    {left}\n"
                "    hr = cell(node.right, p)\n"
                f"{body}"
                f"    return {internal}\n"), mistake, 2
    per_child = draw(expressions(["h_k", "p.b1"], depth=2))
    if "h_k" not in per_child:
        per_child = f"({per_child} + h_k)"
    call = "cell(child, p)" if where != "left" else line.split(" = ")[1]
    if draw(st.booleans()):  # a loop that accumulates: a sum, or a running maximum or minimum
        update = draw(st.sampled_from([f"hl + {per_child}", f"rj.maximum(hl, {per_child})",
                                       f"np.minimum({per_child}, hl)"]))
        sums = ("    hl = rj.zeros(p.b0.shape)\n"
                "    hr = rj.zeros(p.b0.shape)\n"
                "    for child in node.children:\n"
                f"        h_k = {call}\n"
                f"        hl = {update}\n"
                "        hr = hr + h_k\n")
    else:  # the same sums over a list of the children's states
        sums = (f"    states = [{call} for child in node.children]\n"
                f"    hl = sum(({per_child} for h_k in states), rj.zeros(p.b0.shape))\n"
                "    hr = sum(states, rj.zeros(p.b0.shape))\n")
    return (header + "@rj.recursive_model(arity=None)\n"
            "def cell(node, p):\n"
            "    if node.is_leaf:\n"
            f"        return {leaf}\n"
            f"{sums}"
            f"{body}"
            f"    return {internal}\n"), mistake, None


def load(source):
    return import_source(source, MODULES, "fuzzed_").cell


def parameters(seed, dtype):
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (scale * rng.normal(size=shape)).astype(dtype)

    return rj.Params(E=normal(VOCAB, HIDDEN), b0=normal(HIDDEN), b1=normal(HIDDEN),
                     W0=normal(HIDDEN, HIDDEN, scale=0.5), W1=normal(HIDDEN, HIDDEN, scale=0.5),
                     W_wide=normal(HIDDEN, HIDDEN + 1), s=normal())


# Each new cell compiles a kernel (seconds): a bounded number of examples.
@settings(max_examples=14)
@given(cell=cells(), binary=binary_forests(VOCAB, max_trees=3, max_leaves=6),
       nary=nary_forests(VOCAB, max_trees=3, max_leaves=6, max_children=3),
       dtype=st.sampled_from(["float64", "float32"]), seed=st.integers(0, 2**32 - 1))
def test_a_random_cell_equals_the_recursion_or_raises_a_recjit_error(cell, binary, nary, dtype,
                                                                    seed):
    source, mistake, arity = cell
    forest = binary if arity == 2 else nary
    p = parameters(seed, dtype)
    event(mistake)
    try:
        model = load(source)
        result = model.run(forest, p)
    except rj.RecJitError as error:
        assert mistake != "none", f"a valid cell was refused: {error}\n{source}"
        if isinstance(error, rj.errors.SourceLocated) and error.lineno is not None:
            assert error.filename.startswith(MODULES), error
        event(f"{mistake}: {type(error).__name__}")
        return
    event(f"{mistake}: compiled")
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == "float32" else {}
    reference = model.reference(forest, p)
    assert_same_result(result, reference, **tolerance)
    # and its gradients are the recursion's, where finite differences can tell (states that
    # square themselves up a tree reach 1e12, where a step of 1e-6 is lost)
    if dtype == "float64" and all(np.abs(state).max() < 1e3 for state in reference.nodes):
        assert_gradients_are_differences(model, forest, p, seed)


@st.composite
def cells_with_leaf_products(draw):
    """A binary cell whose leaf multiplies its word's embedding by a parameter somewhere: the
    leaves the CPU's backward may sum by word before their products."""
    leaf = draw(expressions(["(p.W0 @ p.E[node.word])", "(p.E[node.word] @ p.W1)", "p.b0"]))
    if "node.word" not in leaf:
        leaf = f"({leaf} + p.W0 @ p.E[node.word])"
    internal = draw(expressions(["hl", "hr", "p.b1"], depth=1))
    return ("import numpy as np\n\nimport recjit as rj\n\n\n"
            "@rj.recursive_model(arity=2)\n"
            "def cell(node, p):\n"
            "    if node.is_leaf:\n"
            f"        return {leaf}\n"
            "    hl = cell(node.left, p)\n"
            "    hr = cell(node.right, p)\n"
            f"    return {internal}\n")


@settings(max_examples=5)
@given(source=cells_with_leaf_products(),
       forest=binary_forests(4, max_trees=3, max_leaves=8), seed=st.integers(0, 2**32 - 1),
       per_tree=st.booleans())
def test_a_random_leafs_gradients_summed_by_word_are_the_adjoints(source, forest, seed,
                                                                  per_tree):
    """Leaves of four words: most words repeat, and where the leaf's effects allow it the
    backward sums their rows by word (by tree and word, per tree) before its products."""
    model = load(source)
    out, pullback = model.vjp(forest, parameters(seed, "float64"))
    event(f"summed by word: {pullback.compiled.kernel.group_key is not None}")
    rng = np.random.default_rng(seed)
    roots, nodes = (rng.normal(size=states[0].shape) for states in (out.roots, out.nodes))
    assert_same_gradients(pullback(roots=roots, nodes=nodes, per_tree=per_tree),
                          pullback.interpreted()(roots=roots, nodes=nodes, per_tree=per_tree),
                          rtol=1e-9, atol=1e-11, note=f"\n{source}")
