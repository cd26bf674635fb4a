"""Levels of a forest for the level-batched peers. They use recjit's linearizer (about 15 µs for
10 SST trees), the cheapest preprocessing there is, so the comparison favours the peer."""
from recjit.linearize import linearize


def levels(forest):
    """(linearized, [(begin, end, children [end - begin, arity])] from the leaves up): level
    nodes are the new ids begin..end-1, children also in the new numbering."""
    linearized = linearize(forest, single_parent=forest.kind != "dag")
    begins = linearized.batch_begin
    result = []
    for batch in range(linearized.num_batches - 1, -1, -1):
        begin, end = int(begins[batch]), int(begins[batch + 1])
        ptr = linearized.child_ptr
        arity = int(ptr[begin + 1] - ptr[begin])
        children = linearized.child_idx[ptr[begin]:ptr[end]].reshape(end - begin, arity)
        result.append((begin, end, children))
    return linearized, result


def children_first(forest):
    """Every node once, children before parents: the eager peers' evaluation order."""
    return linearize(forest, single_parent=forest.kind != "dag").old_of_new[::-1].tolist()
