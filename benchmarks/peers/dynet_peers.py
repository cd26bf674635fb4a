"""DyNet with autobatching: the recursion builds one graph for the whole batch, and DyNet
batches the operations it finds alike. The ParameterCollection stays referenced by the
returned closure for as long as it runs (DESIGN §8: its storage is freed otherwise)."""
import dynet_config

dynet_config.set(autobatch=1, mem=2048)
import dynet as dy  # noqa: E402

from .levels import children_first  # noqa: E402


def parameters(params):
    collection = dy.ParameterCollection()
    stored = {}
    for name in params.names():
        value = getattr(params, name)
        if name == "E":
            stored[name] = collection.lookup_parameters_from_numpy(value)
        else:
            stored[name] = collection.add_parameters(value.shape,
                                                     init=dy.NumpyInitializer(value))
    return collection, stored


def tree_lstm(forest, params):
    collection, p = parameters(params)
    words = forest.fields["word"]
    order = children_first(forest)

    def cell(node, memo):
        children = forest.children(node)
        if children.size == 0:
            gates = p["W_iou"] * dy.lookup(p["E"], int(words[node])) + p["b_iou"]
            i, o, u = (dy.pick_range(gates, k * hidden, (k + 1) * hidden) for k in range(3))
            c = dy.cmult(dy.logistic(i), dy.tanh(u))
            return dy.cmult(dy.logistic(o), dy.tanh(c)), c
        (hl, cl), (hr, cr) = memo[children[0]], memo[children[1]]
        gates = p["U_iou"] * (hl + hr) + p["b_iou"]
        i, o, u = (dy.pick_range(gates, k * hidden, (k + 1) * hidden) for k in range(3))
        fl = dy.logistic(p["U_f"] * hl + p["b_f"])
        fr = dy.logistic(p["U_f"] * hr + p["b_f"])
        c = dy.cmult(dy.logistic(i), dy.tanh(u)) + dy.cmult(fl, cl) + dy.cmult(fr, cr)
        return dy.cmult(dy.logistic(o), dy.tanh(c)), c

    hidden = params.b_f.shape[0]

    def run():
        assert collection is not None  # keeps the parameters' storage alive
        dy.renew_cg()
        memo = {}
        for node in order:
            memo[node] = cell(node, memo)
        roots = dy.concatenate_cols([memo[int(r)][0] for r in forest.roots])
        return roots.npvalue().reshape(hidden, -1).T
    return run


AUTOBATCH = {"tree_lstm": tree_lstm}
