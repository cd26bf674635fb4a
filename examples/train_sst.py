"""A sentiment classifier on the Stanford Sentiment Treebank: child-sum TreeLSTM (Tai et al.
2015) as a recjit layer of a PyTorch model, a softmax over the five labels at every node.

    python examples/train_sst.py [--data ../shared/data/sst] [--epochs 10] [--backend torch]

It trains on train with a label at every node, keeps the epoch with the best fine-grained
root accuracy on dev, and reports fine-grained and binary root accuracy on test. Optimizer
and regularization follow Tai et al.: Adagrad (learning rate 0.05, 0.1 for the embeddings),
weight decay 1e-4 on all but the embeddings, dropout 0.5 on the hidden states before the softmax, batches of 25 trees.
The word vectors are random and learned (no pretrained vectors can be downloaded here), as
the SST paper's RNTN learned its own. `--backend torch` trains the same model written in plain
PyTorch, a level of the forest at a time, as DGL's TreeLSTM runs. Writes a JSON log and a PNG
of loss and accuracy per epoch (`--log`)."""
import argparse
import json
import os
import time

import numpy as np
import torch
from tqdm import tqdm

import recjit as rj
from tree_lstm import child_sum_tree_lstm

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sst")
LABELS = 5


def read_trees(path, vocab):
    """Each tree of a PTB file as a forest of its own, word ids from `vocab` (extended)."""
    with open(path) as lines:
        return [rj.Forest.from_ptb([line], vocab=vocab) for line in lines if line.strip()]


def initial_parameters(vocab_size, embedding, hidden, seed, dtype="float32"):
    """Tai et al.'s shapes; uniform weights of scale 1/sqrt(fan-in), N(0, 0.1²) embeddings."""
    rng = np.random.default_rng(seed)

    def uniform(*shape):
        bound = 1 / np.sqrt(shape[-1])
        return rng.uniform(-bound, bound, size=shape)

    arrays = {"E": rng.normal(0, 0.1, size=(vocab_size, embedding)),
              "W_iou": uniform(3 * hidden, embedding), "U_iou": uniform(3 * hidden, hidden),
              "b_iou": np.zeros(3 * hidden), "U_f": uniform(hidden, hidden),
              "b_f": np.ones(hidden), "W_out": uniform(LABELS, hidden), "b_out": np.zeros(LABELS)}
    return {name: value.astype(dtype) for name, value in arrays.items()}


class RecjitTreeLSTM(torch.nn.Module):
    """The cell compiled by recjit: a `recjit.torch.Module` of its parameters."""

    def __init__(self, initial):
        super().__init__()
        self.cell = rj.torch.Module(child_sum_tree_lstm, sparse=("E",),
                                    **{k: v for k, v in initial.items() if k in CELL_PARAMETERS})

    def forward(self, forest):
        return self.cell(forest).nodes[0]  # h of every node, in the forest's order


CELL_PARAMETERS = ("E", "W_iou", "U_iou", "b_iou", "U_f", "b_f")


class LevelBatchedTreeLSTM(torch.nn.Module):
    """The same cell in plain PyTorch, every node of a height at once (DGL's way)."""

    def __init__(self, initial):
        super().__init__()
        self.E = torch.nn.Embedding.from_pretrained(torch.tensor(initial["E"]),
                                                    freeze=False, sparse=True)
        for name in CELL_PARAMETERS[1:]:
            self.register_parameter(name, torch.nn.Parameter(torch.tensor(initial[name])))

    def forward(self, forest):
        linearized = child_sum_tree_lstm.linearize(forest)
        n, hidden, dtype = linearized.num_nodes, self.b_f.shape[0], self.b_f.dtype
        h = torch.zeros(n, hidden, dtype=dtype)
        c = torch.zeros(n, hidden, dtype=dtype)
        ptr = torch.from_numpy(linearized.child_ptr)
        children = torch.from_numpy(linearized.child_idx)
        words = torch.from_numpy(linearized.fields["word"])
        begins = linearized.batch_begin
        for batch in range(linearized.num_batches - 1, -1, -1):  # from the leaves up
            begin, end = int(begins[batch]), int(begins[batch + 1])
            gates = self.b_iou.expand(end - begin, -1)
            forgotten = torch.zeros(end - begin, hidden, dtype=dtype)
            if begin >= linearized.leaf_begin:
                gates = gates + self.E(words[begin:end]) @ self.W_iou.T
            else:
                edges = children[ptr[begin]:ptr[end]]
                parent = torch.repeat_interleave(torch.arange(end - begin),
                                                 ptr[begin + 1:end + 1] - ptr[begin:end])
                h_sum = torch.zeros(end - begin, hidden, dtype=dtype).index_add(0, parent,
                                                                                h[edges])
                gates = gates + h_sum @ self.U_iou.T
                f = torch.sigmoid(h[edges] @ self.U_f.T + self.b_f)
                forgotten = forgotten.index_add(0, parent, f * c[edges])
            i, o, u = gates.chunk(3, dim=1)
            cell = torch.sigmoid(i) * torch.tanh(u) + forgotten
            c = c.index_copy(0, torch.arange(begin, end), cell)
            h = h.index_copy(0, torch.arange(begin, end), torch.sigmoid(o) * torch.tanh(cell))
        return h[torch.from_numpy(linearized.new_of_old)]


class Classifier(torch.nn.Module):
    """A TreeLSTM, dropout, and a softmax over the labels at every node."""

    def __init__(self, backend, initial, dropout):
        super().__init__()
        self.tree = (RecjitTreeLSTM if backend == "recjit" else LevelBatchedTreeLSTM)(initial)
        self.dropout = torch.nn.Dropout(dropout)
        self.out = torch.nn.Linear(initial["W_out"].shape[1], LABELS,
                                   dtype=torch.from_numpy(initial["W_out"]).dtype)
        with torch.no_grad():
            self.out.weight.copy_(torch.from_numpy(initial["W_out"]))
            self.out.bias.copy_(torch.from_numpy(initial["b_out"]))

    def forward(self, forest):
        return self.out(self.dropout(self.tree(forest)))


def optimizer(model, lr, embedding_lr, weight_decay):
    """Adagrad; the embeddings' gradients are sparse, and take no weight decay."""
    sparse = [p for name, p in model.named_parameters() if name.endswith("E") or ".E." in name]
    dense = [p for p in model.parameters() if all(p is not s for s in sparse)]
    return torch.optim.Adagrad([{"params": dense, "weight_decay": weight_decay},
                                {"params": sparse, "weight_decay": 0.0, "lr": embedding_lr}],
                               lr=lr)


def batches(trees, size, rng=None):
    order = np.arange(len(trees)) if rng is None else rng.permutation(len(trees))
    for start in range(0, len(trees), size):
        yield rj.Forest.concat([trees[i] for i in order[start:start + size]])


def accuracy(model, trees, size=100):
    """(fine-grained, binary) root accuracy: binary over the roots not labelled neutral."""
    model.eval()
    right = binary_right = binary_count = 0
    with torch.no_grad():
        for forest in batches(trees, size):
            roots = torch.from_numpy(forest.roots)
            scores = model(forest)[roots]
            labels = torch.from_numpy(forest.fields["label"])[roots]
            right += int((scores.argmax(1) == labels).sum())
            polar = labels != 2
            negative = scores[:, :2].logsumexp(1) > scores[:, 3:].logsumexp(1)
            binary_right += int(((labels < 2) == negative)[polar].sum())
            binary_count += int(polar.sum())
    return right / len(trees), binary_right / max(binary_count, 1)


def train(args):
    torch.manual_seed(args.seed)
    vocab = {}
    train_trees = read_trees(os.path.join(args.data, "train.txt"), vocab)[:args.limit]
    dev_trees = read_trees(os.path.join(args.data, "dev.txt"), vocab)
    test_trees = read_trees(os.path.join(args.data, "test.txt"), vocab)
    initial = initial_parameters(len(vocab), args.embedding, args.hidden, args.seed)
    model = Classifier(args.backend, initial, args.dropout)
    adagrad = optimizer(model, args.lr, args.embedding_lr, args.weight_decay)
    rng = np.random.default_rng(args.seed)
    log, best, best_state = [], -1.0, None
    for epoch in range(1, args.epochs + 1):
        model.train()
        started, total, nodes = time.perf_counter(), 0.0, 0
        progress = tqdm(batches(train_trees, args.batch, rng), desc=f"epoch {epoch}",
                        total=-(-len(train_trees) // args.batch), unit="batch")
        for forest in progress:
            loss = torch.nn.functional.cross_entropy(
                model(forest), torch.from_numpy(forest.fields["label"]), reduction="sum")
            adagrad.zero_grad()
            (loss / forest.roots.size).backward()
            adagrad.step()
            total, nodes = total + loss.item(), nodes + forest.num_nodes
            progress.set_postfix(loss=f"{total / nodes:.3f}")
        seconds = time.perf_counter() - started
        dev_fine, dev_binary = accuracy(model, dev_trees)
        log.append({"epoch": epoch, "loss_per_node": total / nodes, "seconds": seconds,
                    "dev_fine": dev_fine, "dev_binary": dev_binary})
        print(f"epoch {epoch}: loss {total / nodes:.4f} a node, {seconds:.1f} s; dev "
              f"fine-grained {dev_fine:.4f}, binary {dev_binary:.4f}")
        if dev_fine > best:
            best, best_state = dev_fine, {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    test_fine, test_binary = accuracy(model, test_trees)
    print(f"test (the epoch best on dev): fine-grained {test_fine:.4f}, binary {test_binary:.4f}")
    return {"arguments": vars(args), "epochs": log, "test_fine": test_fine,
            "test_binary": test_binary, "best_dev_fine": best}


def plot(record, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    epochs = [entry["epoch"] for entry in record["epochs"]]
    figure, (losses, accuracies) = plt.subplots(1, 2, figsize=(10, 4))
    losses.plot(epochs, [entry["loss_per_node"] for entry in record["epochs"]], marker="o")
    losses.set(xlabel="epoch", ylabel="training loss a node")
    for key, name in (("dev_fine", "dev fine-grained"), ("dev_binary", "dev binary")):
        accuracies.plot(epochs, [entry[key] for entry in record["epochs"]], marker="o",
                        label=name)
    accuracies.set(xlabel="epoch", ylabel="root accuracy")
    accuracies.legend()
    figure.tight_layout()
    figure.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=DATA, help="directory of train.txt, dev.txt, test.txt")
    parser.add_argument("--backend", default="recjit", choices=["recjit", "torch"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--embedding", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=150)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--embedding-lr", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--limit", type=int, default=None, help="train on the first N trees")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default="train_sst", help="writes LOG.json and LOG.png")
    args = parser.parse_args()
    record = train(args)
    with open(args.log + ".json", "w") as handle:
        json.dump(record, handle, indent=1)
    plot(record, args.log + ".png")
    print(f"wrote {args.log}.json and {args.log}.png")


if __name__ == "__main__":
    main()
