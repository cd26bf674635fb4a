"""Sums over a node's children (and maxima and minima), taken out of the element loop that
reads them: the CPU's own order of a child-sum model's loops.

The lowering writes a sum over children where its value is read, inside the element loop:
`for k: total = 0; for edge in node's edges: total += term(k)`. That suits the GPU, whose
threads are the elements. On the CPU the edge loop makes the element loop an outer loop, which
LLVM's vectorizer does not take, so every `sigmoid` and `tanh` of that element loop, the
children's terms included, ran one element at a time. Here each such sum goes first into a row
of its own, walked child by child with the element loop innermost:

    sums_v9 = np.empty(256); sums_v9[k] = 0 for every k
    for edge in node's edges: sums_v9[k] = sums_v9[k] + term(k) for every k
    for k: v9 = sums_v9[k]; ... the rest of the element loop ...

Each element adds the same terms in the same order as before. A maximum or minimum over the
children (`lower.REDUCTIONS`) goes into a row the same way (`maxima_v9`, `minima_v9`), from
its own start and by its own step. Inside a `prange`, numba hoists a fixed-size `np.empty` to
one allocation per thread. (The child-sum models gained a third of their time:
benchmarks/README.md, "Measurements behind the code".)

A child's own numbers (a score, `np.dot(p.a, h_k)`) go before the row's element loop, once a
child; and a dot loop, the inner product of a sum over children, takes its sum from a row the
same way."""
from dataclasses import dataclass, replace

from ..lowering.ilir import (
    Alloc,
    BinOp,
    Call,
    Const,
    If,
    Let,
    Load,
    Loop,
    LoopRole,
    Store,
    Var,
    add,
    nodes,
    substitute,
)


def plan_sums_first(kernel):
    """`kernel` with every loop that `sums_first` rewrites rewritten, inside loops and branches
    too (and the loops it writes, in turn): the CPU backend's pass before its emitter."""
    return replace(kernel, body=rewritten_loops(kernel.body, sums_first))


def rewritten_loops(body, rewrite):
    """`body` with each loop, inside loops and branches too, replaced by the statements
    `rewrite(loop)` gives (`(loop,)`: unchanged), and those in turn."""
    result = []
    for statement in body:
        if isinstance(statement, Loop):
            rewritten = rewrite(statement)
            if rewritten != (statement,):
                result += rewritten_loops(rewritten, rewrite)
            else:
                result.append(replace(statement, body=rewritten_loops(statement.body, rewrite)))
        elif isinstance(statement, If):
            result.append(replace(statement, body=rewritten_loops(statement.body, rewrite),
                                  orelse=rewritten_loops(statement.orelse, rewrite)))
        else:
            result.append(statement)
    return tuple(result)


def sums_first(loop):
    """The statements that replace element loop `loop`, or a dot loop (a sequential loop over
    a contraction index, as an inner product's with a sum over children): the row of each sum
    over children, then the loop reading them. Where a sum's terms read values the loop
    computes (a gate of the node's own), the row's loop computes them again, once a child.
    Unchanged (`(loop,)`) when the loop holds no such sum."""
    sequential = loop.element or not (loop.parallel or loop.one_worker)
    if not (sequential and not loop.columns and isinstance(loop.start, Const)
            and isinstance(loop.stop, Const)
            and all(isinstance(statement, (Let, Loop, Store)) for statement in loop.body)):
        return (loop,)
    position = add(Var(loop.var), -loop.start.value)
    size = Const(loop.stop.value - loop.start.value)
    stored = {store.array for store in nodes(loop.body, Store)}
    rebound = {let.name for inner in loop.body if isinstance(inner, Loop)
               for let in nodes(inner.body, Let)}
    first, body, lets, summed, copied = [], [], {}, set(), set()
    for index, statement in enumerate(loop.body):
        reduction = reduction_started_before(loop.body, index)
        if reduction is None:
            recomputed = None
        else:
            terms = statement.body[:-1]
            recomputed = _recomputed((*terms, reduction.term), lets, rebound - summed, stored)
        if recomputed is not None:
            total, row = reduction.total, Load(reduction.row, (position,))
            summed.add(total)
            copied.update(let.name for let in recomputed)
            once, each = once_a_child(tuple(terms[1:]), loop.var, recomputed)
            first += [Alloc(row.array, (size,)),
                      _element_loop(loop, (Store(row.array, row.index, reduction.start),)),
                      Loop(statement.var, statement.start, statement.stop, (
                          terms[0], *once, _element_loop(loop, recomputed + each + (Store(
                              row.array, row.index, reduction.step_from(row)),))),
                           statement.role)]
            body[-1] = lets[total] = Let(total, row)
            continue
        body.append(statement)
        if isinstance(statement, Let):
            lets[statement.name] = statement
    if not first:
        return (loop,)
    read = {var.name for var in nodes(tuple(body), Var)}
    body = [s for s in body if not (isinstance(s, Let) and s.name in copied and s.name not in read)]
    return tuple(first) + (replace(loop, body=tuple(body)),)


def once_a_child(statements, element, recomputed):
    """(statements that read no element, in order; the rest): a child's own number, as an
    inner product with its state, goes before the element loop, computed once a child, not
    once an element. A statement stays in the loop where it reads the element or a name the
    loop's statements bind (`recomputed` too), binds a name they bind or one that one of them
    before it reads, loads an array they store, or stores one they load or store; a row it
    alone stores and reads (a sum over the children inside a child's term) goes with it."""
    reads = [{var.name for var in nodes(statement, Var)} for statement in statements]
    inside = set()
    while True:
        bound_inside = {let.name for let in recomputed}
        bound_inside |= {let.name for i in inside for let in nodes(statements[i], Let)}
        bound_inside |= {loop.var for i in inside for loop in nodes(statements[i], Loop)}
        stored_inside = {store.array for i in inside for store in nodes(statements[i], Store)}
        used_inside = stored_inside | {load.array for i in inside
                                       for load in nodes(statements[i], Load)}
        more = {i for i, statement in enumerate(statements) if i not in inside and (
            isinstance(statement, Store)
            or reads[i] & (bound_inside | {element})
            or any(let.name in bound_inside or any(let.name in reads[j] for j in inside if j < i)
                   for let in nodes(statement, Let))
            or any(load.array in stored_inside for load in nodes(statement, Load))
            or any(store.array in used_inside for store in nodes(statement, Store)))}
        if not more:
            break
        inside |= more
    return (tuple(s for i, s in enumerate(statements) if i not in inside),
            tuple(s for i, s in enumerate(statements) if i in inside))


def _recomputed(terms, lets, rebound, stored):
    """The element loop's `lets` that a sum's `terms` read, with those they read, in order: what
    its row's loop computes again. None where one cannot be: a value accumulated in a loop of
    its own, or one that reads an array the element loop writes."""
    needed, pending = set(), [terms]
    while pending:
        for var in nodes(pending.pop(), Var):
            if var.name in lets and (var.name in rebound
                                     or Var(var.name) in nodes(lets[var.name].value, Var)):
                return None  # accumulated in a loop of its own, or across the loop's steps
            if var.name in lets and var.name not in needed:
                needed.add(var.name)
                pending.append(lets[var.name].value)
    recomputed = tuple(let for name, let in lets.items() if name in needed)
    if any(load.array in stored for load in nodes(recomputed, Load)):
        return None
    return recomputed


@dataclass(frozen=True)
class ChildReduction:
    """A reduction over the node's children as the lowering writes it (`lower.REDUCTIONS`):
    `total = start` just before a loop over the edges whose last statement is `total =
    step`, the step reading the running value once and the child's `term`."""

    total: str
    start: Const
    step: object
    term: object

    @property
    def row(self):
        """The name of the row it goes into, element by element."""
        kind = self.step.operator if isinstance(self.step, BinOp) else self.step.function
        return {"+": "sums", "maximum": "maxima", "minimum": "minima"}[kind] + f"_{self.total}"

    def step_from(self, running):
        """The step with the running value read from `running`."""
        return substitute(self.step, {Var(self.total): running})


def reduction_started_before(statements, index):
    """The `ChildReduction` that `statements[index]` computes over the node's children: a
    loop that the lowering marks as reducing them (`Loop.reduces`), its running value bound
    to the start just before; else None."""
    loop = statements[index]
    if not (isinstance(loop, Loop) and loop.reduces is not None and index > 0):
        return None
    start, accumulate = statements[index - 1], loop.body[-1]
    if not (isinstance(start, Let) and start.name == loop.reduces
            and isinstance(start.value, Const)):
        return None
    total = Var(loop.reduces)
    term = _term_of(accumulate.value, total)
    if term is None or total in nodes(term, Var):
        return None
    return ChildReduction(loop.reduces, start.value, accumulate.value, term)


def _term_of(step, total):
    """The child's term in a reduction's step (`total + term`, `maximum(total, term)`,
    `maximum(term, total)`, and so for `minimum`), else None."""
    if isinstance(step, BinOp) and step.operator == "+" and step.left == total:
        return step.right
    if isinstance(step, Call) and step.function in ("maximum", "minimum") \
            and len(step.args) == 2 and total in step.args:
        return step.args[1] if step.args[0] == total else step.args[0]
    return None


def _element_loop(loop, body):
    return Loop(loop.var, loop.start, loop.stop, body, LoopRole.ELEMENTS)
