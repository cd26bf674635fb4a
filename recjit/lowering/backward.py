"""Lowering of the backward pass: each case's adjoint (`autodiff.adjoint`) → one ILIR kernel.

The kernel walks the batches in reverse, roots first: a node's state cotangent is complete
when its batch starts, since every parent lies in an earlier batch and has added its part.
Each batch is one pass of the internal case's adjoint, through the same `PassLowering` as the
forward: its products packed by weight (the forward's, recomputed from the children's stored
states, and the transposed weights' that carry cotangents back), its elementwise ops fused in
one loop over the elements. What a pass sends on is where the effects go:

- `grad_child`: added to the child's row of the cotangent (`cot_c`). A tree's child has one
  parent, so no other node of the batch adds to the same row. A DAG's child may have several
  in one batch: each parent stores its part in the edge's row of `edge_cot_c` instead, and
  a batch begins by summing into each node's cotangent the rows of its edges from its
  parents (`parent_ptr`, `parent_edge`), all of them in earlier batches.
- every other effect: a row per node (per edge, for a value per child) of a `GradientRows`
  array, which the host reduces once the kernel is done. A weight's gradient Σ a ⊗ b keeps
  a and b a row per node (the CPU's: contiguous stores, which its host product reads as
  they lie, the narrower transposed in tiles) or a column per node (`gradient_columns`, the
  GPU's: the layout its sums read), and is one product of the two over all nodes, with the
  kernels' own products (`codegen_cpu.calls.weight_gradient`); or, after
  `with_gradient_sums` (the GPU's), the kernel sums it itself at its end (`GradientSum`). A
  bias's rows are summed by the kernel at its end on either backend (`with_bias_sums`, the
  CPU's: every bias; the GPU's: those that read a weight's first vector).

After the last batch, one pass over every leaf. Where the leaves' effects are linear in some of
their values, and otherwise read only what their key (`node.word`) decides, and every effect
is wanted (not a jacobian's few; `group_leaves`), that pass is three: each leaf's values into
rows of their own, each group of leaves sharing a key summed into one row each (a group per
word, or per tree and word for per-tree gradients), and the effects once a group from the sums
(`leaf_group_values`): SST's 483 leaves of 25 trees are 287 words, and the products by the
transposed weights and the weights' gradients take that many rows."""
import math
from dataclasses import dataclass, replace

import numpy as np

from ..frontend.cell_ir import EACH, label
from ..linearize import distinct, edge_parents
from .ilir import (Alloc, Argument, ArgumentRole, Barrier, BinOp, Comment, Const,
                   GradientRows, GradientSum, Kernel, Let, Load, Loop, LoopRole, RowsOf, Store,
                   Var, add, mul, nodes)
from .lower import (SCALARS, STRUCTURE, PassLowering, cotangent_name, field_name, param_name,
                    state_name, transposed_views)
from .lower import distinct_key as key_of_leaves


def column_position(element, column, matrix):
    """Where element `element` of a value goes in a gradient array of a column a value:
    (element, column); for `matrix`, (rows, width) of a matrix pair's value, its row r in
    column `column` · rows + r, so that a sum over the array's columns runs over every
    node's rows (`GradientSum`)."""
    if matrix is None:
        return element, column
    rows, width = matrix
    return (BinOp("%", element, Const(width)),
            add(mul(column, rows), BinOp("//", element, Const(width))))


@dataclass(frozen=True)
class GradientRow:
    """Element e of row `row` of a gradient array, a value of the node's; with `columns`,
    of its column `row` (a weight gradient's vectors, in the layout its product reads; a
    matrix pair's value, `matrix` = (rows, width), a column a row of it); with `offset`,
    element `offset` + e of a row that holds several values side by side (a weight's
    vectors from each of its products: `one_product_per_weight`)."""

    array: str
    row: object
    columns: bool = False
    matrix: tuple = None
    offset: int = None

    @property
    def node_row(self):
        """The array whose row of the node holds the value's elements in order, and nothing
        else (None: a column each, or beside other values), which a product can read in
        place of a packed copy (`PassLowering.rows_stored`)."""
        return (None if self.columns or self.offset is not None or self.row != Var("node")
                else self.array)

    def stores(self, lowering, emitter, value, position, element):
        at = (column_position(element, self.row, self.matrix) if self.columns
              else (self.row, element if self.offset is None else add(element, self.offset)))
        return [Store(self.array, at, emitter.element(value, element, position))]


@dataclass(frozen=True)
class ChildCotangent:
    """Element e of child k's cotangent, added to."""

    array: str
    child: int

    def stores(self, lowering, emitter, value, position, element):
        at = (lowering.child(self.child), element)
        return [Store(self.array, at, BinOp("+", Load(self.array, at),
                                            emitter.element(value, element, position)))]


@dataclass(frozen=True)
class EdgeCotangent:
    """Element e of child k's cotangent, as this node sends it: the row of the node's edge to
    the child (a DAG's child gathers its parents' rows)."""

    array: str
    child: int

    def stores(self, lowering, emitter, value, position, element):
        edge = add(Load("child_ptr", (Var("node"),)), self.child)
        return [Store(self.array, (edge, element), emitter.element(value, element, position))]


@dataclass(frozen=True)
class EachChild:
    """For each edge of the node, a value per child: added to the child's cotangent row
    (`by_edge` False), or stored in the edge's row of a gradient array (its column, with
    `columns`). The pass's loop over the edges holds every such store (`each_child`)."""

    array: str
    by_edge: bool
    columns: bool = False
    matrix: tuple = None
    each_child = True

    def store(self, term, element):
        at = (Var("edge") if self.by_edge else Var("child"), element)
        if self.columns:
            at = column_position(element, at[0], self.matrix)
        if not self.by_edge:
            term = BinOp("+", Load(self.array, at), term)
        return Store(self.array, at, term)


def edge_cotangent_name(component):
    """A DAG backward's cotangent of state component `component` that a parent sends a child,
    a row per edge."""
    return f"edge_cot_{component}"


EFFECT_NAMES = {"grad_param": "grad", "grad_param_outer": "grad", "grad_table": "grad",
                "grad_field": "grad_field"}


def effect_outputs(case, prefix, rows, row, wanted=None, shared_children=False,
                   gradient_columns=False):
    """(the pass's outputs, the `GradientRows` they fill): each effect of adjoint `case`
    where it goes, of those `wanted` ((effect, parameter or field) pairs; None: all), and
    every child's cotangent (with `shared_children`, a DAG's, in its edge's row); `rows`,
    `row`: what a node's row of a gradient array is, and its index. A parameter's gradient
    whose value is a weight gradient's first vector (a bias beside its weight: `U h + b`)
    reads that vector instead of a row of its own. With `gradient_columns`, a weight
    gradient's vectors are stored as columns, a node's each."""
    outputs, gradients = [], []
    effects = [(index, op) for index, op in enumerate(case.ops)
               if op.kind == "grad_child" or op.kind in EFFECT_NAMES
               and (wanted is None or (op.kind, op.attrs[0]) in wanted)]
    first_vectors = {(op.args[0], op.per_child): _effect_array(prefix, index, op) + "_a"
                     for index, op in effects if op.kind == "grad_param_outer"
                     and len(case.ops[op.args[0]].shape) == 1}
    read_by_biases = {(op.args[0], op.per_child) for _, op in effects
                      if op.kind == "grad_param" and (op.args[0], op.per_child) in first_vectors}
    side_by_side = ({} if gradient_columns else
                    one_product_per_weight(case, effects, read_by_biases))
    for index, op in effects:
        if op.kind == "grad_child":
            outputs.append((op.args[0], _child_target(op, shared_children)))
            continue
        effect_rows = RowsOf.EDGES if op.per_child else rows
        shared = first_vectors.get((op.args[0], op.per_child))
        if op.kind == "grad_param" and shared is not None:
            gradients.append(GradientRows(shared, op.kind, op.attrs, effect_rows,
                                          case.ops[op.args[0]].size,
                                          columns=gradient_columns))
            continue
        if index in side_by_side:
            first, place, count = side_by_side[index]
            name = _effect_array(prefix, first, case.ops[first])
            for side, value in enumerate(op.args):
                array, size = name + ("_a", "_b")[side], case.ops[value].size
                outputs.append((value, GradientRow(array, row, offset=place * size)))
                if place == 0:
                    gradients.append(GradientRows(array, op.kind, op.attrs, effect_rows,
                                                  count * size, side, name, vectors=count))
            continue
        name = _effect_array(prefix, index, op)
        pair = name if len(op.args) > 1 else None  # a weight's: two vectors a node
        columns = bool(pair) and gradient_columns
        for side, value in enumerate(op.args):
            array = name + ("_a", "_b")[side] if pair else name
            shape = case.ops[value].shape
            matrix = shape if pair and len(shape) == 2 else None
            target = (EachChild(array, True, columns, matrix) if op.per_child
                      else GradientRow(array, row, columns, matrix))
            outputs.append((value, target))
            gradients.append(GradientRows(array, op.kind, op.attrs, effect_rows,
                                          case.ops[value].size, side, pair, columns,
                                          shape[0] if matrix else 1))
    return outputs, gradients


def one_product_per_weight(case, effects, read_by_biases):
    """{effect index: (the index of its weight's first effect, its place, how many)} for
    each weight whose gradient is the sum of several outer products of a node's vectors
    (binary TreeLSTM's `U_f`, by each child's h): their vectors go side by side in one row
    a node, a vector each (`GradientRows.vectors`), and the host's one product over all
    of them is the weight's gradient: no product a pair, no sum of the products. Not per
    child (an edge's row), nor matrices, nor where a bias reads the first vector
    (`read_by_biases`: (value, per child) pairs)."""
    by_weight = {}
    for index, op in effects:
        if (op.kind == "grad_param_outer" and not op.per_child
                and (op.args[0], op.per_child) not in read_by_biases
                and all(len(case.ops[value].shape) == 1 for value in op.args)):
            sizes = tuple(case.ops[value].size for value in op.args)
            by_weight.setdefault((op.attrs[0], sizes), []).append(index)
    return {index: (indices[0], place, len(indices))
            for indices in by_weight.values() if len(indices) > 1
            for place, index in enumerate(indices)}


def _effect_array(prefix, index, op):
    """The name of the array that effect `op`, op `index` of its case, fills."""
    return f"{prefix}{EFFECT_NAMES[op.kind]}_{label(op.attrs[0])}_{index}"


def _child_target(op, shared_children):
    """Where a `grad_child` effect adds its value: the child's cotangent row, or (a DAG's)
    the edge's row."""
    child, component = op.attrs
    if shared_children:
        return (EachChild(edge_cotangent_name(component), True) if child == EACH
                else EdgeCotangent(edge_cotangent_name(component), child))
    return (EachChild(cotangent_name(component), False) if child == EACH
            else ChildCotangent(cotangent_name(component), child))


def row_counts(linearized, groups=None):
    """{`RowsOf`: how many rows a `GradientRows` array of that kind has for this forest (and
    these `LeafGroups`)}."""
    return {RowsOf.INTERNAL: linearized.leaf_begin,
            RowsOf.LEAVES: linearized.num_nodes - linearized.leaf_begin,
            RowsOf.EDGES: int(linearized.child_ptr[linearized.leaf_begin]),
            RowsOf.LEAF_GROUPS: 0 if groups is None else groups.count}


def kept_shapes(kept, linearized, scalars):
    """{array: shape} of the arrays of `KeptProduct`s `kept` that a forward kernel fills for
    this forest: a row per internal node, edge from one, leaf or distinct key of the leaves
    (`scalars`, the kernel's, count those), `stride` rows each. Every run asks: most keep
    nothing."""
    if not kept:
        return {}
    rows = {**row_counts(linearized),
            RowsOf.DISTINCT_LEAVES: scalars.get("num_distinct_leaves", 0)}
    return {product.array: (rows[product.rows] * product.stride, product.width)
            for product in kept}


def kept_for_copies(kept, arrays, original, linearized, node_of, distinct_key=None):
    """The arrays of the `KeptProduct`s `kept` (`arrays`, by name) that a forward run on
    `original` kept, for `linearized`: a forest each of whose nodes n copies node
    `node_of[n]` of `original`, children in the same order (a jacobian's copies of the
    forest). Each row (an internal node's, an edge's, a leaf's, or a distinct key's of the
    leaves, by the field `distinct_key`) is the row of the one it copies."""
    leaf_begin, child_ptr = linearized.leaf_begin, linearized.child_ptr
    parents = edge_parents(linearized)
    leaf_of = node_of[leaf_begin:] - original.leaf_begin
    entity_of = {RowsOf.INTERNAL: node_of[:leaf_begin],
                 RowsOf.EDGES: (original.child_ptr[node_of[parents]]
                                + np.arange(parents.size) - child_ptr[parents]),
                 RowsOf.LEAVES: leaf_of}
    if any(product.rows is RowsOf.DISTINCT_LEAVES for product in kept):
        first, _ = distinct(linearized.fields[distinct_key][leaf_begin:])
        _, slot = distinct(original.fields[distinct_key][original.leaf_begin:])
        entity_of[RowsOf.DISTINCT_LEAVES] = slot[leaf_of[first]]
    copied = {}
    for product in kept:
        if product.array not in copied:
            rows = arrays[product.array]
            copied[product.array] = rows.reshape(-1, product.stride, rows.shape[1])[
                entity_of[product.rows]].reshape(-1, rows.shape[1])
    return copied


def gathered_rows(product, array, linearized):
    """(the table's rows, their values as the forward gathered them, one per row) of
    `KeptProduct` `product` of a gathered row (`gathered`), kept in `array` (a forward's
    run on `linearized`): a leaf's row, or a distinct key's, unpacked as its product packed
    it (a matrix a column a packed row)."""
    _, field = product.gathered
    rows = np.asarray(linearized.fields[field][linearized.leaf_begin:], dtype=np.int64)
    if product.rows is RowsOf.DISTINCT_LEAVES:
        rows = rows[distinct(rows)[0]]
    values = array.reshape(-1, product.stride, array.shape[1])[
        :, product.row:product.row + product.columns]
    return rows, values[:, 0] if product.columns == 1 else values.transpose(0, 2, 1)


def gradient_shapes(kernel, linearized, groups=None):
    """{array: shape} of the backward `kernel`'s `GradientRows` outputs for this forest and
    its `groups` of leaves (a bias's and its weight's vector share one): a row per node, edge
    or group, or a column each where the kernel writes them as the columns of a product's
    operand (`columns`)."""
    rows, shapes = row_counts(linearized, groups), {}
    for output in kernel.gradients:
        shapes.setdefault(output.name, (output.size // output.vectors,
                                        rows[output.rows] * output.vectors)
                          if output.columns else (rows[output.rows], output.size))
    return shapes


def with_gradient_sums(kernel):
    """The backward `kernel` ending with its weights' gradients summed over the nodes
    (`GradientSum`), and the biases' that read a weight's first vector, after a barrier: each
    a parameter's whole gradient, in an array of its own, for a backend that would rather
    not copy every node's rows back (the GPU's)."""
    pairs, sums = {}, []
    for rows in kernel.gradients:
        if rows.effect == "grad_param_outer":
            pairs.setdefault(rows.pair, [None, None])[rows.side] = rows
    for pair, (a, b) in pairs.items():
        sums.append(GradientSum(f"{pair}_sum", a.attrs[0], a.name, b.name,
                                (a.size // a.vectors, b.size // b.vectors), (a, b)))
    first_vectors = {a.name for a, _ in pairs.values()}
    return _ending_with(kernel, sums + [bias_sum(rows) for rows in kernel.gradients
                                        if rows.effect == "grad_param"
                                        and rows.name in first_vectors],
                        "each parameter's gradient, summed over the nodes: it alone leaves "
                        "the device")


def with_bias_sums(kernel):
    """The backward `kernel` ending with every bias's gradient (each `grad_param` array of a
    row per node, edge or group of leaves) summed over its rows (`GradientSum`), after a
    barrier: the CPU's, whose threads sum them in one pass while the rows are still in their
    caches. The weights' gradients stay rows, which the host multiplies
    (`codegen_cpu.calls.weight_gradient`)."""
    return _ending_with(kernel, [bias_sum(rows) for rows in kernel.gradients
                                 if rows.effect == "grad_param"],
                        "each bias's gradient, summed over its rows")


def bias_sum(rows):
    """The `GradientSum` of a bias's `GradientRows`: its vector summed over the nodes."""
    return GradientSum(f"{rows.name}_sum_{label(rows.attrs[0])}", rows.attrs[0], rows.name,
                       None, (rows.size,), (rows,))


def _ending_with(kernel, sums, comment):
    """`kernel` with `sums` after its passes, each total an argument of its own."""
    if not sums:
        return kernel
    body = kernel.body + (Barrier("the sums read every node's vectors"), Comment(comment), *sums)
    roles = kernel.roles + tuple(Argument(total.total, ArgumentRole.GRADIENT_SUM,
                                          total.parameter) for total in sums)
    return replace(kernel, body=body, roles=roles,
                   arrays=kernel.arrays + tuple(total.total for total in sums))


def gradient_sums(kernel):
    """The kernel's `GradientSum`s, in order: statements of its body's top level, where
    `with_gradient_sums` puts them (a pullback asks for them at every call)."""
    return tuple(statement for statement in kernel.body if isinstance(statement, GradientSum))


def edge_cotangent_shapes(kernel, linearized, cotangents):
    """{array: shape} of a DAG backward's edge cotangents: a row per edge, as wide as the
    state component's cotangent; they start at zero."""
    edges = int(linearized.child_ptr[-1])
    return {name: (edges, cotangent.shape[1]) for name, cotangent in
            zip(kernel.arrays_of(ArgumentRole.EDGE_COTANGENT), cotangents)}


def lower_backward(cell, adjoints, row_block, wanted=None, shared_children=False, kept=(),
                   distinct_key=None, gradient_columns=False, group_leaves=True):
    """The backward kernel of `cell` from its cases' adjoints ({"leaf": .., "internal": ..}),
    computing the `wanted` effects ((effect, parameter or field) pairs; None: all). With
    `shared_children` (a DAG's), children's cotangents go through their edges' rows. `kept`:
    the products the forward kept (`KeptProduct`s), read, not recomputed; a leaf's, kept once
    per distinct value of the forward's `distinct_key`, at the leaf's `leaf_slot`. With
    `gradient_columns`, a weight gradient's vectors are stored a column per node, else a row
    (see the module's docstring); with `group_leaves` (the default), the leaves' rows are
    summed by group where their effects allow it (`leaf_group_values`), for all effects
    only."""
    batch_outputs, batch_gradients = effect_outputs(adjoints["internal"], "batch_",
                                                    RowsOf.INTERNAL, Var("node"), wanted,
                                                    shared_children, gradient_columns)
    internal, leaves = _kept_places(kept, (RowsOf.INTERNAL, RowsOf.EDGES))
    batch_pass = PassLowering(cell, adjoints["internal"], "batch_", Var("count"),
                              add(Var("begin"), Var("slot")), Var("max_batch_size"), internal,
                              row_block, Var("max_batch_edges"), children_inside=True,
                              shared_segments=True)
    allocations, statements = batch_pass.lower(batch_outputs)
    gathered, leaves_gathered = [], []
    if shared_children:
        gathered = _from_parents(cell, Var("count"), add(Var("begin"), Var("slot")))
        leaves_gathered = _from_parents(cell, Var("num_leaves"),
                                        add(Var("leaf_begin"), Var("slot")))
    batch_loop = Loop("b", Const(0), BinOp("-", Var("num_batches"), Const(1)), tuple(
        [Let("begin", Load("batch_begin", (Var("b"),))),
         Let("count", BinOp("-", Load("batch_begin", (add(Var("b"), 1),)), Var("begin")))]
        + gathered + statements
        + [Barrier("the next batch reads the cotangents this one sent its children")]),
        LoopRole.BATCHES)
    leaf_case = adjoints["leaf"]
    leaf_pass = PassLowering(cell, leaf_case, "leaf_", Var("num_leaves"),
                             add(Var("leaf_begin"), Var("slot")), Var("num_leaves"), leaves,
                             row_block, shared_segments=True)
    group_key = key_of_leaves(leaf_case) if group_leaves and wanted is None else None
    grouped = leaf_group_values(leaf_case, group_key) if group_key else None
    if grouped is None:
        group_key = None
        leaf_outputs, leaf_gradients = effect_outputs(leaf_case, "leaf_", RowsOf.LEAVES,
                                                      Var("slot"), wanted, shared_children,
                                                      gradient_columns)
        leaf_allocations, leaf_statements = leaf_pass.lower(leaf_outputs)
        leaf_body = leaf_allocations + leaves_gathered + leaf_statements
    else:
        leaf_body, leaf_gradients = _grouped_leaves(cell, leaf_pass, grouped, group_key,
                                                    row_block, gradient_columns, kept)
        leaf_body = leaves_gathered + leaf_body
    body = ([Let("num_leaves", BinOp("-", Var("num_nodes"), Var("leaf_begin"))),
             Comment("the batches of internal nodes, roots first")] + allocations
            + [batch_loop, Comment("every leaf at once, its parents all done")] + leaf_body)
    if wanted is not None:
        names = ", ".join(f"`{label(name)}`" for name in sorted(name for _, name in wanted))
        body.insert(0, Comment(f"only the effects on {names}, for a jacobian: no other "
                               "gradient"))
    return _backward_kernel(cell, adjoints, tuple(body), tuple(batch_gradients + leaf_gradients),
                            shared_children, tuple(kept), distinct_key, group_key)


def leaf_group_values(case, key):
    """The values of the leaf adjoint `case` whose sums over leaves sharing field `key` give
    the sum of every effect over them, or None. Each effect must read per-leaf values only
    through products by parameters (linear: Σ W v = W Σ v), which then run once a group, and
    otherwise only what the key decides (parameters, rows gathered by the key: Σ v ⊗ E[word]
    = (Σ v) ⊗ E[word]); a table's gradient must be by the key, whose rows the host sums by it
    anyway. A leaf's own field's gradient, or an effect that reads only the key (counted once
    a leaf), is not; nor is a matrix."""
    ops = case.ops
    decided = {}

    def by_key(value):
        """Whether `value` depends on nothing but the parameters and the key's rows."""
        if value not in decided:
            op = ops[value]
            if op.kind in ("param", "const", "fill"):
                decided[value] = True
            elif op.kind == "gather":
                decided[value] = op.attrs[1] == key
            else:
                decided[value] = bool(op.args) and all(by_key(arg) for arg in op.args)
        return decided[value]

    def root(value):
        """The value a chain of products by parameters starts from."""
        op = ops[value]
        if op.kind in ("matvec", "matmul") and by_key(op.args[0]):
            return root(op.args[1])
        return value

    roots = []
    for op in ops:
        if op.kind == "grad_param":
            per_leaf = op.args
        elif op.kind == "grad_param_outer":
            per_leaf = [arg for arg in op.args if not by_key(arg)]
            if len(per_leaf) != 1:
                return None
        elif op.kind == "grad_table" and op.attrs[1] == key:
            per_leaf = op.args[:1]
        elif op.kind in EFFECT_NAMES or op.kind == "grad_child":
            return None
        else:
            continue
        if any(by_key(arg) for arg in per_leaf):
            return None
        roots += [root(arg) for arg in per_leaf if root(arg) not in roots]
    if not roots or any(len(ops[value].shape) > 1 for value in roots):
        return None
    return tuple(roots)


def _grouped_leaves(cell, leaf_pass, values, key, row_block, gradient_columns, kept=()):
    """(statements, `GradientRows`) of the leaf pass in three (`leaf_group_values`): each
    leaf's `values` into rows of their own (`leaf_v…`, by `leaf_pass`); each group of leaves
    sharing `key` (`group_ptr`, `group_leaves`) summed into a row of each (`group_v…`, or the
    rows of an effect that stores the value itself: a weight gradient's vector); the effects
    once a group, from the sums, at its first leaf, whose key the group's leaves share, and
    whose `kept` products (a gathered row) are the group's."""
    case = leaf_pass.case
    group, element = Var("slot"), Var("e")
    outputs, gradients = effect_outputs(case, "group_", RowsOf.LEAF_GROUPS, group,
                                        gradient_columns=gradient_columns)
    rows, sums, scratch = {}, {}, []
    for value in values:
        rows[value] = f"leaf_v{value}"
        stored = [target for output, target in outputs
                  if output == value and target == GradientRow(target.array, group)]
        if stored:
            sums[value] = stored[0].array
            outputs.remove((value, stored[0]))
        else:
            sums[value] = f"group_v{value}"
            scratch.append(Alloc(sums[value], (Var("num_leaf_groups"),
                                               Const(case.ops[value].size))))
    allocations, statements = leaf_pass.lower([(value, GradientRow(rows[value], group))
                                               for value in values])

    def each_element(value, store):
        return Loop("e", Const(0), Const(case.ops[value].size), (store,), LoopRole.ELEMENTS)

    zeros = [each_element(value, Store(sums[value], (group, element), Const(0.0)))
             for value in values]
    added = [each_element(value, Store(sums[value], (group, element), BinOp(
        "+", Load(sums[value], (group, element)), Load(rows[value], (Var("leaf"), element)))))
        for value in values]
    members = Loop("member", Load("group_ptr", (group,)), Load("group_ptr", (add(group, 1),)),
                   (Let("leaf", Load("group_leaves", (Var("member"),))), *added),
                   LoopRole.GROUP_LEAVES)
    summing = Loop("slot", Const(0), Var("num_leaf_groups"), (*zeros, members), LoopRole.NODES)
    first_leaf = Load("group_leaves", (Load("group_ptr", (group,)),))
    _, first_leaf_kept = _kept_places(kept, (RowsOf.INTERNAL, RowsOf.EDGES), first_leaf)
    group_pass = PassLowering(cell, case, "group_", Var("num_leaf_groups"),
                              add(Var("leaf_begin"), first_leaf), Var("num_leaf_groups"),
                              {**first_leaf_kept,
                               **{value: (sums[value], 1, 0, group, 1) for value in values}},
                              row_block, shared_segments=True, operands_in_place=True)
    group_allocations, group_statements = group_pass.lower(outputs)
    names = ", ".join(f"v{value}" for value in values)
    body = ([Alloc(rows[value], (Var("num_leaves"), Const(case.ops[value].size)))
             for value in values] + allocations + statements
            + [Barrier("the groups sum their leaves' rows"),
               Comment(f"the leaves' {names} summed by group, leaves sharing `{key}`")]
            + scratch + [summing, Barrier("the groups' effects read their sums")]
            + group_allocations + group_statements)
    return body, gradients


def _kept_places(kept, internal_rows, leaf=None):
    """({value: its place} of the internal case's kept products, the same of the leaf
    case's), in the form `PassLowering`'s available values take: a row of the node's, the
    edge's, leaf `leaf`'s (None: the pass's slot), or that leaf's distinct key's."""
    leaf = Var("slot") if leaf is None else leaf
    row_of = {RowsOf.INTERNAL: Var("node"), RowsOf.EDGES: Var("edge"), RowsOf.LEAVES: leaf,
              RowsOf.DISTINCT_LEAVES: Load("leaf_slot", (leaf,))}
    places = ({}, {})
    for product in kept:
        places[product.rows not in internal_rows][product.value] = (
            product.array, product.stride, product.row, row_of[product.rows],
            product.columns)
    return places


def _from_parents(cell, count, node_of_slot):
    """A pass over `count` nodes that adds to each node's cotangents the rows its parents
    stored in their edges to it, then a barrier: a DAG node's cotangent, complete."""
    sums = []
    for component, shape in enumerate(cell.state_shapes):
        cotangent, edges = cotangent_name(component), edge_cotangent_name(component)
        at = (Var("node"), Var("e"))
        sums.append(Loop("e", Const(0), Const(math.prod(shape)), (Store(cotangent, at, BinOp(
            "+", Load(cotangent, at), Load(edges, (Var("edge"), Var("e"))))),),
            LoopRole.ELEMENTS))
    node = Var("node")
    parents = Loop("parent", Load("parent_ptr", (node,)), Load("parent_ptr", (add(node, 1),)),
                   (Let("edge", Load("parent_edge", (Var("parent"),))),) + tuple(sums),
                   LoopRole.PARENT_EDGES)
    return [Loop("slot", Const(0), count, (Let("node", node_of_slot), parents), LoopRole.NODES),
            Barrier("the pass reads its nodes' cotangents, gathered from their parents")]


def _tables_unread(cell, body):
    """The tables the cell only gathers rows from whose rows `body` never loads: the forward
    kept every row it gathered from them (`PassLowering.keeps_gathered_rows`), and the
    backward reads those. Not arguments of the kernel, so that a pullback need not check
    them (`autodiff.pullback.parameter_guards`)."""
    loaded = {load.array for load in nodes(body, Load)}
    return {table for table in cell.only_gathered() if param_name(table) not in loaded}


def _backward_kernel(cell, adjoints, body, gradients, shared_children, kept, distinct_key,
                     group_key):
    components = range(len(cell.state_shapes))
    distinct = any(product.rows is RowsOf.DISTINCT_LEAVES for product in kept)
    unread = _tables_unread(cell, body)
    structure = (STRUCTURE + (("parent_ptr", "parent_edge") if shared_children else ())
                 + (("leaf_slot",) if distinct else ())
                 + (("group_ptr", "group_leaves") if group_key else ()))
    roles = (tuple(Argument(name, ArgumentRole.STRUCTURE) for name in structure)
             + tuple(Argument(field_name(f), ArgumentRole.FIELD, f) for f in sorted(cell.fields))
             + tuple(Argument(param_name(p), ArgumentRole.PARAMETER, p)
                     for p in sorted(cell.parameters) if p not in unread)
             + tuple(Argument(state_name(c), ArgumentRole.STATE) for c in components)
             + tuple(Argument(cotangent_name(c), ArgumentRole.COTANGENT) for c in components)
             + tuple(Argument(edge_cotangent_name(c), ArgumentRole.EDGE_COTANGENT)
                     for c in components if shared_children)
             + tuple(Argument(name, ArgumentRole.KEPT)
                     for name in dict.fromkeys(product.array for product in kept))
             + tuple(Argument(name, ArgumentRole.GRADIENT)
                     for name in dict.fromkeys(rows.name for rows in gradients)))
    return Kernel(f"{cell.name}_backward", cell.dtype,
                  SCALARS + (("num_leaf_groups",) if group_key else ()),
                  tuple(argument.name for argument in roles), (), body,
                  transposed=transposed_views(adjoints.values(), body), roles=roles,
                  gradients=gradients, kept=kept,
                  distinct_key=distinct_key if distinct else None, group_key=group_key)
