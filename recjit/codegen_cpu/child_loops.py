"""A node's per-child work, taken out of the element loop it sits in: the CPU backward's own
order of its loops.

The backward's lowering writes what a node sends each child inside the loop over the node's
elements, as the forward writes a sum over children (`child_sums.py`):

    for k: v34 = ...; total = 0; for edge in node's edges: total += term(v34, child, k)
           ...; for edge in node's edges: cot_1[child, k] += v34 * ...

That suits the GPU, whose threads are the elements. On the CPU the edge loops make the element
loop an outer loop, which LLVM's vectorizer does not take, and each edge loop computes a
child's gate again. Here the element loop is split in three: first the node's own values, each
one that an edge loop reads stored in a row of its own (`vals_v34`); then the edge loops as
one, walked child by child with the element loop innermost, a value that several of them
computed (a child's gate) computed once (`_each_value_once`), and a child's own numbers (its
score, an inner product with its state; a sum over the children that its term reads, in a
row of its own) once a child, before the element loop; then, in a loop of their own, the
node's values that read a sum over the children, which the edge loop summed into rows
(`sums_total`):

    for k: v34 = ...; vals_v34[k] = v34; ...
    sums_total[k] = 0 for every k
    for edge in node's edges:
        for k: v34 = vals_v34[k]; sums_total[k] += term(v34, child, k); cot_1[child, k] += ...
    for k: total = sums_total[k]; ... what reads it ...

Each element and each child computes the same values in the same order as before. The loop is
split only where that order cannot change what is read: an array written in one part is read
in no other, except a child's row that the node's part reads at the node's own row (a tree's
node is not its own child). (benchmarks/README.md: TreeLSTM's backward kernel, 3.8 → 3.1 ms
at 25 SST trees.)"""
from dataclasses import replace

from ..lowering.ilir import (Alloc, Const, Let, Load, Loop, LoopRole, Store, Var, add,
                            nodes, substitute)
from .child_sums import once_a_child, reduction_started_before, rewritten_loops


def plan_children_after(kernel):
    """`kernel` with every element loop that `children_after` splits split, inside loops and
    branches too: a CPU backward's pass before its emitter."""
    return replace(kernel, body=rewritten_loops(kernel.body, children_after))


def children_after(loop):
    """The statements that replace element loop `loop`: its node's part, its edge loops as one
    with the element loop innermost, and the part that reads their sums; `(loop,)` where it
    holds no edge loop, or where splitting it could change what it reads."""
    if not (loop.element and not loop.columns and isinstance(loop.start, Const)
            and isinstance(loop.stop, Const)
            and all(isinstance(statement, (Let, Loop, Store)) for statement in loop.body)):
        return (loop,)
    body = loop.body
    edges = [index for index, statement in enumerate(body) if _is_edge_loop(statement)]
    if not edges or any(isinstance(statement, Loop) and index not in edges
                        for index, statement in enumerate(body)):
        return (loop,)
    reductions = {}  # the sums (maxima, minima) over children: {name: `ChildReduction`}
    totals = {}  # {name: the index of the edge loop that computes it}
    for index in edges:
        reduction = reduction_started_before(body, index)
        if reduction is not None:
            reductions[reduction.total] = reduction
            totals[reduction.total] = index
    starts = {index - 1 for index in totals.values()}
    own, after, reading = [], [], set(totals)
    for index, statement in enumerate(body):
        if index in edges or index in starts:
            continue
        if any(var.name in reading for var in nodes(statement, Var)):
            after.append(statement)
            if isinstance(statement, Let):
                reading.add(statement.name)
        else:
            own.append(statement)
    edge_loops = [body[index] for index in edges]
    if any((edge_loop.start, edge_loop.stop) != (edge_loops[0].start, edge_loops[0].stop)
           for edge_loop in edge_loops) or not _order_free(own, edge_loops, after):
        return (loop,)
    names = [{bound.name for bound in nodes(body[index].body[1:], (Let, Alloc))}
             for index in edges]
    if sum(map(len, names)) != len(set().union(*names)):
        return (loop,)  # the edge loops become one: each binds names of its own
    bound_own = {statement.name for statement in own if isinstance(statement, Let)}
    bound_edges = {let.name for edge_loop in edge_loops for let in nodes(edge_loop.body, Let)}
    own_total = {index: total for total, index in totals.items()}
    if bound_own & (bound_edges - set(totals)) or any(
            {var.name for var in nodes(body[index], Var)} & (reading - {own_total.get(index)})
            for index in edges):
        return (loop,)  # a name bound twice, or an edge loop reading what comes after it
    read_later = {var.name for part in (edge_loops, after) for var in nodes(tuple(part), Var)}
    kept = [statement.name for statement in own
            if isinstance(statement, Let) and statement.name in read_later]
    position = add(Var(loop.var), -loop.start.value)
    size = (Const(loop.stop.value - loop.start.value),)

    def element_loop(statements):
        return Loop(loop.var, loop.start, loop.stop, tuple(statements), LoopRole.ELEMENTS)

    def restored(statements):
        names = {var.name for var in nodes(tuple(statements), Var)}
        return [Let(name, Load(f"vals_{name}", (position,))) for name in kept if name in names]

    split = [Alloc(f"vals_{name}", size) for name in kept]
    if own:
        split.append(element_loop(own + [Store(f"vals_{name}", (position,), Var(name))
                                         for name in kept]))
    rows = {total: Load(reduction.row, (position,)) for total, reduction in reductions.items()}
    for total, row in rows.items():
        split += [Alloc(row.array, size),
                  element_loop([Store(row.array, row.index, reductions[total].start)])]
    each_child = []  # the edge loops' bodies, one after another, in one edge loop
    for index in edges:
        inner = list(body[index].body[1:])  # after naming the child
        if index in own_total:
            total = own_total[index]
            inner[-1] = Store(rows[total].array, rows[total].index,
                              reductions[total].step_from(rows[total]))
        each_child += inner
    first = body[edges[0]]
    once, each = once_a_child(tuple(_each_value_once(restored(each_child) + each_child)),
                              loop.var, ())
    split.append(replace(first, body=(first.body[0], *once, element_loop(each)), reduces=None))
    if after:
        split.append(element_loop(restored(after)
                                  + [Let(total, row) for total, row in rows.items()]
                                  + after))
    return tuple(split)


def _each_value_once(statements):
    """`statements`, a merged edge loop's element loop, with a value that several of the
    edge loops computed computed once: a `Let` whose expression an earlier `Let` has is
    dropped, and its name read as the earlier one's. Each edge loop had computed a child's
    gate for itself; LLVM merged them, but the printed kernel showed it four times. Only an
    expression that loads no array the statements store is the same wherever it stands; and
    where a name is bound twice (an inner product's sum, in its loop), nothing is merged."""
    bound = [let.name for let in nodes(tuple(statements), Let)]
    if len(bound) != len(set(bound)):
        return statements
    stored = {store.array for store in nodes(tuple(statements), Store)}
    first_named, renamed, kept = {}, {}, []
    for statement in statements:
        statement = substitute(statement, renamed)
        if isinstance(statement, Let) and not any(load.array in stored
                                                  for load in nodes(statement.value, Load)):
            earlier = first_named.setdefault(statement.value, statement.name)
            if earlier != statement.name:
                renamed[Var(statement.name)] = Var(earlier)
                continue
        kept.append(statement)
    return kept


def _is_edge_loop(statement):
    """A loop over the node's edges whose body begins by naming the edge's child, and whose
    inner loops store only into rows it allocates itself: a child's inner products (a score,
    `np.dot(p.a, h_k)`), a sum over the children inside a child's term."""
    if not (isinstance(statement, Loop) and statement.role is LoopRole.EDGES
            and statement.var == "edge" and statement.body
            and statement.body[0] == Let("child", Load("child_idx", (Var("edge"),)))):
        return False
    own_rows = {alloc.name for alloc in statement.body if isinstance(alloc, Alloc)}
    return all(store.array in own_rows for inner in statement.body if isinstance(inner, Loop)
               for store in nodes(inner, Store))


def _order_free(own, edge_loops, after):
    """Whether running `own` for every element, then each edge loop, then `after` reads what
    the loop read when it ran them element by element: an array stored in one part is loaded
    in no other part, and in its own part only where it is stored (an edge loop adding to a
    child's row), and no array is stored in two parts, except that the node's own part may
    read at the node's row an array that an edge loop stores at the child's."""
    parts = [tuple(own)] + [(edge_loop,) for edge_loop in edge_loops] + [tuple(after)]
    stored = [{store.array for store in nodes(part, Store)} for part in parts]
    if any(stored[one] & stored[other] for one in range(len(parts))
           for other in range(one + 1, len(parts))):
        return False  # stores to one array from two parts would change places
    for number, part in enumerate(parts):
        for store in nodes(part, Store):
            for other, reader in enumerate(parts):
                for load in nodes(reader, Load):
                    if load.array != store.array:
                        continue
                    if other == number and load.index == store.index:
                        continue
                    node_row = (other == 0 and 0 < number <= len(edge_loops)
                                and load.index[:1] == (Var("node"),)
                                and store.index[:1] == (Var("child"),))
                    if not node_row:
                        return False
    return True
