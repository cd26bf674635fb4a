"""Shared strategies: random forests and parameters. Kernels compile once per shape signature
and are reused across hypothesis examples (hidden sizes are fixed per test)."""
import hashlib
import importlib.util
import os
import shutil
import sys

# Without a GPU, the CUDA tests run the generated kernels in numba's simulator; with one (an
# `nvidia-smi` on the path), on the GPU. NUMBA_ENABLE_CUDASIM set by the caller wins. numba
# reads it when first imported, so this comes before anything imports numba.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np
from hypothesis import HealthCheck, settings, strategies as st

import recjit as rj
from recjit.linearize import random_bracketing

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "examples")))



def refuse_numpy_grid_sizes_in_the_simulator():
    """numba-cuda on a GPU refuses a NumPy integer as a launch's grid or block size, which the
    simulator takes: make the simulator as strict, so that such a launch fails here too."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    configure = FakeCUDAKernel.__getitem__

    def strict(kernel, configuration):
        for size in configuration[:2]:
            for extent in size if isinstance(size, tuple) else (size,):
                if not isinstance(extent, int):
                    raise TypeError(f"a launch's grid and block sizes must be Python ints, as "
                                     f"on a GPU; got {extent!r}")
        return configure(kernel, configuration)

    FakeCUDAKernel.__getitem__ = strict


if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    refuse_numpy_grid_sizes_in_the_simulator()


def pytest_collection_modifyitems(config, items):
    """The tests named in the file `RECJIT_TESTS_FIRST` (a test id a line) run first, in
    collection order, then the rest: a GPU session runs those no GPU has passed yet before
    the others (tools/gpu_pending_tests.py)."""
    path = os.environ.get("RECJIT_TESTS_FIRST")
    if path and os.path.exists(path):
        with open(path) as listed:
            first = set(listed.read().splitlines())
        items.sort(key=lambda item: item.nodeid not in first)

settings.register_profile("recjit", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("recjit")

seeds = st.integers(0, 2**32 - 1)
scales = st.floats(0.1, 2.0)


@st.composite
def binary_forests(draw, vocab_size=50, max_trees=30, max_leaves=24):
    """1–30 random binary trees, single nodes among them."""
    leaf_counts = draw(st.lists(st.integers(1, max_leaves), min_size=1, max_size=max_trees))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    words = [[int(w) for w in rng.integers(0, vocab_size, n)] for n in leaf_counts]
    return rj.Forest.from_nested([random_bracketing(w, rng) for w in words])


def caterpillar(depth, vocab_size):
    """A left-deep binary tree of the given depth: the deepest recursion per node count."""
    tree = 0
    for level in range(depth):
        tree = (tree, (level + 1) % vocab_size)
    return rj.Forest.from_nested([tree])


def assert_same_result(compiled, reference, rtol=1e-5, atol=1e-6):
    """Compiled equals reference within `rtol` relative (plus `atol` for values near zero),
    per node and per root."""
    assert len(compiled.nodes) == len(reference.nodes)
    for got, want in zip(compiled.nodes + compiled.roots, reference.nodes + reference.roots):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@st.composite
def nary_forests(draw, vocab_size=50, max_trees=12, max_leaves=20, max_children=6):
    """Trees whose internal nodes have 1–`max_children` children (leaves have 0), built by
    grouping random runs of adjacent subtrees, as child-sum models take them."""
    leaf_counts = draw(st.lists(st.integers(1, max_leaves), min_size=1, max_size=max_trees))
    rng = np.random.default_rng(draw(seeds))
    trees = []
    for count in leaf_counts:
        items = [int(w) for w in rng.integers(0, vocab_size, count)]
        wrap_single = bool(rng.integers(0, 2))
        while len(items) > 1 or (wrap_single and not isinstance(items[0], tuple)):
            size = int(rng.integers(1, min(max_children, len(items)) + 1))
            start = int(rng.integers(0, len(items) - size + 1))
            items[start:start + size] = [tuple(items[start:start + size])]
        trees.append(items[0])
    return rj.Forest.from_nested(trees)


@st.composite
def random_dags(draw, features, max_nodes=40, max_children=4):
    """DAGs in which node n reads 0–`max_children` nodes numbered after it, so a node has
    several parents; a vector field `x` of `features` per node."""
    num_nodes = draw(st.integers(1, max_nodes))
    rng = np.random.default_rng(draw(seeds))
    edges = []
    for node in range(num_nodes - 1):
        later = np.arange(node + 1, num_nodes)
        count = int(rng.integers(0, min(max_children, later.size) + 1))
        edges += [(node, int(c)) for c in rng.choice(later, count, replace=False)]
    x = rng.normal(size=(num_nodes, features))
    return rj.Forest.from_edges(num_nodes, edges, fields={"x": x}, kind="dag")


@st.composite
def word_sequences(draw, vocab_size=50, max_length=300, max_sequences=4):
    """1–4 chains of 1–300 steps with a word per step."""
    lengths = draw(st.lists(st.integers(1, max_length), min_size=1, max_size=max_sequences))
    rng = np.random.default_rng(draw(seeds))
    return rj.Forest.from_sequences(lengths, fields={"word": rng.integers(0, vocab_size,
                                                                          sum(lengths))})


@rj.recursive_model(kind="sequence")
def time_aware_rnn(step, p):
    """A float scalar field, a number per step (`step.dt`): the CPU and CUDA tests'."""
    decay = rj.exp(-step.dt * p.alpha * p.alpha)
    if step.is_leaf:
        return rj.tanh(p.E[step.word]) * decay
    h = time_aware_rnn(step.children[0], p)
    return rj.tanh(p.W @ (h * decay) + p.E[step.word] + step.dt)


def with_time_steps(forest, seed):
    """`forest` with a field `dt` of one number in [0, 2) per node."""
    dt = np.random.default_rng(seed).uniform(0, 2, forest.num_nodes)
    return rj.Forest(forest.child_ptr, forest.child_idx, forest.roots, kind=forest.kind,
                     fields={**forest.fields, "dt": dt})


@rj.recursive_model(arity=2)
def scaled_rnn(node, p):
    """A scalar parameter scales a vector and is added to one (the CPU and CUDA tests')."""
    if node.is_leaf:
        return p.E[node.word] * p.alpha
    return rj.tanh(p.W @ (scaled_rnn(node.left, p) + scaled_rnn(node.right, p)) + p.alpha)


@rj.recursive_model(arity=2)
def powered_rnn(node, p):
    """Constant integer powers, `x ** k` (the CPU and CUDA tests')."""
    if node.is_leaf:
        return p.E[node.word] ** 2
    hl, hr = powered_rnn(node.left, p), powered_rnn(node.right, p)
    return rj.tanh(p.W @ hl ** 3 + hr ** 0 - p.alpha ** 2 / (1 + hr ** 2) ** -1)


@rj.recursive_model(arity=2)
def row_major_rnn(node, p):
    """Weights stored (inputs, outputs), as NumPy code often keeps them: `x @ p.W` and
    `p.V.T @ h` read the parameters transposed (the CPU and CUDA tests')."""
    if node.is_leaf:
        return rj.tanh(p.E[node.word] @ p.W + p.b)
    hl, hr = row_major_rnn(node.left, p), row_major_rnn(node.right, p)
    return rj.tanh(hl @ p.U + p.V.T @ hr + p.b)


@rj.recursive_model(arity=2)
def transposed_mv_rnn(node, p):
    """A (vector, matrix) state multiplied by parameters read transposed, on either side of
    a computed matrix (the CPU and CUDA tests')."""
    if node.is_leaf:
        return p.E[node.word], p.M
    a, A = transposed_mv_rnn(node.left, p)
    b, B = transposed_mv_rnn(node.right, p)
    h = rj.tanh(p.W.T @ rj.concat([B @ a, A @ b]))
    return h, rj.tanh(p.V.T @ (A + B) + (A @ p.V.T) * 0.5 + B @ p.U)


@rj.recursive_model(arity=None)
def child_sum_mv(node, p):
    """Matrix states, each child's multiplied by a parameter on either side and summed: a
    weight gradient over the rows of two matrices an edge (the CPU and CUDA tests')."""
    if node.is_leaf:
        return p.M
    total = rj.zeros(p.M.shape)
    for child in node.children:
        state = child_sum_mv(child, p)
        total = total + (p.V @ state + state @ p.U.T)
    return rj.tanh(total)


def child_sum_mv_params(hidden, vocab_size, seed):
    rng = np.random.default_rng(seed)
    return rj.Params(**{name: rng.normal(size=(hidden, hidden)) / hidden
                        for name in ("M", "V", "U")})


def transposed_mv_params(hidden, vocab_size, seed):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(vocab_size, hidden)),
                     **{name: rng.normal(size=shape) / np.sqrt(shape[0])
                        for name, shape in [("M", (hidden, hidden)), ("W", (2 * hidden, hidden)),
                                            ("V", (hidden, hidden)), ("U", (hidden, hidden))]})


def row_major_params(hidden, vocab_size, seed, inputs=None, dtype=np.float64):
    """`row_major_rnn`'s parameters; `inputs`: the embeddings' width (default `hidden`)."""
    rng = np.random.default_rng(seed)
    inputs = inputs or hidden
    return rj.Params(E=rng.normal(size=(vocab_size, inputs)).astype(dtype),
                     **{name: (rng.normal(size=shape) / np.sqrt(shape[0])).astype(dtype)
                        for name, shape in [("W", (inputs, hidden)), ("U", (hidden, hidden)),
                                            ("V", (hidden, hidden)), ("b", (hidden,))]})


@rj.recursive_model(arity=None)
def attentive_child_sum(node, p):
    """Attention over any number of children: a score per child from an inner product, the
    children's states weighted by their scores; and an inner product of the node's own
    value (the CPU and CUDA tests')."""
    if node.is_leaf:
        return rj.tanh(p.W @ p.E[node.word])
    states = [attentive_child_sum(c, p) for c in node.children]
    scores = [rj.exp(np.dot(p.a, h)) for h in states]
    total = sum(score * h for score, h in zip(scores, states)) / sum(scores)
    return rj.tanh(p.U @ total + (total @ total) * p.a)


def attentive_params(hidden, vocab_size, seed):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(vocab_size, hidden)),
                     a=rng.normal(size=hidden) / np.sqrt(hidden),
                     W=rng.normal(size=(hidden, hidden)) / np.sqrt(hidden),
                     U=rng.normal(size=(hidden, hidden)) / np.sqrt(hidden))


@rj.recursive_model(arity=None)
def child_mean(node, p):
    """The mean of any number of children's states: `node.num_children` and
    `len(node.children)` as numbers per node (the CPU and CUDA tests')."""
    if node.is_leaf:
        return p.E[node.word]
    total = rj.zeros(p.b.shape)
    for child in node.children:
        total = total + child_mean(child, p)
    return rj.tanh(p.W @ (total / node.num_children) + p.b * len(node.children))


@rj.recursive_model(arity=None)
def gated_child_list(node, p):
    """A child-sum cell written with lists of the children's states, as people port them:
    a comprehension of the recursive calls, another of a gate per child, a `zip` of both,
    and the children's mean, safe at a leaf with Python's `max` (the CPU and CUDA tests')."""
    states = [gated_child_list(child, p) for child in node.children]
    gates = [rj.sigmoid(p.W @ h) for h, _ in states]
    remembered = rj.zeros(p.b.shape)
    for gate, (_, c) in zip(gates, states):
        remembered = remembered + gate * c
    x = p.E[node.word] if node.is_leaf else 0
    h_mean = sum((h for h, _ in states), rj.zeros(p.b.shape)) / max(len(states), 1)
    c = rj.tanh(x + p.W @ h_mean + p.b * len(states)) + remembered
    return rj.tanh(c), c


@rj.recursive_model(arity=None)
def max_pooled(node, p):
    """Max-pooling over any number of children: a running `rj.maximum` from zeros, the
    running value first, so the start and then the earlier children win a tie (the CPU and
    CUDA tests')."""
    pooled = rj.zeros(p.b.shape)
    for child in node.children:
        pooled = rj.maximum(pooled, max_pooled(child, p))
    x = p.E[node.word] if node.is_leaf else 0
    return rj.tanh(x + p.W @ pooled + p.b)


@rj.recursive_model(arity=None)
def min_pooled(node, p):
    """A running `rj.minimum` over a list of the children's states, each child's value the
    first operand, so the later children win a tie."""
    states = [min_pooled(child, p) for child in node.children]
    low = rj.ones(p.b.shape)
    for h in states:
        low = rj.minimum(rj.tanh(p.W @ h), low)
    x = p.E[node.word] if node.is_leaf else 0
    return rj.tanh(x + low + p.b)


@rj.recursive_model(arity=None)
def tree_convolution(node, p):
    """Tree-based convolution (Mou et al. 2016): each child's weight mixes two matrices by
    its place among any number of children (`enumerate(node.children)`), summed by one
    update of two terms (the CPU and CUDA tests')."""
    total = rj.zeros(p.b.shape)
    for place, child in enumerate(node.children):
        h = tree_convolution(child, p)
        right = place / max(node.num_children - 1, 1)
        total = total + (1 - right) * (p.W @ h) + right * (p.W.T @ h)
    x = p.E[node.word] if node.is_leaf else 0
    return rj.tanh(x + total + p.b)


def vector_rnn_params(hidden, vocab_size, seed):
    """E, W and b of a small vector cell (child_mean's, and the CPU tests' that need no more)."""
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(vocab_size, hidden)),
                     W=rng.normal(size=(hidden, hidden)) / 2, b=rng.normal(size=hidden) / 4)


def scaled_rnn_params(hidden, vocab_size, seed):
    rng = np.random.default_rng(seed)
    return rj.Params(E=rng.normal(size=(vocab_size, hidden)),
                     W=rng.normal(size=(hidden, hidden)) / 2, alpha=np.float64(rng.normal()))


def import_source(source, directory, prefix):
    """Import `source` from a file of its own in `directory` (named by its digest), so that
    recjit can read the functions in it back."""
    name = prefix + hashlib.sha256(source.encode()).hexdigest()[:16]
    path = os.path.join(directory, name + ".py")
    with open(path, "w") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Gradients against central finite differences of the plain recursion (float64) ----------
STEP = 1e-6


def cotangents(shapes, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=shape) for shape in shapes)


def weighted_sum(result, roots, nodes):
    """Σ roots · result.roots + Σ nodes · result.nodes: what the pullback differentiates."""
    return sum(float((got * weight).sum()) for got, weight in zip(result.roots, roots)) + sum(
        float((got * weight).sum()) for got, weight in zip(result.nodes, nodes))


def finite_difference(loss, value):
    """The central difference of `loss(v)` at every element of array `value`."""
    value = np.asarray(value, dtype=np.float64)
    gradient = np.zeros_like(value)
    for index in np.ndindex(value.shape):
        up, down = value.copy(), value.copy()
        up[index] += STEP
        down[index] -= STEP
        gradient[index] = (loss(up) - loss(down)) / (2 * STEP)
    return gradient


def assert_same_gradients(got, expected, rtol=1e-10, atol=1e-12, note=""):
    """Two `Gradients` alike: every parameter's (per tree, a gathered table's `RowGrad` a
    tree), every field's."""
    for name in sorted(vars(expected.params)):
        own_rows, their_rows = (getattr(gradients.params, name) for gradients in (got, expected))
        if not isinstance(their_rows, list):  # per tree, a table's gradient is a list
            own_rows, their_rows = [own_rows], [their_rows]
        for own, theirs in zip(own_rows, their_rows, strict=True):
            np.testing.assert_allclose(np.asarray(own), np.asarray(theirs), rtol=rtol,
                                       atol=atol, err_msg=f"parameter {name}{note}")
    for name in expected.fields:
        np.testing.assert_allclose(got.fields[name], expected.fields[name], rtol=rtol,
                                   atol=atol, err_msg=f"field {name}{note}")


def assert_gradients_are_differences(model, forest, p, seed, context=()):
    """Every gradient of one pullback against central differences of the plain recursion."""
    out, pullback = model.vjp(forest, p, context=context)
    roots = cotangents([state.shape for state in out.roots], seed)
    nodes = cotangents([state.shape for state in out.nodes], seed + 1)
    gradients = pullback(roots=roots if len(roots) > 1 else roots[0],
                         nodes=nodes if len(nodes) > 1 else nodes[0])
    weights = {name: getattr(p, name) for name in vars(p)}

    def loss_of_parameter(name):
        def loss(value):
            changed = rj.Params(**{**weights, name: value if np.ndim(weights[name])
                                   else float(value)})
            return weighted_sum(model.reference(forest, changed, context=context), roots, nodes)
        return loss

    for name in sorted(vars(gradients.params)):
        expected = finite_difference(loss_of_parameter(name), weights[name])
        np.testing.assert_allclose(np.asarray(getattr(gradients.params, name)), expected,
                                   rtol=1e-4, atol=1e-6, err_msg=f"parameter {name}")
    for name, got in gradients.fields.items():
        def loss(value, name=name):
            changed = rj.Forest(forest.child_ptr, forest.child_idx, forest.roots,
                                {**forest.fields, name: value}, forest.kind)
            return weighted_sum(model.reference(changed, p, context=context), roots, nodes)
        np.testing.assert_allclose(got, finite_difference(loss, forest.fields[name]),
                                   rtol=1e-4, atol=1e-6, err_msg=f"field {name}")
    for position, got in enumerate(gradients.context):
        def loss(value, position=position):
            changed = list(context)
            changed[position] = value if np.ndim(context[position]) else float(value)
            return weighted_sum(model.reference(forest, p, context=tuple(changed)), roots,
                                nodes)
        np.testing.assert_allclose(np.asarray(got), finite_difference(loss, context[position]),
                                   rtol=1e-4, atol=1e-6, err_msg=f"context {position}")
    return gradients
