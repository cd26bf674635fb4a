"""The pullback of a run: the cotangents of the roots' and nodes' states carried back through
the batches, roots first, to the parameters, the gathered rows, the fields and the context.

A node's state cotangent is complete when its batch starts: every parent of a node sits in an
earlier batch (the batches run from the tallest nodes down), and a DAG node shared by several
parents has had all of their contributions added. Each batch recomputes its nodes' ops from
their children's stored states, or reads the products and gathered rows the forward kept
(`Schedule(remat=False)`), and evaluates the adjoint case (`adjoint.py`): in the compiled
backward kernel (`lowering.backward`), which fills a row of gradient per node for the host to
reduce here, or, where no kernel was compiled, with NumPy, all the batch's nodes at once
(`interpret.py`)."""
import functools
import itertools
import math
from dataclasses import dataclass

import numba
import numpy as np

from ..errors import InputError, RecJitError, checked_flag
from ..linearize import edge_parents, node_trees
from ..lowering.arguments import LeafGroups, kernel_parameters, leaf_groups
from ..lowering.backward import gathered_rows, gradient_sums
from ..lowering.ilir import RowsOf
from ..params import (check_as_array, described, is_weak, on_device as on_gpu_memory,
                      params_on_host, to_host)
from .gradients import Gradients, RowGrad
from .interpret import Batch, Evaluator


class Pullback:
    """`pullback(roots=None, nodes=None, per_tree=False)`: the `Gradients` of the sum of the
    states weighted by these cotangents. `roots`, `nodes`: shaped like the run's
    `Result.roots` and `Result.nodes` (a tuple of arrays, or one array for a single state); a
    missing or None component is zero. `per_tree`: every parameter's (and context
    argument's) gradient gets a leading axis over the forest's roots, each tree's own, from
    the same one pass (a gathered table: a `RowGrad` a tree). `check_finite`: refuse NaN and
    infinite cotangents first. `device_output` (a vjp's on the GPU, whole gradients): the
    dense gradients are device arrays, the kernel's sums never copied back (a gathered
    table's `RowGrad`, the fields' gradients and a Python number's stay on the host). It
    may be called any number of times, or never. `compiled`:
    the backward kernel (`codegen_cpu.CpuBackward`, `codegen_cuda.CudaBackward`), or None
    to interpret the adjoint; `params`: as the kernel reads them (the GPU's: where they lie,
    without a copy); `guards`: what it checks them against before each call, the host's
    and the GPU's (`parameter_guards`); `kept`: the products the forward kept for it, by name
    (`Schedule(remat=False)`)."""

    def __init__(self, cell, adjoints, linearized, states, params, context, compiled=None,
                 kept=None, guards=()):
        self.cell = cell
        self.guards = guards
        self.adjoints = adjoints  # {"leaf": AdjointCase, "internal": AdjointCase}
        self.compiled = compiled
        self.linearized = linearized
        self.states = states
        self.params = params
        self.context = context  # the names of the context arguments, in order
        self.dtype = np.dtype(cell.dtype)
        self.kept = kept or {}
        self.layouts = {}  # {per_tree: its `Layout`}

    def __repr__(self):
        """Short: whose pullback, over how many roots and nodes, and whether compiled."""
        how = "compiled" if self.compiled is not None else "interpreted"
        return (f"Pullback({self.cell.name}, {self.linearized.roots.size} roots, "
                f"{self.linearized.num_nodes} nodes, {how})")

    def __reduce__(self):
        raise RecJitError("a pullback cannot be pickled: it holds its forward's arrays and "
                          "compiled kernels, in the process of its vjp; call it there and "
                          "send its Gradients, which pickle")

    @functools.cached_property
    def roots_listed_once(self):
        """Whether no root is listed twice among the forest's roots: a root's cotangent is
        then a row of its own. Found when a call first gives the roots cotangents (a training
        step's gives its nodes')."""
        return sorted_unique(self.linearized.roots).size == self.linearized.roots.size

    @property
    def gives_device_gradients(self):
        """Whether `device_output=True` can leave the dense gradients on the device: a
        compiled GPU backward sums them there."""
        return getattr(self.compiled, "device_gradients", None) is not None

    def interpreted(self):
        """This pullback with its adjoint evaluated by NumPy (`interpret.py`), not by the
        compiled kernel: the same gradients, a check on the kernel, and slower. It reads the
        tables whose gathered rows the kernel read from the forward's (`kept_row_guards`),
        so it checks them."""
        guards = self.guards
        if self.compiled is not None:
            guards += kept_row_guards(self.compiled, self.kept, self.linearized)
        return Pullback(self.cell, self.adjoints, self.linearized, self.states, self.params,
                        self.context, guards=guards)

    def __call__(self, roots=None, nodes=None, per_tree=False, check_finite=False,
                 device_output=False):
        return self.backward(roots, nodes, per_tree, check_finite,
                             device_output).gradients(self.context)

    def backward(self, roots=None, nodes=None, per_tree=False, check_finite=False,
                 device_output=False):
        """The `Sink` that the backward pass for these cotangents filled."""
        per_tree = checked_flag("per_tree", per_tree)
        on_device = None
        if checked_flag("device_output", device_output):
            if not self.gives_device_gradients or per_tree:
                raise RecJitError("device_output=True asks for gradients on the GPU: the "
                                  "pullback of a vjp(backend='cuda') whose backward compiled "
                                  "gives them, for gradients summed over the forest "
                                  "(per_tree=False)")
            on_device = self.compiled.device_gradients()
        for guard in self.guards:
            for name, gathered in guard.changed(self.params):
                raise InputError(f"{described(self.params, name)} changed in place after vjp"
                                 + (", in rows its forest gathers" if gathered else "")
                                 + ": a pullback computes the gradient at the values its "
                                 "forward read, so call it before updating them, or call vjp "
                                 "again")
        cotangents = self.incoming(roots, nodes, checked_flag("check_finite", check_finite))
        layout = self.layout(per_tree)
        trees = layout.trees
        sink = Sink(self.cell, self.params, self.linearized, self.dtype, trees, on_device,
                    getattr(self.compiled, "segment_sums", None),
                    getattr(self.compiled, "weight_gradients_by_tree", None))
        if self.linearized.num_nodes == 0:  # an empty forest: every gradient is zero
            return sink
        if self.compiled is not None:
            options = {"sums_on_device": True} if on_device is not None else {}
            self.reduce(self.compiled(self.linearized, self.params, self.states, cotangents,
                                      self.kept, whole=trees is None, groups=layout.groups,
                                      **options),
                        sink, layout.nodes_of)
            return sink
        linearized = self.linearized
        begins = linearized.batch_begin
        params = params_on_host(self.params, self.cell.parameters)  # NumPy evaluates it
        for batch in range(linearized.num_batches):  # roots first
            begin, end = int(begins[batch]), int(begins[batch + 1])
            if end > begin:
                case = "leaf" if begin >= linearized.leaf_begin else "internal"
                Evaluator(Batch(linearized, begin, end), params, linearized.fields,
                          self.states, self.dtype, cotangents, sink).run(self.adjoints[case].ops)
        return sink

    def layout(self, per_tree):
        """The `Layout` of the gradients per tree or summed: the same at every call, so
        found at the first."""
        if per_tree not in self.layouts:
            self.layouts[per_tree] = Layout.of(self.linearized, per_tree, self.compiled)
        return self.layouts[per_tree]

    def reduce(self, arrays, sink, nodes_of):
        """Each `GradientRows` array the backward kernel filled, into the sink: a row per
        node (or per edge, of its parent node; or per group of leaves, of its first leaf:
        `nodes_of` by `RowsOf`); for whole gradients, each parameter's the kernel summed
        itself (`GradientSum`), in place of the rows it sums."""
        linearized, kernel = self.linearized, self.compiled.kernel
        summed = set()
        if sink.trees is None:
            for total in gradient_sums(kernel):
                sink.add_summed(total.parameter, arrays[total.total])
                summed.update(total.summed)
        outputs = [output for output in kernel.gradients if output not in summed]
        products = {}
        for output in outputs:
            if output.effect == "grad_param_outer":  # a node's vectors a row (a column)
                values = arrays[output.name]
                products.setdefault(output.pair, [output.attrs[0], output, None, None])[
                    2 + output.side] = (values.T if output.columns else
                                        values.reshape(-1, output.size // output.vectors))
        # The weights' products first, while the kernel's threads still spin at its last
        # barrier: after the host's other sums, they had gone to sleep and woke for the first.
        for name, output, a_rows, b_rows in products.values():
            if sink.trees is None:
                sink.add(name, self.compiled.weight_gradient(a_rows, b_rows))
            else:
                sink.outer(name, a_rows, b_rows,
                           np.repeat(nodes_of[output.rows], output.vectors))
        for output in outputs:
            values, nodes = arrays[output.name], nodes_of[output.rows]
            if output.effect == "grad_param":
                sink.param(output.attrs[0], values.T if output.columns else values, nodes)
            elif output.effect == "grad_table":
                table, field = output.attrs
                row_shape = tuple(self.cell.parameters[table][1:])
                sink.rows(table, linearized.fields[field][nodes],
                          values.reshape((-1,) + row_shape), nodes,
                          grouped=output.rows is RowsOf.LEAF_GROUPS)
            elif output.effect != "grad_param_outer":
                sink.field(output.attrs[0], nodes, values)

    def incoming(self, roots, nodes, check_finite=False):
        """The cotangent of each state component per node, in the linearized numbering."""
        shapes = self.cell.state_shapes
        sizes = [math.prod(shape) for shape in shapes]
        linearized = self.linearized

        def rows(what, given, count):
            """Each component of `given`, checked, a row of its size per root or node."""
            return [None if values is None else
                    self.checked(what, component, values, (count,) + shapes[component],
                                 check_finite).reshape(count, sizes[component])
                    for component, values in enumerate(self.components(what, given))]

        at_roots_given = rows("roots", roots, linearized.roots.size)
        at_nodes_given = rows("nodes", nodes, linearized.num_nodes)
        cotangents = []
        for size, at_roots, at_nodes in zip(sizes, at_roots_given, at_nodes_given):
            if at_nodes is None:
                cotangent = np.zeros((linearized.num_nodes, size), self.dtype)
            else:  # gathered into the linearized order, a new array the kernel adds to
                cotangent = at_nodes.take(linearized.old_of_new, axis=0)
            if at_roots is not None and self.roots_listed_once:  # a row each
                cotangent[linearized.roots] += at_roots
            elif at_roots is not None:  # a root listed twice takes both cotangents
                np.add.at(cotangent, linearized.roots, at_roots)
            cotangents.append(cotangent)
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

    def checked(self, what, component, values, shape, check_finite):
        check_as_array(f"the cotangent of {what}, component {component},", values)
        values = np.asarray(values)
        if values.shape != shape:
            raise InputError(f"the cotangent of {what}, component {component}, has shape "
                             f"{values.shape}; the run's Result.{what}[{component}] has {shape}")
        if values.dtype.kind not in "fiu":
            raise InputError(f"the cotangent of {what}, component {component}, holds "
                             f"{values.dtype}, not numbers")
        if check_finite and not np.isfinite(values).all():
            index = tuple(int(i) for i in np.argwhere(~np.isfinite(values))[0])
            raise InputError(f"the cotangent of {what}, component {component}, holds "
                             f"{values[index]} at index {index}; check_finite=True refuses "
                             "NaN and infinite cotangents")
        return values.astype(self.dtype, copy=False)


@dataclass(frozen=True)
class Layout:
    """Where a pullback's rows belong: `trees`, the tree of every node (None: gradients
    summed over the forest); `groups`, the compiled kernel's `LeafGroups` (None: it sums
    none, or none was compiled); `nodes_of`, the node of each row of a `GradientRows` array,
    by its `RowsOf`."""

    trees: np.ndarray
    groups: LeafGroups
    nodes_of: dict

    @staticmethod
    def of(linearized, per_tree, compiled):
        trees = tree_of_nodes(linearized) if per_tree else None
        if compiled is None or linearized.num_nodes == 0:
            return Layout(trees, None, {})
        groups = leaf_groups(compiled.kernel, linearized, trees)
        leaf_begin = linearized.leaf_begin
        nodes_of = {RowsOf.INTERNAL: np.arange(leaf_begin),
                    RowsOf.LEAVES: np.arange(leaf_begin, linearized.num_nodes),
                    RowsOf.EDGES: edge_parents(linearized)}
        if groups is not None:
            nodes_of[RowsOf.LEAF_GROUPS] = leaf_begin + groups.first_leaves()
        return Layout(trees, groups, nodes_of)


def tree_of_nodes(linearized):
    """The tree (its position in the forest's roots) of every node, in the linearized
    numbering; a node two trees share, a root listed twice among them, is an `InputError`
    naming it, since its gradient would belong to both."""
    tree, shared = node_trees(linearized)
    if shared >= 0:
        node = int(linearized.old_of_new[shared])
        listed = int(np.count_nonzero(linearized.roots == shared))
        raise InputError(f"node {node} belongs to two trees of the forest ("
                         + (f"it is listed {listed} times among the roots" if listed > 1
                            else "two roots reach it")
                         + "); per-tree gradients and jacobians need every node in one tree")
    return tree


class Sink:
    """Where the adjoint's effects go: each parameter's gradient, each table's gathered rows
    and their gradients, each float field's gradient per node (the linearized numbering).
    `trees`: the tree of every node, for gradients per tree (None: summed over the forest).
    `on_device`: puts the dense gradients together on the GPU (`DeviceGradients`), from the
    kernel's sums left there and the host's parts; None: all on the host. `segment_sums`,
    `products_by_tree`: a backend's compiled sums of rows by segment (a bias's rows by tree, a
    table's by row index: `param`, `RowGrad.summed`) and weight products per tree (`outer`),
    or None for NumPy's."""

    def __init__(self, cell, params, linearized, dtype, trees=None, on_device=None,
                 segment_sums=None, products_by_tree=None):
        self.cell = cell
        self.params = params
        self.linearized = linearized
        self.dtype = dtype
        self.trees = trees
        self.on_device = on_device
        self.segment_sums = segment_sums
        self.products_by_tree = products_by_tree
        self.device_parts = {}  # {parameter: the kernel's sums of it, on the device}
        self.dense = {}
        self.table_rows = {}
        self.grouped_tables = set()  # whose rows are sums over groups of leaves
        self.field_gradients = {}

    def param(self, name, values, nodes):
        """Add `values`, a contribution per row (each of node `nodes[row]`); per tree, each
        tree's rows summed together: by the backend's `segment_sums(values, order, bounds)`
        (tree t's rows being order[bounds[t]:bounds[t + 1]]), or by NumPy's `reduceat`
        (`np.add.at`, row by row, took ten times as long)."""
        if self.trees is None:
            self.add(name, values.sum(axis=0))
            return
        order, bounds = self.by_tree(nodes)
        if self.segment_sums is not None:
            self.add(name, self.segment_sums(values, order, bounds))
            return
        total = np.zeros((self.linearized.roots.size,) + values.shape[1:], dtype=self.dtype)
        rows = bounds[:-1] < bounds[1:]  # the trees with rows here: reduceat needs each
        if rows.any():
            total[rows] = np.add.reduceat(values[order], bounds[:-1][rows], axis=0)
        self.add(name, total)

    def outer(self, name, a, b, nodes):
        """Add Σ a[row] ⊗ b[row], over the rows (each of node `nodes[row]`); per tree, with
        the backend's `products_by_tree(a, b, order, bounds)` (tree t's rows being
        order[bounds[t]:bounds[t + 1]]), or NumPy's, a product a tree."""
        if self.trees is None:
            self.add(name, a.T @ b)
            return
        order, bounds = self.by_tree(nodes)
        if self.products_by_tree is not None:
            self.add(name, self.products_by_tree(a, b, order, bounds))
            return
        total = np.empty((self.linearized.roots.size, a.shape[1], b.shape[1]), dtype=self.dtype)
        for tree in range(total.shape[0]):
            rows = order[bounds[tree]:bounds[tree + 1]]
            total[tree] = a[rows].T @ b[rows]
        self.add(name, total)

    def by_tree(self, nodes):
        """(order, bounds): the rows of `nodes` ordered by tree, tree t's rows being
        order[bounds[t]:bounds[t + 1]]."""
        owners = self.trees[nodes]
        order = np.argsort(owners, kind="stable")
        return order, np.searchsorted(owners[order], np.arange(self.linearized.roots.size + 1))

    def add(self, name, total):
        held = self.dense.get(name)
        self.dense[name] = total if held is None else held + total

    def add_summed(self, name, total):
        """Add a sum the backward kernel made: on the device, if the gradients stay there."""
        if self.on_device is None:
            self.add(name, total)
        else:
            self.device_parts.setdefault(name, []).append(total)

    def rows(self, table, indices, values, nodes, grouped=False):
        """Add gradients of rows `indices` of `table`, a row each of node `nodes[row]`; or,
        `grouped`, each the sum over a group of leaves that share the row (`LeafGroups`),
        standing at its first leaf."""
        self.table_rows.setdefault(table, []).append((indices, values, nodes))
        if grouped:
            self.grouped_tables.add(table)

    def field(self, name, nodes, values):
        shape = self.cell.fields[name][0]
        gradient = self.field_gradients.setdefault(
            name, np.zeros((self.linearized.num_nodes,) + tuple(shape), dtype=self.dtype))
        gradient[nodes] += values.reshape((-1,) + tuple(shape))

    def gathered_by_node(self, table, row_shape):
        """The gradient of the row of `table` each node gathered, per node (the forest's
        order; zero where a node gathers none): not where the backward summed the rows of
        leaves that gather the same row (a jacobian's backward does not)."""
        by_node = np.zeros((self.linearized.num_nodes,) + tuple(row_shape), dtype=self.dtype)
        for nodes, values in self.parts_by_node(table, gathered=True):
            by_node[nodes] += values
        return by_node

    def parts_by_node(self, name, gathered):
        """The gradient of the row of table `name` each node gathered (`gathered`), or of
        float field `name`, in parts: (nodes in the forest's order, their gradients), no node
        twice in one part, zero for a node in none. A caller places them where it wants them
        without a dense array per node first (a jacobian's rows, `model.jacobian`)."""
        old_of_new = self.linearized.old_of_new
        if not gathered:
            gradient = self.field_gradients.get(name)
            return [] if gradient is None else [(old_of_new, gradient)]
        if name in self.grouped_tables:
            raise RecJitError(f"the backward summed the rows of `{name}` that leaves share; "
                              "their gradients per node are a jacobian's (model.jacobian)")
        return [(old_of_new[nodes], values) for _, values, nodes in self.table_rows.get(name, [])]

    def field_by_node(self, name):
        """A float field's gradient, a row per node in the forest's order."""
        gradient = self.field_gradients.get(name)
        if gradient is None:
            gradient = np.zeros((self.linearized.num_nodes,) + tuple(self.cell.fields[name][0]),
                                self.dtype)
        return gradient[self.linearized.new_of_old]

    def gradients(self, context):
        tables = self.cell.only_gathered()
        arguments = {name: self.parameter(name, shape, name in tables)
                     for name, shape in self.cell.parameters.items()}
        fields = {name: self.field_by_node(name)
                  for name, (_, dtype) in self.cell.fields.items() if np.dtype(dtype).kind == "f"}
        params = {name: value for name, value in arguments.items() if name not in context}
        return Gradients(params, fields, [arguments[name] for name in context])

    def parameter(self, name, shape, only_gathered):
        """A parameter's gradient: dense, a `RowGrad` for a table `only_gathered` from (one a
        tree, per tree), a float for a Python number."""
        value = getattr(self.params, name)
        gathered = self.table_rows.get(name, [])
        trees = self.linearized.roots.size
        if only_gathered and name not in self.dense:  # no rows at all in an empty forest
            gathered = gathered or [(np.zeros(0, np.int64), np.zeros((0,) + tuple(shape[1:])),
                                     np.zeros(0, np.int64))]
            indices, values, nodes = (gathered[0] if len(gathered) == 1 else
                                      (np.concatenate(part) for part in zip(*gathered)))
            if self.trees is None:
                return RowGrad.summed(indices, values, shape, self.dtype, self.segment_sums)
            order, bounds = self.by_tree(nodes)
            if (order[1:] < order[:-1]).any():  # each tree's rows one slice (a leaf group's
                indices, values = indices[order], values[order]  # rows are so already)
            return [RowGrad.summed(indices[begin:end], values[begin:end], shape, self.dtype,
                                   self.segment_sums)
                    for begin, end in itertools.pairwise(bounds)]
        leading = () if self.trees is None else (trees,)
        parts = self.device_parts.get(name, [])
        if is_weak(value):  # a Python number's gradient is one, on the host
            for part in parts:
                self.add(name, self.on_device.to_host(part))
            parts = []
        on_host = name in self.dense or gathered
        if name in self.dense:  # an array of its own, C-ordered as the parameter is
            total = np.asarray(np.asarray(self.dense[name]).reshape(leading + tuple(shape)),
                               dtype=self.dtype, order="C")
        else:
            total = np.zeros(leading + tuple(shape), dtype=self.dtype)
        for indices, values, nodes in gathered:
            if self.trees is None:
                np.add.at(total, indices, values)
            else:
                np.add.at(total, (self.trees[nodes], indices), values)
        if is_weak(value):
            return float(total) if self.trees is None else total
        if self.on_device is not None:
            return self.on_device.gradient(parts, total if on_host else None, tuple(shape),
                                           self.dtype)
        return total


def copied_parameters(cell, params):
    """The parameters (and context arrays, which the kernels read as parameters) that a
    vjp copies for its pullback to read: every host array but a table the cell only gathers
    from. A training loop may update its parameters in place before a pullback is called (a
    second pullback of one vjp, or two vjps before their pullbacks); the pullback still
    reads the forward's values, with no comparison per call. A gathered table may be large
    (an embedding): its rows are compared instead (`parameter_guards`)."""
    tables = cell.only_gathered()
    return {name for name in cell.parameters
            if isinstance(getattr(params, name), np.ndarray) and name not in tables}


def parameter_guards(cell, params, fields, copied, on_device=None, compiled=None):
    """What a pullback checks before each call: the parameters it reads where they are, all
    but those `copied` at vjp (`copied_parameters`) and those the `compiled` backward kernel
    does not read (a table whose gathered rows its forward kept), as the forward read them. A
    pullback that read updated ones would mix them with the forward's states: a gradient at
    no point. Of a host table the cell only gathers from, only the rows its forest gathers
    are copied and compared (`ForwardValues`); GPU arrays ({name: (array, rows)}) are
    compared by `on_device`, the GPU backward's guard (`codegen_cuda.snapshot.DeviceValues`),
    on the device. Each guard's `changed(params)` lists the parameters that differ, and
    whether only their gathered rows were compared."""
    tables = cell.only_gathered()
    read = parameters_read(compiled, cell.parameters)
    guards, on_gpu = [], {}
    for name in cell.parameters:
        if name in copied or name not in read:
            continue
        value = getattr(params, name)
        on_host = isinstance(value, np.ndarray)
        if not on_host and (on_device is None or not on_gpu_memory(value)):
            continue
        rows = None
        if name in tables:
            indices = np.concatenate([np.ravel(fields[field]) for _, table, field in cell.gathers
                                      if table == name])
            rows = sorted_unique(indices[indices >= 0])
        if on_host:
            guards.append(ForwardValues.taken(name, value, rows))
        else:
            on_gpu[name] = (value, rows)
    if on_gpu:
        guards.append(on_device(on_gpu))
    return tuple(guards)


def parameters_read(compiled, names):
    """Those of the parameters `names` that a backward reads: the arguments of the `compiled`
    kernel (`lowering.backward`), or, without one, all, which the interpreted adjoint reads."""
    if compiled is None:
        return set(names)
    return {attribute for _, attribute in kernel_parameters(compiled.kernel)}


def kept_row_guards(compiled, kept, linearized):
    """`ForwardValues` of each table that the `compiled` backward kernel does not read, from
    the rows of it that the forward `kept` for it (a `KeptProduct` of a gathered row, a
    leaf's or a distinct key's): what the interpreted adjoint, which reads the table,
    checks."""
    guards, read = [], parameters_read(compiled, ())
    for product in compiled.kernel.kept:
        if product.gathered is None or product.gathered[0] in read:
            continue
        rows, values = gathered_rows(product, to_host(kept[product.array]), linearized)
        guards.append(ForwardValues(product.gathered[0], rows, as_rows(_bits(values))))
    return tuple(guards)


class ForwardValues:
    """The rows `rows` of a host table as the forward read them, bit for bit (`kept`, a
    flattened row each)."""

    def __init__(self, name, rows, kept):
        self.name, self.rows, self.kept = name, rows, kept

    @classmethod
    def taken(cls, name, values, rows):
        """The rows `rows` of table `values`, copied now."""
        return cls(name, rows, as_rows(_bits(values.take(rows, axis=0))))

    def changed(self, params):
        """[(its name, True: only gathered rows were compared)] if they changed since its
        forward (a table whose rows changed shape did), else []."""
        table = getattr(params_on_host(params, (self.name,)), self.name)
        fits = (table.ndim > 0 and table.size == table.shape[0] * self.kept.shape[1]
                and (self.rows.size == 0 or self.rows.max() < table.shape[0]))
        if fits and not rows_differ(as_rows(_bits(table)), self.rows, self.kept):
            return []
        return [(self.name, True)]


def as_rows(values):
    """`values` as a matrix of a row per row of its first axis (a view where it can be)."""
    return values.reshape(values.shape[0], math.prod(values.shape[1:]))


@numba.njit(cache=True, nogil=True)
def rows_differ(table, rows, kept):
    """Whether row rows[i] of `table` differs from row i of `kept` anywhere. Without an early
    exit the loop vectorizes: three times as fast as NumPy's gather and compare, for the few
    hundred rows a batch gathers (an exit at the first difference ran slower than NumPy)."""
    differ = False
    for i in range(rows.size):
        row, then = table[rows[i]], kept[i]
        for column in range(row.size):
            differ |= row[column] != then[column]
    return differ


def sorted_unique(values):
    """The distinct elements of the 1-d integer array `values`, ascending: by a sort, which
    takes the few hundred indices of a batch faster than `np.unique`'s hashing."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size \
        else ordered


def _bits(values):
    """`values` seen as unsigned integers of their size, so that equality is bit for bit (a
    NaN equals itself, as `equal_nan` would make it, at a tenth of the cost)."""
    size = values.dtype.itemsize
    return values.view(f"u{size}") if size in (1, 2, 4, 8) else values
