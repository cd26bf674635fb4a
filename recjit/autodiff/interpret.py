"""The cell IR and its adjoint (`adjoint.py`) evaluated with NumPy, a batch of nodes at a time:
every op once for all the batch's nodes (or all their edges, for a value per child), as
PyTorch's level batching would. It runs a case's ops as the compiled kernel does, so it is
what the backward pass computes with until the adjoint has a compiled kernel of its own.

A value is an array with a leading axis of the batch's nodes (`NODES`), of their edges to
their children (`EDGES`), or none (`UNIFORM`: a parameter, a constant, what only they make)."""
from dataclasses import dataclass

import numpy as np

from .. import ops
from ..frontend.cell_ir import EACH, attribute

UNIFORM, NODES, EDGES = "uniform", "nodes", "edges"


@dataclass
class Value:
    array: np.ndarray
    rows: str  # UNIFORM, NODES or EDGES


class Batch:
    """Nodes `begin..end` of a linearized forest: their edges to their children (contiguous,
    in `child_idx`), each edge's node within the batch, and each edge's child."""

    def __init__(self, linearized, begin, end):
        self.nodes = np.arange(begin, end)
        self.size = end - begin
        child_ptr = linearized.child_ptr
        first, last = child_ptr[begin], child_ptr[end]
        self.children = linearized.child_idx[first:last]
        counts = child_ptr[begin + 1:end + 1] - child_ptr[begin:end]
        self.counts = counts
        self.edge_node = np.repeat(np.arange(self.size), counts)
        self.first_edge = child_ptr[begin:end]
        self.linearized = linearized

    def child(self, k):
        """Child k of every node of the batch."""
        return self.linearized.child_idx[self.first_edge + k]


class Evaluator:
    """Evaluates an op list (a `CellCase`'s or an `AdjointCase`'s) on one `Batch`. `states`:
    the flat states per node of the whole forest (the linearized numbering); `cotangents`:
    their cotangents, which `grad_child` adds to; `sink`: where the other effects go."""

    def __init__(self, batch, params, fields, states, dtype, cotangents=None, sink=None):
        self.batch = batch
        self.params = params
        self.fields = fields
        self.states = states
        self.dtype = dtype
        self.cotangents = cotangents
        self.sink = sink
        self.values = []

    def run(self, ops):
        self.ops = ops
        for op in ops:
            self.values.append(getattr(self, "op_" + op.kind)(op))
        return self.values

    # alignment --------------------------------------------------------------------------
    def aligned(self, values):
        """(arrays, rows): the values with the same leading axis; a node's value repeated for
        each of its edges where another value has one per edge."""
        kinds = {value.rows for value in values}
        rows = EDGES if EDGES in kinds else NODES if NODES in kinds else UNIFORM
        arrays = [value.array[self.batch.edge_node] if rows == EDGES and value.rows == NODES
                  else value.array for value in values]
        return arrays, rows

    def of(self, op):
        return [self.values[a] for a in op.args]

    def row_nodes(self, rows):
        """The node (in the forest's linearized numbering) of each row: each edge's parent."""
        return self.batch.nodes if rows == NODES else self.batch.nodes[self.batch.edge_node]

    def by_row(self, value, rows):
        """`value`'s array with a leading axis of `rows` (repeated where it is uniform)."""
        if value.rows == rows:
            return value.array
        if value.rows == UNIFORM:
            count = self.batch.size if rows == NODES else self.batch.children.size
            return np.broadcast_to(value.array, (count,) + value.array.shape)
        return value.array[self.batch.edge_node]  # a node's value for each of its edges

    # the cell IR's ops ------------------------------------------------------------------
    def op_param(self, op):
        name = op.attrs[0]
        array = np.asarray(getattr(self.params, attribute(name)), dtype=self.dtype)
        return Value(array.T if name != attribute(name) else array, UNIFORM)

    def op_const(self, op):
        return Value(np.asarray(op.attrs[0], dtype=self.dtype), UNIFORM)

    def op_fill(self, op):
        return Value(np.full(op.shape, op.attrs[0], dtype=self.dtype), UNIFORM)

    def op_field(self, op):
        values = self.fields[op.attrs[0]][self.batch.nodes]
        return Value(np.asarray(values, dtype=self.dtype).reshape((-1,) + op.shape), NODES)

    def op_gather(self, op):
        table, field = op.attrs
        rows = self.fields[field][self.batch.nodes]
        return Value(np.asarray(getattr(self.params, table), dtype=self.dtype)[rows], NODES)

    def op_child_state(self, op):
        child, component = op.attrs
        nodes = self.batch.children if child == EACH else self.batch.child(child)
        values = self.states[component][nodes].reshape((-1,) + op.shape)
        return Value(values, EDGES if child == EACH else NODES)

    def op_num_children(self, op):
        return Value(self.batch.counts.astype(self.dtype), NODES)

    def op_child_sum(self, op):
        (term,) = self.of(op)
        if term.rows != EDGES:  # the same for every child
            counts = self.batch.counts.astype(self.dtype).reshape((-1,) + (1,) * len(op.shape))
            return Value(self.by_row(term, NODES) * counts, NODES)
        total = np.zeros((self.batch.size,) + op.shape, dtype=self.dtype)
        np.add.at(total, self.batch.edge_node, term.array)
        return Value(total, NODES)

    def op_child_max(self, op):
        return self.extreme(op, np.maximum, -np.inf)

    def op_child_min(self, op):
        return self.extreme(op, np.minimum, np.inf)

    def extreme(self, op, function, start):
        """A chain of `function` over each node's children in their order, from `start`,
        the running value first (`ties` "earliest") or second."""
        (term,) = self.of(op)
        values = self.by_row(term, EDGES)
        total = np.full((self.batch.size,) + op.shape, start, dtype=self.dtype)
        places = self.places()
        for place in range(int(self.batch.counts.max(initial=0))):
            edges = places == place
            nodes = self.batch.edge_node[edges]
            pair = (total[nodes], values[edges])
            total[nodes] = function(*(pair if op.attrs == ("earliest",) else pair[::-1]))
        return Value(total, NODES)

    def places(self):
        """Each edge's child's place among its node's children."""
        counts = self.batch.counts
        return np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)

    def op_child_position(self, op):
        return Value(self.places().astype(self.dtype), EDGES)

    def op_unary(self, op):
        (x,) = self.of(op)
        return Value(np.asarray(_UNARY[op.attrs[0]](x.array), dtype=self.dtype), x.rows)

    def op_binary(self, op):
        operands, rows = self.aligned(self.of(op))
        if rows != UNIFORM:  # a number per row meets a vector or matrix per row
            operands = [array.reshape(array.shape + (1,) * len(op.shape))
                        if self.ops[arg].shape == () and self.values[arg].rows != UNIFORM
                        else array for array, arg in zip(operands, op.args)]
        with np.errstate(all="ignore"):
            value = _BINARY[op.attrs[0]](*operands)
        return Value(np.asarray(value, dtype=self.dtype), rows)

    def op_matvec(self, op):
        (matrix, vector), rows = self.aligned(self.of(op))
        return Value(np.einsum("...ij,...j->...i", matrix, vector), rows)

    def op_matmul(self, op):
        (left, right), rows = self.aligned(self.of(op))
        return Value(np.matmul(left, right), rows)

    def op_inner(self, op):
        (u, v), rows = self.aligned(self.of(op))
        return Value(np.einsum("...i,...i->...", u, v), rows)

    def op_slice(self, op):
        (x,) = self.of(op)
        start, stop = op.attrs
        return Value(_rows(x, start, stop), x.rows)

    def op_concat(self, op):
        parts = self.of(op)
        _, rows = self.aligned(parts)
        if rows == UNIFORM:
            return Value(np.concatenate([part.array for part in parts]), UNIFORM)
        return Value(np.concatenate([self.by_row(part, rows) for part in parts], axis=1), rows)

    # the adjoint's own ops --------------------------------------------------------------
    def op_cotangent(self, op):
        (component,) = op.attrs
        return Value(self.cotangents[component][self.batch.nodes].reshape((-1,) + op.shape),
                     NODES)

    def op_transpose(self, op):
        (matrix,) = self.of(op)
        return Value(np.swapaxes(matrix.array, -1, -2), matrix.rows)

    def op_outer(self, op):
        (a, b), rows = self.aligned(self.of(op))
        return Value(a[..., :, None] * b[..., None, :], rows)

    def op_each_child(self, op):
        (x,) = self.of(op)
        return Value(self.by_row(x, EDGES), EDGES)

    def op_pad(self, op):
        (x,) = self.of(op)
        start, stop = op.attrs
        leading = () if x.rows == UNIFORM else (x.array.shape[0],)
        whole = np.zeros(leading + op.shape, dtype=self.dtype)
        whole[(slice(None),) * len(leading) + (slice(start, stop),)] = x.array
        return Value(whole, x.rows)

    def op_sum(self, op):
        (x,) = self.of(op)
        first = 0 if x.rows == UNIFORM else 1
        return Value(x.array.sum(axis=tuple(range(first, x.array.ndim))), x.rows)

    # effects ----------------------------------------------------------------------------
    def op_grad_param(self, op):
        (gradient,) = self.of(op)
        rows = NODES if gradient.rows == UNIFORM else gradient.rows
        self.sink.param(op.attrs[0], self.by_row(gradient, rows), self.row_nodes(rows))

    def op_grad_param_outer(self, op):
        """Σ a ⊗ b over the rows; over each row of a node's matrices a and b, where they are
        matrices."""
        a, b = self.of(op)
        _, rows = self.aligned((a, b))
        rows = NODES if rows == UNIFORM else rows
        a, b = self.by_row(a, rows), self.by_row(b, rows)
        nodes = np.repeat(self.row_nodes(rows), int(np.prod(a.shape[1:-1])))
        self.sink.outer(op.attrs[0], a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]),
                        nodes)

    def op_grad_table(self, op):
        (gradient,) = self.of(op)
        table, field = op.attrs
        self.sink.rows(table, self.fields[field][self.batch.nodes],
                       self.by_row(gradient, NODES), self.batch.nodes)

    def op_grad_field(self, op):
        (gradient,) = self.of(op)
        self.sink.field(op.attrs[0], self.batch.nodes, self.by_row(gradient, NODES))

    def op_grad_child(self, op):
        (gradient,) = self.of(op)
        child, component = op.attrs
        if child == EACH:
            nodes, values = self.batch.children, self.by_row(gradient, EDGES)
        else:
            nodes, values = self.batch.child(child), self.by_row(gradient, NODES)
        np.add.at(self.cotangents[component], nodes, values.reshape(nodes.size, -1))


def _rows(value, start, stop):
    """Rows start..stop of a value's elements (a matrix's rows, a vector's elements)."""
    if value.rows == UNIFORM:
        return value.array[start:stop]
    return value.array[:, start:stop]


def _picks_first(a, b):
    """1 where NumPy's maximum returns `a` (a >= b, or a is NaN), else 0."""
    return ((a >= b) | np.isnan(a)).astype(np.result_type(a, b))


def _picks_first_min(a, b):
    return ((a <= b) | np.isnan(a)).astype(np.result_type(a, b))


# The cell language's functions as the plain recursion computes them (`ops`), and those only
# the adjoint has.
_UNARY = {**{name: function for function, name in ops.UNARY.items()},
          "neg": np.negative, "sign": np.sign}
_BINARY = {**{name: function for function, name in ops.BINARY.items()},
           "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "picks_first": _picks_first, "picks_first_min": _picks_first_min}
