"""Random cell functions (issue 7): hypothesis writes binary-tree cell functions, valid ones and
ones with one mistake, into a module file and imports them. recjit either computes what the
naive recursion computes, or raises a `RecJitError` (pointing at a line, where the mistake
is in the source); never another exception. A valid cell always compiles."""
import hashlib
import importlib.util
import os
import tempfile

import numpy as np
from hypothesis import event, given, settings, strategies as st

import recjit as rj

from conftest import assert_same_result, binary_forests

HIDDEN, VOCAB = 3, 8
MODULES = tempfile.mkdtemp(prefix="recjit-fuzz-cells-")
FUNCTIONS = ("rj.tanh", "rj.sigmoid", "rj.relu")
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
}


@st.composite
def expressions(draw, atoms, depth=3):
    """A vector expression of size HIDDEN over `atoms`."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(atoms))
    kind = draw(st.sampled_from(["function", "operator", "product"]))
    inner = draw(expressions(atoms, depth - 1))
    if kind == "function":
        return f"{draw(st.sampled_from(FUNCTIONS))}({inner})"
    if kind == "operator":
        other = draw(expressions(atoms, depth - 1))
        return f"({inner} {draw(st.sampled_from(OPERATORS))} {other})"
    return f"(p.W{draw(st.integers(0, 1))} @ {inner})"


@st.composite
def cells(draw):
    """(source of a module defining `cell`, the mistake in it)."""
    leaf = draw(expressions(["p.E[node.word]", "p.b0"]))
    internal = draw(expressions(["hl", "hr", "p.b1"]))
    mistake = draw(st.sampled_from(sorted(MISTAKES)))
    line, where = MISTAKES[mistake]
    left = line if where == "left" else "hl = cell(node.left, p)"
    body = f"    {line}\n" if where == "body" else ""
    source = ("import numpy as np\n\nimport recjit as rj\n\n\n"
              "@rj.recursive_model(arity=2)\n"
              "def cell(node, p):\n"
              "    if node.is_leaf:\n"
              f"        return {leaf}\n"
              f"    {left}\n"
              "    hr = cell(node.right, p)\n"
              f"{body}"
              f"    return {internal}\n")
    return source, mistake


def load(source):
    """Import `source` from a file of its own, so that recjit can read the function back."""
    name = "fuzzed_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    path = os.path.join(MODULES, name + ".py")
    with open(path, "w") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cell


def parameters(seed):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(VOCAB, HIDDEN)), b0=rng.normal(size=HIDDEN),
                     b1=rng.normal(size=HIDDEN), W0=rng.normal(size=(HIDDEN, HIDDEN)) / 2,
                     W1=rng.normal(size=(HIDDEN, HIDDEN)) / 2,
                     W_wide=rng.normal(size=(HIDDEN, HIDDEN + 1)))


# Each new cell compiles a kernel (seconds): a bounded number of examples.
@settings(max_examples=14)
@given(cell=cells(), forest=binary_forests(VOCAB, max_trees=3, max_leaves=6),
       seed=st.integers(0, 2**32 - 1))
def test_a_random_cell_equals_the_recursion_or_raises_a_recjit_error(cell, forest, seed):
    source, mistake = cell
    p = parameters(seed)
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
    assert_same_result(result, model.reference(forest, p))
