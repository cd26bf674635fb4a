"""Reverse mode on the cell IR: each structural case's op list → its adjoint case.

The adjoint case is one op list: the case's own ops first (recomputed from the children's
stored states, so nothing of a node's forward is kept), then the ops that carry the
cotangents of the node's state back to everything the node read, written with the cell IR's
own op kinds and a few of their own (below), then the *effects* that send each cotangent
where it belongs: a parameter's gradient, a gathered row's, a field's, a child's state.
Each op of the case gets one rule (`_RULES`); an op that reads nothing differentiable has
none. A value read by several ops sums their contributions; a value of the node read per
child sums those of every child (`child_sum`).

Op kinds of the adjoint only, besides the cell IR's (`frontend.cell_ir`):

  cotangent    (component,)       the cotangent of component c of the node's state
  transpose    ()                 a computed matrix transposed
  outer        ()                 vector ⊗ vector, a matrix
  pad          (start, stop)      a vector (or rows of a matrix) of zeros but start..stop
  each_child   ()                 a value of the node's, as a value per child
  sum          ()                 the sum of a value's elements, a number
  unary sign, binary picks_first / picks_first_min: the derivatives' own functions (the
  sign of a number; 1 where maximum or minimum returns its first operand, as NumPy's do at
  a tie and at a NaN, else 0)

Effects (no value):

  grad_param        (name,) %v        parameter `name`'s gradient += v, over every node
  grad_param_outer  (name,) %a %b     parameter `name`'s gradient += Σ a ⊗ b over every node
                                      (over every row of a and b, where they are matrices
                                      of as many rows), the weight gradient of a product, a
                                      product itself
  grad_table        (table, field) %v row table[node.field]'s gradient += v
  grad_field        (name,) %v        the node's field `name`'s gradient += v
  grad_child        (child, comp) %v  child k's (or each child's) state component's cotangent
                                      += v
"""
from dataclasses import dataclass, replace

from ..errors import UnsupportedError
from ..frontend.cell_ir import OVER_CHILDREN, Op, attribute, transposed


@dataclass(frozen=True)
class AdjointCase:
    """The adjoint of a `CellCase`: `ops` (the case's own, then the adjoint's, SSA as the cell
    IR's) and `forward` (how many of them are the case's own)."""

    name: str
    num_children: int
    ops: tuple
    forward: int

    def __str__(self):
        count = "any number of" if self.num_children is None else self.num_children
        lines = [(f"adjoint of case {self.name} ({count} children; its ops %0..%"
                  f"{self.forward - 1} recomputed):")]
        for index, op in enumerate(self.ops[self.forward:], self.forward):
            operands = ", ".join(f"%{a}" for a in op.args)
            attrs = ", ".join(str(a) for a in op.attrs)
            text = ", ".join(t for t in (attrs, operands) if t)
            per_child = "  per child" if op.per_child else ""
            target = "  " if op.kind.startswith("grad_") else f"  %{index} = "
            lines.append(f"{target}{op.kind} {text}".rstrip()
                         + ("" if op.kind.startswith("grad_") else f"    : {op.shape}")
                         + per_child)
        return "\n".join(lines)


def adjoint_case(case, source_name="the cell"):
    """The `AdjointCase` of `case`; an op without a rule is an `UnsupportedError` at its line
    (`source_name` names the cell's file in it)."""
    return _Adjoint(case, source_name).build()


class _Adjoint:
    def __init__(self, case, source_name):
        self.case = case
        self.source_name = source_name
        self.ops = list(case.ops)
        # an op the case computes already is read, not emitted again (a GRU's `1 - z` is its
        # sigmoid's slope `1 - y` too); the frontend's memo made the case's ops unique
        self.memo = {(op.kind, op.args, op.attrs, op.shape): index
                     for index, op in enumerate(case.ops)}
        self.cotangents = {}  # forward value → the op holding its summed cotangent

    # building ops -------------------------------------------------------------------------
    def emit(self, kind, args, attrs, shape, line):
        per_child = kind in ("each_child", "child_position") or (
            any(self.ops[a].per_child for a in args) and kind not in OVER_CHILDREN)
        key = (kind, args, attrs, shape)
        if key not in self.memo:
            self.memo[key] = len(self.ops)
            self.ops.append(Op(kind, args, attrs, shape, line, per_child))
        return self.memo[key]

    def effect(self, kind, attrs, args, line):
        self.ops.append(Op(kind, args, attrs, (), line,
                           any(self.ops[a].per_child for a in args)))

    def binary(self, function, left, right, line):
        shape = self.ops[left].shape or self.ops[right].shape
        return self.emit("binary", (left, right), (function,), shape, line)

    def negated(self, value, line):
        return self.emit("unary", (value,), ("neg",), self.ops[value].shape, line)

    def const(self, value, line):
        return self.emit("const", (), (float(value),), (), line)

    def add_cotangent(self, value, contribution, line):
        """cot(value) += contribution, summed over the children where `value` is the node's
        and the contribution one per child, and over the elements where `value` is a
        number."""
        target = self.case.ops[value]
        if self.ops[contribution].per_child and not target.per_child:
            contribution = self.emit("child_sum", (contribution,), (),
                                     self.ops[contribution].shape, line)
        if target.shape == () and self.ops[contribution].shape != ():
            contribution = self.emit("sum", (contribution,), (), (), line)
        held = self.cotangents.get(value)
        self.cotangents[value] = (contribution if held is None
                                  else self.binary("add", held, contribution, line))

    # the transform --------------------------------------------------------------------------
    def build(self):
        case = self.case
        for component, output in enumerate(case.outputs):
            op = case.ops[output]
            self.add_cotangent(output, self.emit("cotangent", (), (component,), op.shape,
                                                 op.line), op.line)
        for index in range(len(case.ops) - 1, -1, -1):
            gradient = self.cotangents.get(index)
            if gradient is None:
                continue
            op = case.ops[index]
            rule = _RULES.get(op.kind)
            if rule is None:
                raise UnsupportedError(f"`{op.kind}` {op.attrs} has no adjoint rule yet",
                                       filename=self.source_name, lineno=op.line)
            rule(self, index, op, gradient)
        return AdjointCase(case.name, case.num_children,
                           _without_dead_ops(self.ops, len(case.ops)), len(case.ops))

    # rules ----------------------------------------------------------------------------------
    def param(self, index, op, gradient):
        name = op.attrs[0]
        if name != attribute(name):  # the transposed view's gradient, transposed back
            gradient = self.emit("transpose", (gradient,), (), op.shape[::-1], op.line)
        self.effect("grad_param", (attribute(name),), (gradient,), op.line)

    def gather(self, index, op, gradient):
        self.effect("grad_table", op.attrs, (gradient,), op.line)

    def field(self, index, op, gradient):
        self.effect("grad_field", op.attrs, (gradient,), op.line)

    def child_state(self, index, op, gradient):
        self.effect("grad_child", op.attrs, (gradient,), op.line)

    def child_sum(self, index, op, gradient):
        """Each child's term gets the sum's cotangent: a value per child, so that what the
        term read of the node's own sums it over the children again."""
        each = self.emit("each_child", (gradient,), (), self.ops[gradient].shape, op.line)
        self.add_cotangent(op.args[0], each, op.line)

    def child_extreme(self, index, op, gradient):
        """`child_max` (`child_min`) sends its cotangent, element by element, to the one child
        whose value the chain of NumPy's `maximum` returns: of those attaining the maximum,
        the earliest child or the latest (`ties`), as the chain's own pullback does. Each
        child's candidate is its place where it attains the maximum, and its place moved
        past every other child's (by the number of children) where it does not; the least
        candidate (the greatest, for the latest) is the one child."""
        (x,), (ties,), line, shape = op.args, op.attrs, op.line, op.shape
        picks = "picks_first" if op.kind == "child_max" else "picks_first_min"
        attains = self.binary(picks, x, self.emit("each_child", (index,), (), shape, line),
                              line)
        misses = self.binary("sub", self.const(1.0, line), attains, line)
        moved = self.binary("mul", misses, self.emit("num_children", (), (), (), line), line)
        place = self.emit("child_position", (), (), (), line)
        if ties == "earliest":
            candidate = self.binary("add", place, moved, line)
            chosen = self.emit("child_min", (candidate,), ("earliest",), shape, line)
            chooses = "picks_first_min"
        else:
            candidate = self.binary("sub", place, moved, line)
            chosen = self.emit("child_max", (candidate,), ("latest",), shape, line)
            chooses = "picks_first"
        winner = self.binary(chooses, candidate,
                             self.emit("each_child", (chosen,), (), shape, line), line)
        each = self.emit("each_child", (gradient,), (), self.ops[gradient].shape, line)
        self.add_cotangent(x, self.binary("mul", each, winner, line), line)

    def unary(self, index, op, gradient):
        function, (x,), line = op.attrs[0], op.args, op.line
        if function == "neg":
            self.add_cotangent(x, self.negated(gradient, line), line)
            return
        if function == "tanh":  # 1 - y²
            slope = self.binary("sub", self.const(1.0, line),
                                self.binary("mul", index, index, line), line)
        elif function == "sigmoid":  # y (1 - y)
            slope = self.binary("mul", index,
                                self.binary("sub", self.const(1.0, line), index, line), line)
        elif function == "relu":  # maximum(x, 0): x's where x >= 0 (NumPy's at the tie)
            slope = self.binary("picks_first", x, self.const(0.0, line), line)
        elif function == "exp":
            slope = index
        elif function == "log":
            slope = self.binary("div", self.const(1.0, line), x, line)
        elif function == "sqrt":
            slope = self.binary("div", self.const(0.5, line), index, line)
        elif function == "abs":
            slope = self.emit("unary", (x,), ("sign",), op.shape, line)
        else:
            raise UnsupportedError(f"`{function}` has no adjoint rule yet",
                                   filename=self.source_name, lineno=line)
        self.add_cotangent(x, self.binary("mul", gradient, slope, line), line)

    def binary_op(self, index, op, gradient):
        function, (a, b), line = op.attrs[0], op.args, op.line
        if function in ("add", "sub"):
            self.add_cotangent(a, gradient, line)
            self.add_cotangent(b, gradient if function == "add" else self.negated(gradient, line),
                               line)
        elif function == "mul":
            self.add_cotangent(a, self.binary("mul", gradient, b, line), line)
            self.add_cotangent(b, self.binary("mul", gradient, a, line), line)
        elif function == "div":  # d(a/b) = da / b - (a/b) db / b
            self.add_cotangent(a, self.binary("div", gradient, b, line), line)
            quotient = self.binary("div", self.binary("mul", gradient, index, line), b, line)
            self.add_cotangent(b, self.negated(quotient, line), line)
        elif function in ("maximum", "minimum"):
            picks = "picks_first" if function == "maximum" else "picks_first_min"
            first = self.binary(picks, a, b, line)
            other = self.binary("sub", self.const(1.0, line), first, line)
            self.add_cotangent(a, self.binary("mul", gradient, first, line), line)
            self.add_cotangent(b, self.binary("mul", gradient, other, line), line)
        else:
            raise UnsupportedError(f"`{function}` has no adjoint rule yet",
                                   filename=self.source_name, lineno=line)

    def matvec(self, index, op, gradient):
        matrix, vector, line = op.args[0], op.args[1], op.line
        weight = self.case.ops[matrix]
        if weight.kind == "param":  # W x: Wᵀ g for x, Σ g ⊗ x for W
            name = weight.attrs[0]
            turned = self.emit("param", (), (transposed(name),), weight.shape[::-1], line)
            self.add_cotangent(vector, self.emit("matvec", (turned, gradient), (),
                                                 self.case.ops[vector].shape, line), line)
            if name == attribute(name):
                self.effect("grad_param_outer", (name,), (gradient, vector), line)
            else:  # (Wᵀ) x: Σ x ⊗ g for W
                self.effect("grad_param_outer", (attribute(name),), (vector, gradient), line)
            return
        turned = self.emit("transpose", (matrix,), (), weight.shape[::-1], line)
        self.add_cotangent(vector, self.emit("matvec", (turned, gradient), (),
                                             self.case.ops[vector].shape, line), line)
        self.add_cotangent(matrix, self.emit("outer", (gradient, vector), (), weight.shape,
                                             line), line)

    def matmul(self, index, op, gradient):
        """L R: g Rᵀ for L, Lᵀ g for R. A parameter's, where the other side is computed, is a
        weight gradient over the rows of two matrices (`grad_param_outer`): W M gives W
        Σ_k g[:, k] ⊗ M[:, k], the rows of gᵀ and Mᵀ; M W gives W Σ_k M[k] ⊗ g[k]; a
        transposed view's, the same with the two sides swapped. The parameter's gradient is
        then one product over every node's rows, not a product a node."""
        left, right, line = op.args[0], op.args[1], op.line
        left_op, right_op = self.case.ops[left], self.case.ops[right]
        if left_op.kind == "param" and right_op.kind != "param":
            turned = self.emit("transpose", (gradient,), (), self.ops[gradient].shape[::-1],
                               line)
            self.matrix_weight_gradient(left_op, turned, self.turned(right), line)
        else:
            self.add_cotangent(left, self.emit("matmul", (gradient, self.turned(right)), (),
                                               left_op.shape, line), line)
        if right_op.kind == "param" and left_op.kind != "param":
            self.matrix_weight_gradient(right_op, left, gradient, line)
        else:
            self.add_cotangent(right, self.emit("matmul", (self.turned(left), gradient), (),
                                                right_op.shape, line), line)

    def matrix_weight_gradient(self, weight, a, b, line):
        """Parameter `weight`'s gradient += Σ_k a[k] ⊗ b[k] over the rows of matrices `a`
        and `b`; for a transposed view, its parameter's += Σ_k b[k] ⊗ a[k]."""
        name = weight.attrs[0]
        if name == attribute(name):
            self.effect("grad_param_outer", (name,), (a, b), line)
        else:
            self.effect("grad_param_outer", (attribute(name),), (b, a), line)

    def turned(self, value):
        """`value` transposed: a parameter read the other way, a computed matrix turned."""
        op = self.case.ops[value]
        if op.kind == "param":
            return self.emit("param", (), (transposed(op.attrs[0]),), op.shape[::-1], op.line)
        return self.emit("transpose", (value,), (), op.shape[::-1], op.line)

    def inner(self, index, op, gradient):
        u, v, line = op.args[0], op.args[1], op.line
        self.add_cotangent(u, self.binary("mul", gradient, v, line), line)
        self.add_cotangent(v, self.binary("mul", gradient, u, line), line)

    def slice(self, index, op, gradient):
        start, stop = op.attrs
        whole = self.case.ops[op.args[0]].shape
        self.add_cotangent(op.args[0], self.emit("pad", (gradient,), (start, stop), whole,
                                                 op.line), op.line)

    def concat(self, index, op, gradient):
        start = 0
        for part in op.args:
            stop = start + self.case.ops[part].shape[0]
            self.add_cotangent(part, self.emit("slice", (gradient,), (start, stop),
                                               self.case.ops[part].shape, op.line), op.line)
            start = stop

    def nothing(self, index, op, gradient):
        """Constants and the count of children: nothing to send back."""


def _without_dead_ops(ops, forward):
    """`ops` without the adjoint ops (from `forward` on) that no effect reads, renumbered: the
    cotangent a constant or the count of children collects (`1 - z`'s `1`), which sends
    nothing back. The case's own ops all stay, at their numbers."""
    live = set(range(forward))
    for index in range(len(ops) - 1, forward - 1, -1):
        if index in live or ops[index].kind.startswith("grad_"):
            live.add(index)
            live.update(ops[index].args)
    number = {}
    kept = []
    for index, op in enumerate(ops):
        if index in live:
            number[index] = len(kept)
            kept.append(replace(op, args=tuple(number[a] for a in op.args)))
    return tuple(kept)


_RULES = {"param": _Adjoint.param, "gather": _Adjoint.gather, "field": _Adjoint.field,
          "child_state": _Adjoint.child_state, "child_sum": _Adjoint.child_sum,
          "child_max": _Adjoint.child_extreme, "child_min": _Adjoint.child_extreme,
          "unary": _Adjoint.unary, "binary": _Adjoint.binary_op, "matvec": _Adjoint.matvec,
          "matmul": _Adjoint.matmul, "inner": _Adjoint.inner, "slice": _Adjoint.slice,
          "concat": _Adjoint.concat, "const": _Adjoint.nothing, "fill": _Adjoint.nothing,
          "num_children": _Adjoint.nothing, "child_position": _Adjoint.nothing}
