"""DyNet with autobatching, running the cells of `cells.py`: the recursion builds one graph for
the whole batch, and DyNet batches the operations it finds alike. The ParameterCollection stays
referenced by the returned closure for as long as it runs (docs/design.md §8: its storage is freed
otherwise)."""
from types import SimpleNamespace

import dynet_config

dynet_config.set(autobatch=1, mem=2048)
import dynet as dy  # noqa: E402

from .cells import CELLS, run_eager  # noqa: E402


def _split(x, count):
    size = x.dim()[0][0] // count
    return [dy.pick_range(x, k * size, (k + 1) * size) for k in range(count)]


class DynetOps:
    linear = matvec = matmul = staticmethod(lambda weight, x: weight * x)
    mul = staticmethod(dy.cmult)
    sigmoid, tanh, relu = staticmethod(dy.logistic), staticmethod(dy.tanh), staticmethod(dy.rectify)
    one_minus = staticmethod(lambda x: -x + 1)
    cat = staticmethod(dy.concatenate)
    cat_rows = staticmethod(lambda parts: dy.concatenate(parts, d=0))
    split = staticmethod(_split)
    row = staticmethod(lambda table, index: dy.lookup(table, int(index)))
    vector = staticmethod(dy.inputVector)


def parameters(params):
    """(collection, p): tables gathered by a field (E, E_M) become lookup parameters. DyNet
    fills a matrix entry column by column, so a table of matrices goes in transposed."""
    collection = dy.ParameterCollection()
    stored = {}
    for name in params.names():
        value = getattr(params, name)
        if name.startswith("E"):
            entries = value if value.ndim == 2 else value.transpose(0, 2, 1).copy()
            stored[name] = collection.lookup_parameters_from_numpy(entries)
        else:
            stored[name] = collection.add_parameters(value.shape,
                                                     init=dy.NumpyInitializer(value))
    return collection, SimpleNamespace(**stored)


def autobatch(cell):
    def factory(forest, params):
        collection, p = parameters(params)

        def run():
            assert collection is not None  # keeps the parameters' storage alive
            dy.renew_cg()
            roots = run_eager(DynetOps, cell, forest, p, forest.fields)
            value = dy.concatenate_cols(roots).npvalue()
            return value.reshape(value.shape[0], -1).T
        return run
    return factory


AUTOBATCH = {name: autobatch(cell) for name, cell in CELLS.items()}
