"""A sentiment classifier on the Stanford Sentiment Treebank: child-sum TreeLSTM (Tai et al.
2015; `--cell nary`: their binary N-ary TreeLSTM) as a recjit layer of a PyTorch model, a
softmax over the five labels at every node.

    python examples/train_sst.py [--data ../shared/data/sst] [--cell nary] [--backend torch]

It trains on train with a label at every node, keeps the epoch with the best fine-grained
root accuracy on dev, and reports fine-grained and binary root accuracy on test. Optimizer
and regularization follow Tai et al.: Adagrad (learning rate 0.05, 0.1 for the embeddings),
weight decay 1e-4 on all but the embeddings, dropout 0.5 on the hidden states before the
softmax, batches of 25 trees.
The word vectors are random and learned (no pretrained vectors can be downloaded here), as
the SST paper's RNTN learned its own. `--backend torch` trains the same model written in plain
PyTorch, a level of the forest at a time, as DGL's TreeLSTM runs. `--workers 2` trains with
DistributedDataParallel over gloo in two processes, each taking every other batch; started by
`torchrun` instead (docs/training.md), on one machine or several, it joins the group torchrun
sets up. Writes a JSON log and a PNG of loss and accuracy per epoch (`--record`)."""
import argparse
import itertools
import json
import os
import socket
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import recjit as rj
from common import SST, positive
from tree_lstm import child_sum_tree_lstm

LABELS = 5


@rj.recursive_model(arity=2)
def nary_tree_lstm(node, p):
    """The binary N-ary TreeLSTM: a weight for each child's side, a forget gate per child."""
    if node.is_leaf:
        i, o, u = rj.split(p.W_iou @ p.E[node.word] + p.b_iou, 3)
        c = rj.sigmoid(i) * rj.tanh(u)
        return rj.sigmoid(o) * rj.tanh(c), c
    h_left, c_left = nary_tree_lstm(node.left, p)
    h_right, c_right = nary_tree_lstm(node.right, p)
    i, o, u, f_left, f_right = rj.split(p.U_left @ h_left + p.U_right @ h_right + p.b_nary, 5)
    c = rj.sigmoid(i) * rj.tanh(u) + rj.sigmoid(f_left) * c_left + rj.sigmoid(f_right) * c_right
    return rj.sigmoid(o) * rj.tanh(c), c


CELLS = {"childsum": (child_sum_tree_lstm, ("E", "W_iou", "U_iou", "b_iou", "U_f", "b_f")),
         "nary": (nary_tree_lstm, ("E", "W_iou", "b_iou", "U_left", "U_right", "b_nary"))}


def read_trees(path, vocab):
    """Each tree of a PTB file as a forest of its own, word ids from `vocab` (extended)."""
    with open(path) as lines:
        return [rj.Forest.from_ptb([line], vocab=vocab) for line in lines if line.strip()]


def initial_parameters(vocab_size, embedding, hidden, seed, dtype="float32"):
    """Both cells' parameters in Tai et al.'s shapes; uniform weights of scale
    1/sqrt(fan-in), N(0, 0.1²) embeddings, forget gates' biases 1."""
    rng = np.random.default_rng(seed)

    def uniform(*shape):
        bound = 1 / np.sqrt(shape[-1])
        return rng.uniform(-bound, bound, size=shape)

    arrays = {"E": rng.normal(0, 0.1, size=(vocab_size, embedding)),
              "W_iou": uniform(3 * hidden, embedding), "U_iou": uniform(3 * hidden, hidden),
              "b_iou": np.zeros(3 * hidden), "U_f": uniform(hidden, hidden),
              "b_f": np.ones(hidden), "W_out": uniform(LABELS, hidden), "b_out": np.zeros(LABELS),
              "U_left": uniform(5 * hidden, hidden), "U_right": uniform(5 * hidden, hidden),
              "b_nary": np.concatenate([np.zeros(3 * hidden), np.ones(2 * hidden)])}
    return {name: value.astype(dtype) for name, value in arrays.items()}


class RecjitTreeLSTM(torch.nn.Module):
    """The cell compiled by recjit (`recjit.torch.apply`); its table `E` is an `nn.Embedding`'s
    weight, whose gradient is sparse, so that DistributedDataParallel knows it is."""

    def __init__(self, cell, initial):
        super().__init__()
        self.model, names = CELLS[cell]
        self.E = torch.nn.Embedding.from_pretrained(torch.tensor(initial["E"]), freeze=False,
                                                    sparse=True)
        self.weights = torch.nn.ParameterDict(
            {name: torch.nn.Parameter(torch.tensor(initial[name])) for name in names[1:]})

    def forward(self, forest):
        params = {"E": self.E.weight, **self.weights}
        return rj.torch.apply(self.model, forest, params, sparse=("E",)).nodes[0]


class LevelBatchedTreeLSTM(torch.nn.Module):
    """The same cell in plain PyTorch, every node of a height at once (DGL's way)."""

    def __init__(self, cell, initial):
        super().__init__()
        self.nary = cell == "nary"
        self.E = torch.nn.Embedding.from_pretrained(torch.tensor(initial["E"]),
                                                    freeze=False, sparse=True)
        for name in CELLS[cell][1][1:]:
            self.register_parameter(name, torch.nn.Parameter(torch.tensor(initial[name])))

    def internal(self, h, c, edges, parent, count):
        """(i, o, u gates' sum, what the forget gates keep) of a level of `count` internal
        nodes."""
        if self.nary:
            left, right = edges[0::2], edges[1::2]
            gates = h[left] @ self.U_left.T + h[right] @ self.U_right.T + self.b_nary
            i, o, u, f_left, f_right = gates.chunk(5, dim=1)
            kept = torch.sigmoid(f_left) * c[left] + torch.sigmoid(f_right) * c[right]
            return torch.cat([i, o, u], dim=1), kept
        h_sum = h.new_zeros(count, h.shape[1]).index_add(0, parent, h[edges])
        f = torch.sigmoid(h[edges] @ self.U_f.T + self.b_f)
        kept = c.new_zeros(count, c.shape[1]).index_add(0, parent, f * c[edges])
        return h_sum @ self.U_iou.T + self.b_iou, kept

    def forward(self, forest):
        """Every node's h, computed where the parameters are (`.to(device)`): the forest's
        arrays go there once."""
        linearized = child_sum_tree_lstm.linearize(forest)
        bias = self.b_iou
        h = bias.new_zeros(linearized.num_nodes, bias.shape[0] // 3)
        c = torch.zeros_like(h)
        ptr = linearized.child_ptr
        on_device = {name: torch.from_numpy(array).to(bias.device) for name, array in (
            ("children", linearized.child_idx), ("words", linearized.fields["word"]),
            ("counts", np.diff(ptr)), ("order", linearized.new_of_old))}
        begins = linearized.batch_begin
        for batch in range(linearized.num_batches - 1, -1, -1):  # from the leaves up
            begin, end = int(begins[batch]), int(begins[batch + 1])
            nodes = torch.arange(begin, end, device=bias.device)
            if begin >= linearized.leaf_begin:
                gates = self.E(on_device["words"][begin:end]) @ self.W_iou.T + bias
                forgotten = h.new_zeros(end - begin, h.shape[1])
            else:
                edges = on_device["children"][int(ptr[begin]):int(ptr[end])]
                parent = torch.repeat_interleave(nodes - begin, on_device["counts"][begin:end],
                                                 output_size=edges.shape[0])
                gates, forgotten = self.internal(h, c, edges, parent, end - begin)
            i, o, u = gates.chunk(3, dim=1)
            cell = torch.sigmoid(i) * torch.tanh(u) + forgotten
            c = c.index_copy(0, nodes, cell)
            h = h.index_copy(0, nodes, torch.sigmoid(o) * torch.tanh(cell))
        return h[on_device["order"]]


class Classifier(torch.nn.Module):
    """A TreeLSTM, dropout, and a softmax over the labels at every node."""

    def __init__(self, backend, initial, dropout, cell="childsum"):
        super().__init__()
        self.tree = (RecjitTreeLSTM if backend == "recjit" else LevelBatchedTreeLSTM)(cell,
                                                                                     initial)
        self.dropout = torch.nn.Dropout(dropout)
        self.out = torch.nn.Linear(initial["W_out"].shape[1], LABELS,
                                   dtype=torch.from_numpy(initial["W_out"]).dtype)
        with torch.no_grad():
            self.out.weight.copy_(torch.from_numpy(initial["W_out"]))
            self.out.bias.copy_(torch.from_numpy(initial["b_out"]))

    def forward(self, forest):
        return self.out(self.dropout(self.tree(forest)))


def optimizer(model, lr, embedding_lr, weight_decay):
    """Adagrad; the embeddings' gradients are sparse, and take no weight decay. The dense
    parameters take PyTorch's fused Adagrad on the CPU (one pass over each parameter, where
    the default runs eight tensor operations on it)."""
    sparse = [p for name, p in model.named_parameters() if name.endswith("E") or ".E." in name]
    dense = [p for p in model.parameters() if all(p is not s for s in sparse)]
    fused = all(p.device.type == "cpu" for p in dense) or None
    return torch.optim.Adagrad([{"params": dense, "weight_decay": weight_decay, "fused": fused},
                                {"params": sparse, "weight_decay": 0.0, "lr": embedding_lr}],
                               lr=lr)


def batches(trees, size, rng=None):
    order = np.arange(len(trees)) if rng is None else rng.permutation(len(trees))
    for start in range(0, len(trees), size):
        yield rj.Forest.concat([trees[i] for i in order[start:start + size]])


def batch_count(trees, size):
    """The batches of `size` trees an epoch takes from `trees`: whole batches (the shuffle
    changes which trees are left over), or one of them all where they are fewer than `size`."""
    return max(trees // size, 1)


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


def train(args, rank=0):
    """Train, select on dev, test; with `args.workers` > 1, as worker `rank` of a
    `DistributedDataParallel` group, each worker taking every `workers`-th batch (the first
    worker evaluates, logs and reports)."""
    torch.manual_seed(args.seed)
    vocab = {}
    train_trees = read_trees(os.path.join(args.data, "train.txt"), vocab)[:args.limit]
    dev_trees = read_trees(os.path.join(args.data, "dev.txt"), vocab)
    test_trees = read_trees(os.path.join(args.data, "test.txt"), vocab)
    initial = initial_parameters(len(vocab), args.embedding, args.hidden, args.seed)
    model = Classifier(args.backend, initial, args.dropout, args.cell)
    adagrad = optimizer(model, args.lr, args.embedding_lr, args.weight_decay)
    trained = model
    if args.workers > 1:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    rng = np.random.default_rng(args.seed)
    log, best, best_state = [], -1.0, None
    for epoch in range(1, args.epochs + 1):
        model.train()
        started, total, nodes = time.perf_counter(), 0.0, 0
        each = batch_count(len(train_trees), args.batch) // args.workers  # DDP steps together
        own = itertools.islice(batches(train_trees, args.batch, rng), rank,
                               each * args.workers, args.workers)
        progress = tqdm(own, desc=f"epoch {epoch}", disable=rank > 0, unit="batch", total=each)
        for forest in progress:
            loss = torch.nn.functional.cross_entropy(
                trained(forest), torch.from_numpy(forest.fields["label"]), reduction="sum")
            adagrad.zero_grad()
            (loss / forest.roots.size).backward()
            adagrad.step()
            total, nodes = total + loss.item(), nodes + forest.num_nodes
            progress.set_postfix(loss=f"{total / nodes:.3f}")
        seconds = time.perf_counter() - started
        if rank > 0:
            continue
        dev_fine, dev_binary = accuracy(model, dev_trees)
        log.append({"epoch": epoch, "loss_per_node": total / nodes, "seconds": seconds,
                    "dev_fine": dev_fine, "dev_binary": dev_binary})
        print(f"epoch {epoch}: loss {total / nodes:.4f} a node, {seconds:.2f} s; dev "
              f"fine-grained {dev_fine:.4f}, binary {dev_binary:.4f}")
        if dev_fine > best:
            best, best_state = dev_fine, {k: v.clone() for k, v in model.state_dict().items()}
    if rank > 0:
        return None
    model.load_state_dict(best_state)
    test_fine, test_binary = accuracy(model, test_trees)
    print(f"test (the epoch best on dev): fine-grained {test_fine:.4f}, binary {test_binary:.4f}")
    return {"arguments": vars(args), "epochs": log, "test_fine": test_fine,
            "test_binary": test_binary, "best_dev_fine": best}


def worker(rank, args, init_method, local_workers):
    """One process of a DistributedDataParallel group over gloo, `init_method` its rendezvous
    (`tcp://127.0.0.1:PORT` for `--workers`, `env://` under torchrun); the `local_workers` on
    this machine share its cores."""
    threads = max(1, (os.cpu_count() or 1) // local_workers)
    rj.set_num_threads(min(threads, rj.get_num_threads()))
    torch.set_num_threads(threads)
    torch.distributed.init_process_group("gloo", init_method=init_method, rank=rank,
                                         world_size=args.workers)
    try:
        record = train(args, rank)
        if record is not None:
            write(record, args.record)
    finally:
        torch.distributed.destroy_process_group()
    end_process()


def end_process():
    """End a DDP worker's process here, without the interpreter's teardown: after
    `destroy_process_group`, a process of torch 2.13's gloo aborts at exit ("terminate called
    without an active exception") in 7-50% of runs on this project's machine, even a
    two-line DDP program's, and the aborted worker fails the whole run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write(record, path):
    with open(path + ".json", "w") as handle:
        json.dump(record, handle, indent=1)
    plot(record, path + ".png")
    print(f"wrote {path}.json and {path}.png")


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


def fraction(text):
    """An argparse type: a number from 0 up to (not including) 1."""
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), not {value}")
    return value


def rate(text):
    """An argparse type: a finite number above 0 (a learning rate)."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {value}")
    return value


def penalty(text):
    """An argparse type: a finite number, 0 or above (a weight decay)."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number from 0 up, not {value}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data", default=SST, help="directory of train.txt, dev.txt, test.txt")
    parser.add_argument("--backend", default="recjit", choices=["recjit", "torch"],
                        help="the TreeLSTM as a recjit layer, or in plain PyTorch, level-batched")
    parser.add_argument("--cell", default="childsum", choices=sorted(CELLS),
                        help="child-sum TreeLSTM, or the binary N-ary TreeLSTM")
    parser.add_argument("--epochs", type=positive, default=10, help="passes over train")
    parser.add_argument("--batch", type=positive, default=25, help="trees a step")
    parser.add_argument("--embedding", type=positive, default=300, help="word vector size")
    parser.add_argument("--hidden", type=positive, default=150, help="TreeLSTM state size")
    parser.add_argument("--lr", type=rate, default=0.05, help="Adagrad's learning rate")
    parser.add_argument("--embedding-lr", type=rate, default=0.1,
                        help="Adagrad's learning rate for the word vectors")
    parser.add_argument("--weight-decay", type=penalty, default=1e-4,
                        help="on all parameters but the word vectors")
    parser.add_argument("--dropout", type=fraction, default=0.5,
                        help="on the hidden states before the softmax")
    parser.add_argument("--limit", type=positive, default=None,
                        help="train on the first N trees")
    parser.add_argument("--seed", type=int, default=0,
                        help="of the initial parameters, dropout and the batches' order")
    parser.add_argument("--workers", type=positive, default=1,
                        help="processes training with DistributedDataParallel (gloo)")
    parser.add_argument("--record", default="train_sst",
                        help="writes RECORD.json and RECORD.png (not --log, which torchrun takes)")
    args = parser.parse_args()
    missing = [name for name in ("train.txt", "dev.txt", "test.txt")
               if not os.path.isfile(os.path.join(args.data, name))]
    if missing:
        parser.error(f"--data {args.data}: no {', '.join(missing)} there (the Stanford "
                     "Sentiment Treebank's train.txt, dev.txt and test.txt, in PTB form)")
    if "WORLD_SIZE" in os.environ:  # started by torchrun, on this machine or on several
        args.workers = int(os.environ["WORLD_SIZE"])
    with open(os.path.join(args.data, "train.txt")) as lines:
        trees = sum(1 for line in lines if line.strip())
    trees = min(trees, args.limit or trees)
    if batch_count(trees, args.batch) < args.workers:
        parser.error(f"{trees} training trees in batches of {args.batch} make fewer batches "
                     f"than the {args.workers} workers, each of which takes a batch a step")
    if "WORLD_SIZE" in os.environ:
        worker(int(os.environ["RANK"]), args, "env://",
               int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    elif args.workers > 1:
        torch.multiprocessing.spawn(worker, nprocs=args.workers, args=(
            args, f"tcp://127.0.0.1:{free_port()}", args.workers))
    else:
        write(train(args), args.record)


if __name__ == "__main__":
    main()
