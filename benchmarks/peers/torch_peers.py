"""PyTorch (CPU) peers: eager recursion, one op per node as a user writes it, and level-batched
(one batched op per level, the DGL style)."""
import numpy as np
import torch

from .levels import children_first, levels


def tensors(params):
    return {name: torch.from_numpy(np.ascontiguousarray(getattr(params, name)))
            for name in params.names()}


def tree_lstm_eager(forest, params):
    p = tensors(params)
    words = forest.fields["word"]
    order = children_first(forest)

    def cell(node, memo):
        children = forest.children(node)
        if children.size == 0:
            i, o, u = torch.chunk(p["W_iou"] @ p["E"][words[node]] + p["b_iou"], 3)
            c = torch.sigmoid(i) * torch.tanh(u)
            return torch.sigmoid(o) * torch.tanh(c), c
        (hl, cl), (hr, cr) = memo[children[0]], memo[children[1]]
        i, o, u = torch.chunk(p["U_iou"] @ (hl + hr) + p["b_iou"], 3)
        fl = torch.sigmoid(p["U_f"] @ hl + p["b_f"])
        fr = torch.sigmoid(p["U_f"] @ hr + p["b_f"])
        c = torch.sigmoid(i) * torch.tanh(u) + fl * cl + fr * cr
        return torch.sigmoid(o) * torch.tanh(c), c

    def run():
        with torch.no_grad():
            memo = {}
            for node in order:
                memo[node] = cell(node, memo)
            return torch.stack([memo[int(r)][0] for r in forest.roots]).numpy()
    return run


def tree_lstm_levels(forest, params):
    p = tensors(params)

    def run():
        with torch.no_grad():
            linearized, level_list = levels(forest)
            hidden = p["b_f"].shape[0]
            h = torch.empty((linearized.num_nodes, hidden), dtype=p["b_f"].dtype)
            c = torch.empty_like(h)
            words = torch.from_numpy(linearized.fields["word"])
            for begin, end, children in level_list:
                if children.shape[1] == 0:
                    gates = p["E"][words[begin:end]] @ p["W_iou"].T + p["b_iou"]
                    i, o, u = torch.chunk(gates, 3, dim=1)
                    c[begin:end] = torch.sigmoid(i) * torch.tanh(u)
                else:
                    kids = torch.from_numpy(children)
                    hl, hr = h[kids[:, 0]], h[kids[:, 1]]
                    gates = (hl + hr) @ p["U_iou"].T + p["b_iou"]
                    i, o, u = torch.chunk(gates, 3, dim=1)
                    forget = torch.sigmoid(torch.cat([hl, hr]) @ p["U_f"].T + p["b_f"])
                    count = end - begin
                    c[begin:end] = (torch.sigmoid(i) * torch.tanh(u)
                                    + forget[:count] * c[kids[:, 0]]
                                    + forget[count:] * c[kids[:, 1]])
                h[begin:end] = torch.sigmoid(o) * torch.tanh(c[begin:end])
            return h[torch.from_numpy(linearized.roots)].numpy()
    return run


EAGER = {"tree_lstm": tree_lstm_eager}
LEVELS = {"tree_lstm": tree_lstm_levels}
