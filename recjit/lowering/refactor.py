"""Recursive refactoring (Cortex §4.3, Fig. 4): a cell IR → cell IR rewrite.

A parent's product of a weight with its children's states, `U @ (h_left + h_right)` or
`W @ [h_left; h_right]` or `U @ h_k` per child, is linear in each child's state. It is
rewritten as a sum of `child_projection` values, `U @ h` computed by every node at the end of
its own iteration, right after its state (the recursion's back-edge moves past the product).
The parent reads them elementwise, so its iteration no longer begins with a pack of its
children's states behind a barrier."""
from dataclasses import dataclass, replace

from ..frontend.cell_ir import EACH, Op, label


@dataclass(frozen=True)
class Projection:
    """`name[node, r] = Σ_k weight[r, columns_begin + k] · state_<component>[node, k]`, for
    every node, computed right after the node's state."""

    name: str
    weight: str
    component: int
    columns: tuple   # (begin, end) of the weight's columns, or None: all of them
    rows: int
    width: int       # the state's size: the columns multiplied


@dataclass(frozen=True)
class Refactoring:
    """The rewritten cell, the projections every node computes, and the products of the
    internal case they replace: (rows, columns, once per child) each."""

    cell: object
    projections: tuple
    replaced: tuple

    def multiply_adds(self, children):
        """(before, after) per internal node, in a forest with internal nodes of `children`
        children, which has about `children` nodes per internal node (a sequence: 1)."""
        before = sum(rows * columns * (children if per_child else 1)
                     for rows, columns, per_child in self.replaced)
        after = children * sum(projection.rows * projection.width
                               for projection in self.projections)
        return before, after


def refactor(cell):
    """The refactored cell; unchanged, with no projections, when no product of the internal
    case is a linear function of child states alone."""
    projections, replaced = {}, []
    cases = tuple(_refactor_case(cell, case, projections, replaced) if case.name != "leaf"
                  else case for case in cell.cases)
    return Refactoring(replace(cell, cases=cases), tuple(projections.values()), tuple(replaced))


def _refactor_case(cell, case, projections, replaced):
    ops, renumbered = [], {}

    def emit(op):
        ops.append(op)
        return len(ops) - 1

    for value, op in enumerate(case.ops):
        terms = _product_terms(case.ops, value, cell.state_shapes)
        if terms is None:
            renumbered[value] = emit(replace(op, args=tuple(renumbered[a] for a in op.args)))
            continue
        weight = case.ops[op.args[0]].attrs[0]
        rows, width = case.ops[op.args[0]].shape
        replaced.append((rows, width, op.per_child))
        total = None
        for child, component, begin, end, summed in terms:
            columns = None if (begin, end) == (0, width) else (begin, end)
            name = f"proj_{label(weight)}_{component}" + (f"_{begin}_{end}" if columns else "")
            projections.setdefault(name, Projection(name, weight, component, columns, rows,
                                                    end - begin))
            term = emit(Op("child_projection", (), (child, name), (rows,), op.line,
                           per_child=child == EACH))
            if summed:
                term = emit(Op("child_sum", (term,), (), (rows,), op.line))
            total = term if total is None else emit(
                Op("binary", (total, term), ("add",), (rows,), op.line, per_child=op.per_child))
        renumbered[value] = total
    outputs = tuple(renumbered[o] for o in case.outputs)
    return replace(case, ops=tuple(ops), outputs=outputs)


def _product_terms(ops, value, state_shapes):
    """For a product `param @ operand` whose operand is a sum or concatenation of child state
    vectors: [(child, component, column begin, column end, summed over children)]; else None."""
    op = ops[value]
    if op.kind != "matvec" or ops[op.args[0]].kind != "param":
        return None
    return _linear_terms(ops, op.args[1], 0, state_shapes)


def _linear_terms(ops, value, offset, state_shapes):
    op = ops[value]
    if op.kind == "child_state":
        child, component = op.attrs
        if len(state_shapes[component]) != 1:
            return None
        return [(child, component, offset, offset + op.size, False)]
    if op.kind == "child_sum":
        terms = _linear_terms(ops, op.args[0], offset, state_shapes)
        return terms and [(child, component, begin, end, True)
                          for child, component, begin, end, _ in terms]
    if op.kind == "binary" and op.attrs[0] == "add" \
            and all(ops[a].shape == op.shape for a in op.args):
        left, right = (_linear_terms(ops, a, offset, state_shapes) for a in op.args)
        return left and right and left + right
    if op.kind == "concat" and len(op.shape) == 1:
        terms = []
        for part in op.args:
            part_terms = _linear_terms(ops, part, offset, state_shapes)
            if not part_terms:
                return None
            terms += part_terms
            offset += ops[part].size
        return terms
    return None
