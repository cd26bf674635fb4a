"""The zoo's cells as a peer's user writes them, once for every framework: each takes `o` (the
framework's ops), the parameters `p` and a `node` (one node in the eager peers, one level of
nodes in the level-batched peer). A node offers `is_leaf`, its fields (`node.word`),
`children` (the child states, fixed arity) and `sum(f)` (Σ over the children of f(state)).

The arithmetic is that of the recjit examples; where a state starts at zero (a leaf's child sum,
a sequence's first step) the zero terms are left out, as a user writing the cell would."""
from .levels import children_first


def tree_fc(o, p, node):
    if node.is_leaf:
        return o.row(p.E, node.word)
    left, right = node.children
    return o.tanh(o.linear(p.W, o.cat([left, right])) + p.b)


def tree_rnn(o, p, node):
    if node.is_leaf:
        return o.row(p.E, node.word)
    left, right = node.children
    return o.tanh(o.linear(p.W, left) + o.linear(p.U, right) + p.b)


def tree_lstm(o, p, node):
    if node.is_leaf:
        i, out, u = o.split(o.linear(p.W_iou, o.row(p.E, node.word)) + p.b_iou, 3)
        c = o.mul(o.sigmoid(i), o.tanh(u))
    else:
        i, out, u = o.split(o.linear(p.U_iou, node.sum(lambda h, c: h)) + p.b_iou, 3)
        forgotten = node.sum(lambda h, c: o.mul(o.sigmoid(o.linear(p.U_f, h) + p.b_f), c))
        c = o.mul(o.sigmoid(i), o.tanh(u)) + forgotten
    return o.mul(o.sigmoid(out), o.tanh(c)), c


def _gru_parts(o, p, node):
    """(summed child state or None at a leaf, update gate z, candidate state)."""
    if node.is_leaf:
        x_z, x_h = o.split(o.linear(p.W_zh, o.row(p.E, node.word)), 2)
        return None, o.sigmoid(x_z + p.b_z), o.tanh(x_h + p.b_h)
    h_sum = node.sum(lambda h: h)
    gated = node.sum(lambda h: o.mul(o.sigmoid(o.linear(p.U_r, h) + p.b_r), h))
    return (h_sum, o.sigmoid(o.linear(p.U_z, h_sum) + p.b_z),
            o.tanh(o.linear(p.U_h, gated) + p.b_h))


def tree_gru(o, p, node):
    h_sum, z, candidate = _gru_parts(o, p, node)
    kept = o.mul(o.one_minus(z), candidate)
    return kept if h_sum is None else o.mul(z, h_sum) + kept


def simple_tree_gru(o, p, node):
    _, z, candidate = _gru_parts(o, p, node)
    return o.mul(o.one_minus(z), candidate)


def dag_rnn(o, p, node):
    x = o.linear(p.W, o.vector(node.x)) + p.b
    if node.is_leaf:
        return o.relu(x)
    return o.relu(x + o.linear(p.U, node.sum(lambda h: h)))


def mv_rnn(o, p, node):
    if node.is_leaf:
        return o.row(p.E, node.word), o.row(p.E_M, node.word)
    (a, A), (b, B) = node.children
    return (o.tanh(o.linear(p.W, o.cat([o.matvec(B, a), o.matvec(A, b)]))),
            o.matmul(p.W_M, o.cat_rows([A, B])))


def lstm(o, p, step):
    x = o.linear(p.W, o.row(p.E, step.word)) + p.b
    if step.is_leaf:
        i, _, out, u = o.split(x, 4)
        c = o.mul(o.sigmoid(i), o.tanh(u))
    else:
        ((h_prev, c_prev),) = step.children
        i, f, out, u = o.split(x + o.linear(p.U, h_prev), 4)
        c = o.mul(o.sigmoid(f), c_prev) + o.mul(o.sigmoid(i), o.tanh(u))
    return o.mul(o.sigmoid(out), o.tanh(c)), c


def gru(o, p, step):
    x_z, x_r, x_h = o.split(o.linear(p.W, o.row(p.E, step.word)) + p.b, 3)
    if step.is_leaf:
        return o.mul(o.sigmoid(x_z), o.tanh(x_h))
    (h_prev,) = step.children
    h_z, h_r = o.split(o.linear(p.U_zr, h_prev), 2)
    z = o.sigmoid(x_z + h_z)
    candidate = o.tanh(x_h + o.linear(p.U_h, o.mul(o.sigmoid(x_r + h_r), h_prev)))
    return o.mul(o.one_minus(z), h_prev) + o.mul(z, candidate)


CELLS = {cell.__name__: cell for cell in (tree_fc, tree_rnn, tree_lstm, tree_gru,
                                          simple_tree_gru, dag_rnn, mv_rnn, lstm, gru)}


def as_tuple(state):
    return state if isinstance(state, tuple) else (state,)


class EagerNode:
    """One node of the eager recursion; its children's states are already in `memo`."""

    def __init__(self, forest, node, memo, fields):
        self.children = [memo[int(child)] for child in forest.children(node)]
        self.is_leaf = not self.children
        self._node, self._fields = node, fields

    def __getattr__(self, field):
        return self._fields[field][self._node]

    def sum(self, term):
        terms = [term(*as_tuple(state)) for state in self.children]
        total = terms[0]
        for value in terms[1:]:
            total = total + value
        return total


def run_eager(o, cell, forest, params, fields):
    """The cell on every node, children first; the roots' first state component."""
    memo = {}
    for node in children_first(forest):
        memo[node] = cell(o, params, EagerNode(forest, node, memo, fields))
    return [as_tuple(memo[int(root)])[0] for root in forest.roots]
