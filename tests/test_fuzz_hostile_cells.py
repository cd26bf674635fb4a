"""Hostile cells: hypothesis writes cells that use what an adversarial pass found recjit getting
wrong (decorated helpers, updates in place of arrays other names share through loops,
comprehensions, views and sums, infinite and NaN constants, operations that make NaN and
infinities, values read from outside that change between runs). A run equals the plain
recursion, NaN for NaN and infinity for infinity, or raises a `RecJitError` located in the
cell's file; never a silent disagreement."""
import tempfile

import numpy as np
from hypothesis import event, given, settings, strategies as st

import recjit as rj

from conftest import assert_same_result, binary_forests, import_source

HIDDEN, VOCAB = 3, 6
MODULES = tempfile.mkdtemp(prefix="recjit-hostile-cells-")
HEADER = '''import functools
import math
from types import SimpleNamespace

import numpy as np

import recjit as rj

INF, NEG_INF, NAN = math.inf, -math.inf, float("nan")
CONFIGS = [SimpleNamespace(scale=1.0)]
WEIGHTS = [0.5]


def doubled(function):
    @functools.wraps(function)
    def wrapper(h):
        return 2.0 * function(h)
    return wrapper


def doubled_any(function):
    @functools.wraps(function)
    def wrapper(*args):
        return 2.0 * function(*args)
    return wrapper


def weighted(h, weights=WEIGHTS):
    return weights[0] * h


@doubled
def wrapped(h):
    return h - 0.25


@doubled_any
def wrapped_any(h):
    return h - 0.25


'''
# Expressions of a vector `x`, each hostile in its own way.
HOSTILE = ("rj.maximum({x}, NAN)", "rj.minimum(NEG_INF, {x})", "rj.maximum(p.b, rj.log({x}))",
           "rj.minimum(rj.sqrt({x}), p.b)", "rj.relu(rj.log({x}))", "rj.exp(INF * {x})",
           "({x} * INF - {x} * INF)", "({x} + NAN * 0.0)", "CONFIGS[0].scale * {x}",
           "weighted({x})", "wrapped({x})", "wrapped_any({x})", "rj.tanh({x})",
           "(p.W @ {x})", "({x} @ p.W)")
# Lines that may let `a` out before `a` is updated in place (or keep it its own).
ALIASES = ("for b in (a,):\n        pass", "bs = [a for _ in range(1)]\n    b = bs[0]",
           "b = a.T", "b = sum((), a)", "b = (a, p.b)[0]", "b = weighted(a)", "b = a[0:3]",
           "b = a * 1.0", "b = rj.tanh(a)", "b = sum([a, a])")
UPDATES = ("a += p.b", "a -= b", "a *= p.b", "a = a + p.b")


@st.composite
def expressions(draw, atom, depth=2):
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return atom
    inner = draw(expressions(atom, depth - 1))
    return draw(st.sampled_from(HOSTILE)).format(x=inner)


@st.composite
def cells(draw):
    leaf = draw(expressions("p.E[node.word]", depth=1))
    combined = draw(expressions("(cell(node.left, p) + cell(node.right, p))"))
    alias, update = draw(st.sampled_from(ALIASES)), draw(st.sampled_from(UPDATES))
    result = draw(expressions("(a + b)"))
    return (HEADER + "@rj.recursive_model(arity=2)\n"
            "def cell(node, p):\n"
            "    if node.is_leaf:\n"
            f"        return {leaf}\n"
            f"    a = {combined} * 1.0\n"
            f"    {alias}\n"
            f"    {update}\n"
            f"    return {result}\n")


def parameters(seed, dtype):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(VOCAB, HIDDEN)).astype(dtype),
                     W=rng.normal(size=(HIDDEN, HIDDEN)).astype(dtype),
                     b=rng.normal(size=HIDDEN).astype(dtype))


def run_or_refuse(model, forest, p, schedule):
    """The run's result if it equals the recursion's, None if recjit refused the cell at a
    line of its file."""
    try:
        result = model.run(forest, p, schedule=schedule)
    except rj.RecJitError as error:
        if isinstance(error, rj.errors.SourceLocated) and error.lineno is not None:
            assert error.filename.startswith(MODULES), error
        event(f"refused: {type(error).__name__}")
        return None
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if p.E.dtype == np.float32 else {}
    assert_same_result(result, model.reference(forest, p), **tolerance)
    event("equals the recursion")
    return result


# Each new cell compiles a kernel: a bounded number of examples, in exact kernels (every
# float64 one, float32 without fast math: fast math assumes no NaN or infinity).
@settings(max_examples=12)
@given(source=cells(), forest=binary_forests(VOCAB, max_trees=3, max_leaves=5),
       dtype=st.sampled_from(["float64", "float32"]), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1.0, 3.0, -0.5, float("inf")]))
def test_a_hostile_cell_equals_the_recursion_or_is_refused_at_its_line(source, forest, dtype,
                                                                      seed, scale):
    module = import_source(source, MODULES, "hostile_")
    p = parameters(seed, dtype)
    schedule = rj.Schedule(fast_math=False)
    with np.errstate(all="ignore"):
        if run_or_refuse(module.cell, forest, p, schedule) is None:
            return
        module.CONFIGS[0].scale = scale  # values read from outside change between runs
        module.WEIGHTS[0] = -scale
        run_or_refuse(module.cell, forest, p, schedule)
