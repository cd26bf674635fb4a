"""The pullback of a run: the cotangents of the roots' and nodes' states carried back through
the batches, roots first, to the parameters, the gathered rows, the fields and the context.

A node's state cotangent is complete when its batch starts: every parent of a node sits in an
earlier batch (the batches run from the tallest nodes down), and a DAG node shared by several
parents has had all of their contributions added. Each batch recomputes its nodes' ops from
their children's stored states (nothing else of the forward is kept) and evaluates the
adjoint case (`adjoint.py`) with NumPy, all the batch's nodes at once (`interpret.py`)."""
import numpy as np

from ..errors import InputError
from ..params import is_weak
from .gradients import Gradients, RowGrad
from .interpret import Batch, Evaluator


class Pullback:
    """`pullback(roots=None, nodes=None)`: the `Gradients` of the sum of the states weighted
    by these cotangents. `roots`, `nodes`: shaped like the run's `Result.roots` and
    `Result.nodes` (a tuple of arrays, or one array for a single state); a missing or None
    component is zero. It may be called any number of times, or never."""

    def __init__(self, cell, adjoints, linearized, states, params, context, num_roots):
        self.cell = cell
        self.adjoints = adjoints  # {"leaf": AdjointCase, "internal": AdjointCase}
        self.linearized = linearized
        self.states = states
        self.params = params
        self.context = context  # the names of the context arguments, in order
        self.num_roots = num_roots
        self.dtype = np.dtype(cell.dtype)

    def __call__(self, roots=None, nodes=None):
        cotangents = self.incoming(roots, nodes)
        sink = Sink(self.cell, self.params, self.linearized, self.dtype)
        linearized = self.linearized
        begins = linearized.batch_begin
        for batch in range(linearized.num_batches):  # roots first
            begin, end = int(begins[batch]), int(begins[batch + 1])
            if end > begin:
                case = "leaf" if begin >= linearized.leaf_begin else "internal"
                Evaluator(Batch(linearized, begin, end), self.params, linearized.fields,
                          self.states, self.dtype, cotangents, sink).run(self.adjoints[case].ops)
        return sink.gradients(self.context)

    def incoming(self, roots, nodes):
        """The cotangent of each state component per node, in the linearized numbering."""
        shapes = self.cell.state_shapes
        linearized = self.linearized
        cotangents = [np.zeros((linearized.num_nodes, int(np.prod(shape))), dtype=self.dtype)
                      for shape in shapes]
        for what, given, count, rows in (("roots", roots, self.num_roots, linearized.roots),
                                         ("nodes", nodes, linearized.num_nodes,
                                          linearized.new_of_old)):
            for component, values in enumerate(self.components(what, given)):
                if values is None:
                    continue
                values = self.checked(what, component, values, (count,) + shapes[component])
                np.add.at(cotangents[component], rows, values.reshape(count, -1))
        return cotangents

    def components(self, what, given):
        """`given` as one cotangent (or None) per state component."""
        count = len(self.cell.state_shapes)
        if given is None:
            return [None] * count
        if not self.cell.state_is_tuple and not isinstance(given, (tuple, list)):
            given = (given,)
        if not isinstance(given, (tuple, list)) or len(given) != count:
            raise InputError(f"the cotangent of {what} must be {count} array(s), one per "
                             f"state component (as the run's Result.{what}), not "
                             f"{type(given).__name__}"
                             + (f" of {len(given)}" if isinstance(given, (tuple, list)) else ""))
        return list(given)

    def checked(self, what, component, values, shape):
        values = np.asarray(values)
        if values.shape != shape:
            raise InputError(f"the cotangent of {what}, component {component}, has shape "
                             f"{values.shape}; the run's Result.{what}[{component}] has {shape}")
        if values.dtype.kind not in "fiu":
            raise InputError(f"the cotangent of {what}, component {component}, holds "
                             f"{values.dtype}, not numbers")
        return values.astype(self.dtype, copy=False)


class Sink:
    """Where the adjoint's effects go: each parameter's gradient, each table's gathered rows
    and their gradients, each float field's gradient per node (the linearized numbering)."""

    def __init__(self, cell, params, linearized, dtype):
        self.cell = cell
        self.params = params
        self.linearized = linearized
        self.dtype = dtype
        self.dense = {}
        self.table_rows = {}
        self.field_gradients = {}

    def param(self, name, total):
        held = self.dense.get(name)
        self.dense[name] = total if held is None else held + total

    def rows(self, table, indices, values):
        self.table_rows.setdefault(table, []).append((indices, values))

    def field(self, name, nodes, values):
        shape = self.cell.fields[name][0]
        gradient = self.field_gradients.setdefault(
            name, np.zeros((self.linearized.num_nodes,) + tuple(shape), dtype=self.dtype))
        gradient[nodes] += values.reshape((-1,) + tuple(shape))

    def gradients(self, context):
        arguments = {name: self.parameter(name, shape)
                     for name, shape in self.cell.parameters.items()}
        fields = {}
        for name, (shape, dtype) in self.cell.fields.items():
            if np.dtype(dtype).kind != "f":
                continue
            gradient = self.field_gradients.get(name)
            if gradient is None:
                gradient = np.zeros((self.linearized.num_nodes,) + tuple(shape), self.dtype)
            fields[name] = gradient[self.linearized.new_of_old]
        params = {name: value for name, value in arguments.items() if name not in context}
        return Gradients(params, fields, [arguments[name] for name in context])

    def parameter(self, name, shape):
        """A parameter's gradient: dense, a `RowGrad` for a table only gathered from, a float
        for a Python number."""
        value = getattr(self.params, name)
        gathered = self.table_rows.get(name, [])
        read_whole = any(op.kind == "param" and op.attrs[0].removesuffix(".T") == name
                         for case in self.cell.cases for op in case.ops)
        if gathered and not read_whole and name not in self.dense:
            return RowGrad.summed(np.concatenate([i for i, _ in gathered]),
                                  np.concatenate([v for _, v in gathered]), shape, self.dtype)
        total = np.zeros(shape, dtype=self.dtype)
        if name in self.dense:
            total += np.asarray(self.dense[name], dtype=self.dtype).reshape(shape)
        for indices, values in gathered:
            np.add.at(total, indices, values)
        return float(total) if is_weak(value) else total
