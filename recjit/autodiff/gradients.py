"""What a pullback returns: `Gradients`, with `RowGrad` for a table the cell only gathers from."""
from types import SimpleNamespace

import numpy as np


# The elements of a row from which `RowGrad.summed` adds a gathered row's values a row at a time:
# NumPy's `add.reduceat` down the rows of wider arrays was the slower (benchmarks/README.md).
WIDE_ROW = 256


class RowGrad:
    """The gradient of a table a cell only gathers rows from: `indices`, the rows gathered
    (unique, sorted), and `values`, each one's summed gradient. Most rows of an embedding get
    none; `to_dense()` (or `np.asarray`) is the table-shaped array. Two add up to the rows of
    both, and a number scales the rows (`p.E - lr * g.params.E` is the dense step)."""

    def __init__(self, indices, values, shape):
        self.indices = indices
        self.values = values
        self.shape = tuple(shape)

    @classmethod
    def summed(cls, indices, values, shape, dtype, segment_sums=None):
        """The rows of `indices` (repeated as often as gathered) with their `values` summed:
        by `segment_sums(values, order, bounds)`, a backend's compiled sums (row s's values:
        values[order[bounds[s]:bounds[s + 1]]], in that order), or by NumPy."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        values = np.asarray(values, dtype=dtype).reshape((indices.size,) + tuple(shape[1:]))
        if indices.size == 0:
            return cls(indices, np.zeros((0,) + tuple(shape[1:]), dtype=dtype), shape)
        if (indices[1:] > indices[:-1]).all():  # unique and sorted: a backward's sums by row
            return cls(indices, values, shape)
        order = np.argsort(indices, kind="stable")  # a row's values together, in their order
        ordered = indices[order]
        starts = np.flatnonzero(np.diff(ordered, prepend=ordered[0] - 1))
        if segment_sums is not None:
            sums = segment_sums(values.reshape(indices.size, -1), order,
                                np.append(starts, indices.size))
            return cls(ordered[starts], sums.reshape((starts.size,) + values.shape[1:]), shape)
        values = values[order]
        if values[0].size < WIDE_ROW:
            return cls(ordered[starts], np.add.reduceat(values, starts, axis=0), shape)
        sums = values[starts]
        ends = np.append(starts[1:], indices.size)
        for row in np.flatnonzero(ends - starts > 1).tolist():
            sums[row] += values[starts[row] + 1:ends[row]].sum(axis=0)
        return cls(ordered[starts], sums, shape)

    @property
    def dtype(self):
        return self.values.dtype

    def to_dense(self):
        dense = np.zeros(self.shape, dtype=self.values.dtype)
        dense[self.indices] = self.values
        return dense

    def __array__(self, dtype=None, copy=None):
        dense = self.to_dense()
        return dense if dtype is None else dense.astype(dtype)

    def __repr__(self):
        return f"RowGrad({self.indices.size} of {self.shape[0]} rows, shape={self.shape})"

    # arithmetic, as an optimizer's step or a sum over batches writes it: with another
    # table's rows or a number it keeps its rows; with anything else it is the dense table
    def __add__(self, other):
        if isinstance(other, RowGrad):
            if other.shape != self.shape:
                raise ValueError(f"RowGrad of shape {self.shape} plus one of {other.shape}")
            return RowGrad.summed(np.concatenate([self.indices, other.indices]),
                                  np.concatenate([self.values, other.values]), self.shape,
                                  np.result_type(self.values, other.values))
        return self.to_dense() + other

    __radd__ = __add__

    def __neg__(self):
        return RowGrad(self.indices, -self.values, self.shape)

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        return self._scaled(other, np.multiply)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self._scaled(other, np.divide)

    def _scaled(self, other, operation):
        """`operation(self, other)`: of the rows alone by a number, else of the dense table."""
        if np.ndim(other) == 0 and not isinstance(other, RowGrad):
            return RowGrad(self.indices, operation(self.values, other), self.shape)
        return operation(self.to_dense(), np.asarray(other))


class Gradients:
    """The gradients a pullback returns. `params`: one attribute per parameter the cell reads
    (an array of its shape and dtype, a `RowGrad` for a table it only gathers from, a float
    for a Python number); `fields`: {float field: its gradient per node, in the forest's
    order}; `context`: the context arguments' gradients, in order."""

    def __init__(self, params, fields, context):
        self.params = SimpleNamespace(**params)
        self.fields = fields
        self.context = tuple(context)

    def __repr__(self):
        return (f"Gradients(params={sorted(vars(self.params))}, fields={sorted(self.fields)}, "
                f"context={len(self.context)})")
