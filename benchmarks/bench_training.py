"""The training benchmark (docs/training.md): a training step of child-sum TreeLSTM on SST, in
recjit and in the frameworks a user would train it with, in one process, from the same initial
parameters, each checked to give the same first loss.

    python benchmarks/bench_training.py [--data ../shared/data/sst] [--quick] [--machine NAME]
                                        [--vpps (VPPS's setting only)] [--cuda (the GPU too)]

A step: the forward pass over a batch of 25 SST train trees (embeddings X=300, hidden H=150,
float32), a softmax over the 5 labels at every node's h and its summed cross-entropy, the
backward pass, and an Adagrad update. Contestants:

- recjit: `model.vjp`, the loss and its gradient with NumPy, the pullback, Adagrad (a gathered
  table's rows only) as one numba loop a parameter;
- recjit in PyTorch: `examples/train_sst.py`'s classifier (a `recjit.torch.Module`), PyTorch's
  loss and Adagrad;
- PyTorch level-batched: the same classifier with the cell in plain PyTorch, a level at a
  time, as DGL runs it (sparse embedding, Adagrad);
- PyTorch per tree: the cell applied node by node, the recursion as a user writes it;
- DyNet autobatch: one graph for the batch, `dy.AdagradTrainer`.

Also: the pullback against the forward run (TreeLSTM h256, 10 trees, Cortex's inference
setting; and every model of the inference benchmark's zoo at its smaller size, 10 trees,
grids or sequences, and attention over the children), the pullback's rate at h512 against
the matmul roof, VPPS's setting (X=H=256, batches of 1, 10 and 25), per-tree gradients
against one batch gradient and against a PyTorch loop of per-tree backward passes, the
jacobian of each root's h with respect to the leaves' embeddings against a loop of
pullbacks, the memory the backward keeps, an epoch of SST train for the four contestants
that take a batch (342 batches; `--quick`: 1,000 trees), and an epoch of
`examples/train_sst.py` in one process against two DistributedDataParallel processes; then
each speed target as the rate it asks of this machine (`target_rates`).
Writes benchmarks/results/training-<machine>.json and .md. This is a benchmark, never a
test: nothing here asserts a timing.

NumPy's BLAS gets one thread (`OPENBLAS_NUM_THREADS=1`, unless set): the recjit step's loss
gradient is two small NumPy products, after which OpenBLAS's threads spin on the cores
recjit's kernels need (docs/training.md: 59 ms a step instead of 13 on 2 cores)."""
import argparse
import importlib
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads OpenBLAS

import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

import recjit as rj  # noqa: E402
from recjit.lowering.arguments import leaf_groups  # noqa: E402
from recjit.lowering.backward import row_counts  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "examples"), HERE]

from bench import (ZOO, Benchmark, _gpu_line, batches as zoo_forests, cpu_facts,  # noqa: E402
                   flops, gpu_facts, write_results)
from peers.cells import tree_lstm as peer_tree_lstm  # noqa: E402
from peers.torch_peers import TorchOps  # noqa: E402
from train_sst import CELLS, Classifier, initial_parameters, optimizer  # noqa: E402
from tree_lstm import child_sum_tree_lstm  # noqa: E402

DATA = os.path.join(HERE, "..", "..", "shared", "data", "sst")
LR, EMBEDDING_LR, EPSILON = 0.05, 0.1, 1e-10  # Adagrad as train_sst.py sets it (no decay)
CELL_PARAMETERS = CELLS["childsum"][1]
RUN_H256 = "pullback against run (TreeLSTM h256, 10 trees)"
BACKWARD_H512 = "the backward against the matmul roof (TreeLSTM h512, 10 trees; ≥ 50% asked)"
ZOO_PULLBACKS = "zoo pullbacks"
# Every model of examples/ trains: the inference benchmark's zoo, and attention over the
# children, which Cortex's tables do not have.
TRAINED_ZOO = [*ZOO, Benchmark("tree_attention", "sst", (256,))]
TARGET_RATES = "what the targets ask"


def median_ms(step, batches, rounds):
    """Median ms of a step over the batches, `rounds` times, after one warm-up step."""
    step(batches[0])
    times = []
    for _ in range(rounds):
        for forest in batches:
            started = time.perf_counter()
            step(forest)
            times.append(time.perf_counter() - started)
    return 1e3 * float(np.median(times))


# recjit, with NumPy around it ------------------------------------------------------------
class RecjitStep:
    """One training step: vjp (on `backend`, under `schedule`: None, the model's), the loss
    and its gradient with NumPy, the pullback, Adagrad (`adagrad_elements`, `adagrad_rows`)."""

    def __init__(self, initial, backend="cpu", schedule=None):
        self.backend, self.schedule = backend, schedule
        self.params = {name: initial[name].copy() for name in CELL_PARAMETERS}
        self.W_out, self.b_out = initial["W_out"].copy(), initial["b_out"].copy()
        self.squares = {name: np.zeros_like(value) for name, value in self.params.items()}
        self.squares_out = (np.zeros_like(self.W_out), np.zeros_like(self.b_out))

    def cell_params(self):
        return rj.Params(**self.params)

    def loss_and_pullback(self, forest):
        out, pullback = child_sum_tree_lstm.vjp(forest, self.cell_params(),
                                                backend=self.backend, schedule=self.schedule)
        h = out.nodes[0]
        loss, d_logits = self.loss(forest, h)
        return loss, h, d_logits, pullback

    def loss(self, forest, h):
        """The summed cross-entropy of the classifier on every node's `h`, and its gradient
        with respect to the logits."""
        logits = h @ self.W_out.T + self.b_out
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        labels = forest.fields["label"]
        rows = np.arange(labels.size)
        loss = -np.log(probabilities[rows, labels]).sum()
        probabilities[rows, labels] -= 1  # d loss / d logits
        return loss, probabilities

    DEVICE_OUTPUT = False  # whether the pullback leaves its dense gradients on the GPU

    def __call__(self, forest):
        loss, h, d_logits, pullback = self.loss_and_pullback(forest)
        gradients = pullback(nodes=(d_logits @ self.W_out, None),
                             device_output=self.DEVICE_OUTPUT)
        self.adagrad(self.W_out, self.squares_out[0], d_logits.T @ h, LR)
        self.adagrad(self.b_out, self.squares_out[1], d_logits.sum(axis=0), LR)
        self.update_cell(gradients.params)
        return loss

    def update_cell(self, gradients):
        """Adagrad's step for the cell's parameters."""
        for name in self.params:
            self.update(name, getattr(gradients, name))

    def update(self, name, gradient):
        """Adagrad's step for one of the cell's parameters (a gathered table's rows only)."""
        value = self.params[name]
        if isinstance(gradient, rj.RowGrad):
            adagrad_rows(value, self.squares[name], gradient.indices, gradient.values,
                         value.dtype.type(EMBEDDING_LR), value.dtype.type(EPSILON))
        else:
            self.adagrad(value, self.squares[name], gradient, LR)

    @staticmethod
    def adagrad(value, squares, gradient, lr):
        """Adagrad's step for every element of `value` (C-ordered, as `squares`)."""
        gradient = np.ascontiguousarray(gradient, dtype=value.dtype)
        adagrad_elements(value.reshape(-1), squares.reshape(-1), gradient.reshape(-1),
                         value.dtype.type(lr), value.dtype.type(EPSILON))


@numba.njit(error_model="numpy", nogil=True, cache=True)
def adagrad_elements(value, squares, gradient, lr, epsilon):
    """Adagrad on flat arrays in one pass, with NumPy's arithmetic in its order (the same
    bits as `squares += g * g; value -= lr * g / (np.sqrt(squares) + epsilon)`, which makes
    seven passes and four temporaries). NumPy's error model lets the division vectorize."""
    for index in range(value.size):
        g = gradient[index]
        square = squares[index] + g * g
        squares[index] = square
        value[index] -= lr * g / (np.sqrt(square) + epsilon)


@numba.njit(error_model="numpy", nogil=True, cache=True)
def adagrad_rows(value, squares, rows, gradient, lr, epsilon):
    """Adagrad on rows `rows` of a table, `gradient` a row each (a `RowGrad`'s)."""
    for position in range(rows.size):
        adagrad_elements(value[rows[position]], squares[rows[position]], gradient[position],
                         lr, epsilon)


class RecjitCudaStep(RecjitStep):
    """`RecjitStep` on the GPU as a GPU training loop keeps it: the cell's parameters in one
    flat buffer in GPU memory, the embedding table's after the others', viewed as
    `rj.DeviceParams` that the forward and the backward read without a copy, and Adagrad's
    sums in another. The pullback leaves the dense gradients on the device
    (`device_output=True`); a step copies them into one flat buffer there and updates them in
    one launch, as PyTorch's multi-tensor Adagrad does, and the table's rows, which come
    to the host as a `RowGrad`, in another, copied up from pinned host memory into device
    memory allocated once. The classifier's parameters stay on the host with the loss."""

    DEVICE_OUTPUT = True

    TABLE = "E"  # the cell's embedding table: its gradient is a `RowGrad`

    def __init__(self, initial, schedule=None):
        super().__init__(initial, "cuda", schedule)
        names = [name for name in self.params if name != self.TABLE] + [self.TABLE]
        ends = np.cumsum([self.params[name].size for name in names]).tolist()
        self.spans = {name: (end - self.params[name].size, end) for name, end in zip(names, ends)}
        flat = np.concatenate([self.params[name].ravel() for name in names])
        self.values, self.sums = cuda.to_device(flat), cuda.to_device(np.zeros_like(flat))
        self.on_device = rj.DeviceParams(**{
            name: self.values[begin:end].reshape(self.params[name].shape)
            for name, (begin, end) in self.spans.items()})
        self.dense = self.spans[self.TABLE][0]  # the dense parameters' elements, first
        self.dense_gradient = cuda.device_array(self.dense, flat.dtype)
        self.dense_gradients = {  # each parameter's part of the flat gradient buffer
            name: self.dense_gradient[begin:end].reshape(self.params[name].shape)
            for name, (begin, end) in self.spans.items() if name != self.TABLE}
        begin, end = self.spans[self.TABLE]
        shape = self.params[self.TABLE].shape
        self.rows = (cuda.pinned_array(shape[0], np.int64), cuda.device_array(shape[0], np.int64))
        self.row_gradients = (cuda.pinned_array(shape, flat.dtype),
                              cuda.device_array(shape, flat.dtype))
        self.dense_views = (self.values[:self.dense], self.sums[:self.dense])
        self.table_views = (self.values[begin:end].reshape(shape),
                            self.sums[begin:end].reshape(shape))

    def cell_params(self):
        return self.on_device

    def update_cell(self, gradients):
        for name, part in self.dense_gradients.items():
            part.copy_to_device(getattr(gradients, name))
        if self.dense:
            adagrad_on_device[-(-self.dense // 256), 256](
                *self.dense_views, self.dense_gradient, LR, EPSILON)
        table = getattr(gradients, self.TABLE)
        count = table.indices.size
        if count:
            for (pinned, on_device), values in zip((self.rows, self.row_gradients),
                                                   (table.indices, table.values)):
                pinned[:count] = values
                on_device[:count].copy_to_device(pinned[:count])
            adagrad_rows_on_device[-(-table.values.size // 256), 256](
                *self.table_views, *(on_device for _, on_device in (self.rows,
                                                                    self.row_gradients)),
                count, EMBEDDING_LR, EPSILON)


@cuda.jit
def adagrad_on_device(value, squares, gradient, lr, epsilon):
    """Adagrad on every element of a parameter in GPU memory (flat views)."""
    index = cuda.grid(1)
    if index < value.size:
        adagrad_element(value, squares, index, gradient[index], lr, epsilon)


@cuda.jit
def adagrad_rows_on_device(value, squares, rows, gradient, count, lr, epsilon):
    """Adagrad on the first `count` rows `rows` of a table in GPU memory, `gradient` a row
    each."""
    index = cuda.grid(1)
    width = value.shape[1]
    if index < count * width:
        row, column = index // width, index % width
        adagrad_element(value, squares, (rows[row], column), gradient[row, column], lr,
                        epsilon)


@cuda.jit(device=True)
def adagrad_element(value, squares, at, gradient, lr, epsilon):
    squares[at] += gradient * gradient
    value[at] -= lr * gradient / (math.sqrt(squares[at]) + epsilon)


# PyTorch ---------------------------------------------------------------------------------
class TorchStep:
    """train_sst.py's classifier, recjit's cell or plain PyTorch's, with PyTorch's Adagrad;
    plain PyTorch's on `device` ("cuda": the GPU)."""

    def __init__(self, backend, initial, device="cpu"):
        self.device = device
        self.model = Classifier(backend, initial, dropout=0.0).to(device)
        self.adagrad = optimizer(self.model, LR, EMBEDDING_LR, 0.0)

    def __call__(self, forest):
        labels = torch.from_numpy(forest.fields["label"]).to(self.device)
        loss = torch.nn.functional.cross_entropy(self.model(forest), labels, reduction="sum")
        self.adagrad.zero_grad()
        loss.backward()
        self.adagrad.step()
        return loss.item()


class EmbeddingOps(TorchOps):
    row = staticmethod(lambda table, index: table(torch.tensor(int(index))))


class PerTreeStep:
    """The cell applied node by node with PyTorch's autograd: the recursion as a user writes
    it, every node of the batch in one graph, one backward."""

    def __init__(self, initial):
        self.E = torch.nn.Embedding.from_pretrained(torch.tensor(initial["E"]), freeze=False,
                                                    sparse=True)
        self.p = type("P", (), {})()
        self.p.E = self.E
        weights = {name: torch.nn.Parameter(torch.tensor(initial[name]))
                   for name in CELL_PARAMETERS[1:]}
        for name, value in weights.items():
            setattr(self.p, name, value)
        self.out = torch.nn.Linear(initial["W_out"].shape[1], 5)
        with torch.no_grad():
            self.out.weight.copy_(torch.tensor(initial["W_out"]))
            self.out.bias.copy_(torch.tensor(initial["b_out"]))
        self.adagrad = torch.optim.Adagrad(
            [{"params": list(weights.values()) + list(self.out.parameters())},
             {"params": [self.E.weight], "lr": EMBEDDING_LR}], lr=LR)

    def node_states(self, forest):
        """Every node's h, in the forest's order (children computed first)."""
        from peers.cells import EagerNode
        from peers.levels import children_first
        memo = {}
        for node in children_first(forest):
            memo[node] = peer_tree_lstm(EmbeddingOps, self.p,
                                        EagerNode(forest, node, memo, forest.fields))
        return torch.stack([memo[node][0] for node in range(forest.num_nodes)])

    def __call__(self, forest):
        loss = torch.nn.functional.cross_entropy(
            self.out(self.node_states(forest)), torch.from_numpy(forest.fields["label"]),
            reduction="sum")
        self.adagrad.zero_grad()
        loss.backward()
        self.adagrad.step()
        return loss.item()


# DyNet -----------------------------------------------------------------------------------
class DynetStep:
    """One graph for the batch's nodes, DyNet's autobatching, `dy.AdagradTrainer`."""

    def __init__(self, initial):
        import dynet_config
        dynet_config.set(autobatch=1, mem=2048)
        import dynet as dy
        from peers.cells import EagerNode
        from peers.dynet_peers import DynetOps
        from peers.levels import children_first
        self.dy, self.ops, self.node, self.order = dy, DynetOps, EagerNode, children_first
        self.collection = dy.ParameterCollection()
        self.p = type("P", (), {})()
        self.p.E = self.collection.lookup_parameters_from_numpy(initial["E"])
        for name in CELL_PARAMETERS[1:] + ("W_out", "b_out"):
            setattr(self.p, name, self.collection.add_parameters(
                initial[name].shape, init=dy.NumpyInitializer(initial[name])))
        self.trainer = dy.AdagradTrainer(self.collection, learning_rate=LR, eps=EPSILON)

    def __call__(self, forest):
        dy = self.dy
        dy.renew_cg()
        memo, losses = {}, []
        labels = forest.fields["label"]
        for node in self.order(forest):
            memo[node] = peer_tree_lstm(self.ops, self.p,
                                        self.node(forest, node, memo, forest.fields))
            logits = self.p.W_out * memo[node][0] + self.p.b_out
            losses.append(dy.pickneglogsoftmax(logits, int(labels[node])))
        loss = dy.esum(losses)
        value = loss.value()
        loss.backward()
        self.trainer.update()
        return value


# the measurements -----------------------------------------------------------------------
def sst_lines(path, count):
    with open(path) as handle:
        return [line for line in handle if line.strip()][:count]


def sst_batches(lines, size, vocab):
    return [rj.Forest.from_ptb(lines[i:i + size], vocab=vocab)
            for i in range(0, len(lines) - size + 1, size)]


def training_steps(batches, initial, rounds):
    """{contestant: median ms a step}, and each one's first loss."""
    makers = {"recjit": lambda: RecjitStep(initial),
              "recjit in pytorch": lambda: TorchStep("recjit", initial),
              "pytorch level-batched": lambda: TorchStep("torch", initial),
              "pytorch per tree": lambda: PerTreeStep(initial),
              "dynet autobatch": lambda: DynetStep(initial)}
    rows = {}
    for name, make in makers.items():
        try:
            first_loss = float(make()(batches[0]))
            rows[name] = {"first loss": first_loss,
                          "ms": median_ms(make(), batches, rounds)}
        except ImportError as error:
            rows[name] = {"absent": str(error)}
        print(f"  {name}: {rows[name]}", flush=True)
    return rows


def epochs(path, limit):
    """Seconds for one pass over SST train (the first `limit` trees, or all) in batches of
    25, each contestant's training step, after one warm-up step (no dropout, no shuffle)."""
    vocab = {}
    batches = sst_batches(sst_lines(path, limit), 25, vocab)
    initial = initial_parameters(len(vocab), 300, 150, seed=0)
    rows = {"batches": len(batches)}
    for name, make in (("recjit", lambda: RecjitStep(initial)),
                       ("recjit in pytorch", lambda: TorchStep("recjit", initial)),
                       ("pytorch level-batched", lambda: TorchStep("torch", initial)),
                       ("dynet autobatch", lambda: DynetStep(initial))):
        try:
            step = make()
        except ImportError as error:
            rows[name] = {"absent": str(error)}
            continue
        step(batches[0])
        started = time.perf_counter()
        for forest in batches:
            step(forest)
        rows[name] = {"s": time.perf_counter() - started}
        print(f"  {name}: {rows[name]}", flush=True)
    return rows


def ddp_epochs(data, limit):
    """`examples/train_sst.py`'s training seconds for an epoch of the first `limit` trees, in
    one process and in two DistributedDataParallel processes (each their own one thread)."""
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for workers in (1, 2):
            command = [sys.executable, "train_sst.py", "--epochs", "1", "--data", data,
                       "--workers", str(workers), "--record", os.path.join(scratch, "run")]
            if limit:
                command += ["--limit", str(limit)]
            run = subprocess.run(command, cwd=os.path.join(HERE, "..", "examples"),
                                 capture_output=True, text=True, check=False)
            found = re.search(r"epoch 1: loss [0-9.]+ a node, ([0-9.]+) s", run.stdout)
            rows[f"{workers} worker{'s' * (workers > 1)} s"] = (
                float(found.group(1)) if found else f"failed: {run.stderr.strip()[-300:]}")
            print(f"  {workers} workers: {rows}", flush=True)
    return rows


def run_and_pullback_ms(model, forest, p, repeat):
    """(median ms of `model.run`, of a pullback of unit root cotangents) on `forest`, and
    those cotangents. The two are timed in turns, as training calls them: timed one after
    the other, a change of this shared host's speed between them moved their ratio by a
    third (benchmarks/README.md)."""
    out, pullback = model.vjp(forest, p)
    roots = tuple(np.ones_like(state) for state in out.roots)
    calls = (lambda: model.run(forest, p), lambda: pullback(roots=roots))
    times = ([], [])
    for turn in range(repeat + 1):  # the first turn warms up
        for call, taken in zip(calls, times):
            started = time.perf_counter()
            call()
            if turn:
                taken.append(time.perf_counter() - started)
    run, back = (1e3 * float(np.median(taken)) for taken in times)
    return run, back, roots


def pullback_against_run(hidden, batch, repeat):
    """Run, pullback and vjp ms for TreeLSTM on `batch` generated SST-like trees, and the
    pullback's rate: twice the forward's multiply-adds (each product's Wᵀg and g xᵀ), leaf
    products once per distinct word as both kernels compute them, over the pullback's time."""
    from tree_lstm import make_params, tree_lstm
    p = make_params(hidden, 1000, "float32", 0)
    forest = rj.Forest.random_binary(batch, seed=1, vocab_size=1000)
    run, back, roots = run_and_pullback_ms(tree_lstm, forest, p, repeat)
    whole = median_ms(lambda _: tree_lstm.vjp(forest, p)[1](roots=roots), [None] * repeat, 1)
    work = 2 * flops(tree_lstm.compile(forest, p), tree_lstm.linearize(forest))
    return {"run ms": run, "pullback ms": back, "vjp and pullback ms": whole,
            "pullback / run": back / run, "pullback GFLOP": work / 1e9,
            "pullback GFLOP/s": work / back / 1e6}


def zoo_pullbacks(trees, repeat):
    """{model: {hidden, run ms, pullback ms, pullback / run}} for each model of the inference
    benchmark's zoo at its smaller hidden size, on a forest of 10 trees (grids, sequences) as
    that benchmark builds it: every model that compiles trains, at the size it runs at."""
    rows = {}
    for benchmark in TRAINED_ZOO:
        module = importlib.import_module(benchmark.name)
        model, hidden = getattr(module, benchmark.name), benchmark.hidden[0]
        forest, = zoo_forests(benchmark, trees, 10, 1, hidden)
        vocab_size = int(forest.fields["word"].max()) + 1 if "word" in forest.fields else 1
        p = module.make_params(hidden, vocab_size, "float32")
        run, back, _ = run_and_pullback_ms(model, forest, p, repeat)
        rows[benchmark.name] = {"hidden": hidden, "run ms": run, "pullback ms": back,
                                "pullback / run": back / run}
        print(f"  {benchmark.name}: {rows[benchmark.name]}", flush=True)
    return rows


def matmul_roof_on_every_core():
    """bench.py's float32 matmul roof, in a process of its own whose BLAS has every core (this
    one gives it one thread, above)."""
    environment = {name: value for name, value in os.environ.items()
                   if name != "OPENBLAS_NUM_THREADS"}
    measured = subprocess.run(
        [sys.executable, "-c", "from bench import matmul_roof; print(matmul_roof())"],
        cwd=HERE, env=environment, capture_output=True, text=True, check=True)
    return float(measured.stdout.split()[-1])


def backward_against_roof(repeat):
    """TreeLSTM h512 b10's pullback rate against the matmul roof, measured before and after
    it (the higher is the roof, as bench.py takes it)."""
    before = matmul_roof_on_every_core()
    rows = pullback_against_run(512, 10, repeat)
    roof = max(before, matmul_roof_on_every_core())
    return {**rows, "matmul roof GFLOP/s": roof,
            "pullback / roof": rows["pullback GFLOP/s"] / roof}


def per_tree_rows(lines, vocab, initial, rounds):
    """Per-tree gradients of 25 trees against one batch gradient, and against PyTorch
    backward passes tree by tree."""
    step = RecjitStep(initial)
    forest = rj.Forest.from_ptb(lines, vocab=vocab)
    _, _, d_logits, pullback = step.loss_and_pullback(forest)
    cotangent = (d_logits @ step.W_out, None)
    batch = median_ms(lambda _: pullback(nodes=cotangent), [None] * rounds, 1)
    per_tree = median_ms(lambda _: pullback(nodes=cotangent, per_tree=True), [None] * rounds, 1)
    model = Classifier("torch", initial, dropout=0.0)
    trees = [rj.Forest.from_ptb([line], vocab=vocab) for line in lines]

    def torch_loop(_):
        for tree in trees:
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(tree), torch.from_numpy(
                tree.fields["label"]), reduction="sum").backward()

    loop = median_ms(torch_loop, [None] * max(2, rounds // 4), 1)
    return {"batch gradient ms": batch, "per-tree gradients ms": per_tree,
            "per-tree / batch": per_tree / batch, "pytorch per-tree loop ms": loop,
            "pytorch loop / recjit per-tree": loop / per_tree}


def jacobian_rows(batches, initial, rounds):
    """The jacobian of every root's h (H outputs) with respect to the leaves' embeddings."""
    params = rj.Params(**{name: initial[name] for name in CELL_PARAMETERS})
    forest = batches[0]
    jacobian = median_ms(lambda _: child_sum_tree_lstm.jacobian(forest, params, wrt="E"),
                         [None] * max(2, rounds // 4), 1)
    out, pullback = child_sum_tree_lstm.vjp(forest, params)
    hidden = out.roots[0].shape[1]

    def loop(_):
        for element in range(hidden):
            unit = np.zeros_like(out.roots[0])
            unit[:, element] = 1
            pullback.backward(roots=(unit, None))

    looped = median_ms(loop, [None] * 2, 1)
    return {"jacobian ms": jacobian, "pullback loop ms": looped,
            "loop / jacobian": looped / jacobian}


def backward_memory(forest, initial):
    """Bytes the backward allocates beyond the forward's states, against the forward's states
    plus the gradients, counted from the arrays; and the peaks measured (`traced_peak`) of a
    run whose nodes' states are read and of a step's vjp, nodes' states and pullback."""
    params = rj.Params(**{name: initial[name] for name in CELL_PARAMETERS})
    out, pullback = child_sum_tree_lstm.vjp(forest, params)
    states = sum(state.nbytes for state in out.nodes)
    gradients = sum(value.nbytes for name, value in vars(params).items() if name != "E")
    kernel = pullback.compiled.kernel
    rows = row_counts(pullback.linearized, leaf_groups(kernel, pullback.linearized))
    itemsize = np.dtype(kernel.dtype).itemsize
    arrays = {output.name: rows[output.rows] * output.size * itemsize
              for output in kernel.gradients}  # a bias reads its weight's vector: one array
    effect_rows = sum(arrays.values())
    products = sum(array.nbytes for array in pullback.kept.values())

    def step():
        result, pullback = child_sum_tree_lstm.vjp(forest, params)
        return pullback(nodes=(np.ones_like(result.nodes[0]), None))

    run_peak = traced_peak(lambda: child_sum_tree_lstm.run(forest, params).nodes)
    step_peak = traced_peak(step)
    return {"forward states bytes": states, "dense gradients bytes": gradients,
            "cotangents bytes": states, "per-node rows bytes": effect_rows,
            "kept products bytes": products,
            "backward / (forward + gradients)": (2 * states + effect_rows + products
                                                 + gradients) / (states + gradients),
            "measured peak of a run bytes": run_peak,
            "measured peak of a step bytes": step_peak,
            "measured: step / (run + gradients)": step_peak / (run_peak + gradients)}


def traced_peak(call):
    """The most bytes `call` held at once, after a first call (which compiles): what Python
    and NumPy allocate (tracemalloc), the kernels' own scratch aside (numba's allocations,
    which tracemalloc does not see: the packed weights, a batch's packed rows)."""
    call()
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def necessary_work(batches, initial):
    """The multiply-adds ×2 (GFLOP) that each measured computation cannot do without, for
    the targets' rates: a step (the mean over the step's batches), the forward's products (a
    distinct word's leaf product once) three times over (the forward, then each product's
    Wᵀg and g xᵀ, a word's leaves summed first) and the classifier's; per-tree gradients on
    the first batch, at least the backward's two; the jacobian on it, H backward passes of
    Wᵀg alone, each leaf its own."""
    params = rj.Params(**{name: initial[name] for name in CELL_PARAMETERS})
    labels, hidden = initial["W_out"].shape
    forward, per_leaf = [], []
    for forest in batches:
        compiled = child_sum_tree_lstm.compile(forest, params)
        linearized = child_sum_tree_lstm.linearize(forest)
        forward.append(flops(compiled, linearized))
        per_leaf.append(flops(compiled, linearized, per_leaf=True))
    classifier = 3 * 2 * labels * hidden * np.mean([forest.num_nodes for forest in batches])
    return {"step GFLOP": float(3 * np.mean(forward) + classifier) / 1e9,
            "per-tree gradients GFLOP": 2 * forward[0] / 1e9,
            "jacobian GFLOP": hidden * per_leaf[0] / 1e9}


def target_rates(results):
    """Each speed target as a rate of this machine: the time it allows, the GFLOP/s the
    necessary work (`necessary_work`) then needs, and that against the run's matmul roof;
    beside recjit's own time and rate in the same run."""
    work, roof = results["work"], results[BACKWARD_H512]["matmul roof GFLOP/s"]
    steps, per_tree, jacobian = (results[key] for key in ("training step",
                                                         "per-tree gradients", "jacobian"))
    rows = {}
    for peer in ("dynet autobatch", "pytorch level-batched"):
        if "ms" in steps.get(peer, {}):
            rows[f"step ≥ 8x {peer}"] = (steps[peer]["ms"] / 8, steps["recjit"]["ms"],
                                         work["step GFLOP"])
    rows["per-tree gradients ≥ 20x a PyTorch loop"] = (
        per_tree["pytorch per-tree loop ms"] / 20, per_tree["per-tree gradients ms"],
        work["per-tree gradients GFLOP"])
    rows["jacobian ≥ 20x a loop of pullbacks"] = (
        jacobian["pullback loop ms"] / 20, jacobian["jacobian ms"], work["jacobian GFLOP"])
    return {"matmul roof GFLOP/s": roof, **{
        target: {"allowed ms": allowed, "GFLOP": gflop, "needs GFLOP/s": gflop / allowed * 1e3,
                 "needs / roof": gflop / allowed * 1e3 / roof, "recjit ms": ours,
                 "recjit GFLOP/s": gflop / ours * 1e3}
        for target, (allowed, ours, gflop) in rows.items()}}


def target_lines(rates):
    roof = rates["matmul roof GFLOP/s"]
    lines = ["## What the speed targets ask of this machine", "",
             (f"Necessary multiply-adds ×2 (`necessary_work`) over the time each target "
              f"allows, against the run's matmul roof, {roof:.0f} GFLOP/s."), "",
             ("| target | allows ms | GFLOP | needs GFLOP/s | of the roof | recjit ms | "
              "recjit GFLOP/s |"), "|---|---|---|---|---|---|---|"]
    for target, row in rates.items():
        if isinstance(row, dict):
            lines.append(f"| {target} | {row['allowed ms']:.2f} | {row['GFLOP']:.3f} | "
                         f"{row['needs GFLOP/s']:.0f} | {row['needs / roof']:.0%} | "
                         f"{row['recjit ms']:.2f} | {row['recjit GFLOP/s']:.0f} |")
    return lines


def markdown(results):
    """The results as a page: each section the run measured."""
    lines = [f"# recjit training benchmark: {results['machine']}", "",
             f"{results['cpu']}; {results['versions']}"
             + (f"; GPU {_gpu_line(results['gpu'])}" if results.get("gpu") else "")]
    sections = (("training step", step_lines), ("vpps", vpps_lines), ("epoch", epoch_lines),
                (ZOO_PULLBACKS, zoo_lines), (TARGET_RATES, target_lines))
    for key, section in sections:
        if key in results:
            lines += [""] + section(results[key])
    for title in (RUN_H256, BACKWARD_H512, "per-tree gradients", "jacobian", "memory", "work",
                  "ddp epoch"):
        if title in results:
            lines += ["", f"## {title}", ""]
            lines += [f"- {key}: {value:.3f}" if isinstance(value, float)
                      else f"- {key}: {value}" for key, value in results[title].items()]
    return "\n".join(lines) + "\n"


def step_lines(steps):
    lines = [("## A training step (child-sum TreeLSTM, X=300, H=150, float32, 25 SST train "
              "trees)"), "", "| contestant | ms a step | first loss | recjit is faster |",
             "|---|---|---|---|"]
    ours = steps["recjit"].get("ms")
    for name, row in steps.items():
        if "absent" in row:
            lines.append(f"| {name} | absent: {row['absent']} | | |")
            continue
        lines.append(f"| {name} | {row['ms']:.2f} | {row['first loss']:.4f} | "
                     f"{row['ms'] / ours:.2f}x |")
    return lines


def vpps_lines(vpps):
    lines = ["## VPPS's setting (X=H=256)", "", "| batch | contestant | ms a step |",
             "|---|---|---|"]
    for batch, rows in vpps.items():
        for name, row in rows.items():
            lines.append(f"| {batch} | {name} | "
                         + (f"{row['ms']:.2f} |" if "ms" in row else "absent |"))
        if "recjit cuda" in rows:
            ratio = rows["pytorch level-batched cuda"]["ms"] / rows["recjit cuda"]["ms"]
            lines.append(f"| {batch} | target: recjit cuda ≥ 10x PyTorch level-batched on the "
                         f"GPU | {ratio:.2f}x ({'met' if ratio >= 10 else 'NOT met'}) |")
    return lines


def epoch_lines(epoch):
    lines = [f"## An epoch of SST train ({epoch['batches']} batches of 25, no dropout)", "",
             "| contestant | s | over recjit in pytorch |", "|---|---|---|"]
    base = epoch.get("recjit in pytorch", {}).get("s")
    for name, row in epoch.items():
        if name == "batches":
            continue
        lines.append(f"| {name} | absent |  |" if "absent" in row else
                     f"| {name} | {row['s']:.2f} | {row['s'] / base:.2f}x |" if base else
                     f"| {name} | {row['s']:.2f} |  |")
    return lines


def zoo_lines(rows):
    title = ("## Every zoo model's pullback against its run (10 trees, the inference "
             "benchmark's smaller size)")
    lines = [title, "", "| model | hidden | run ms | pullback ms | pullback / run |",
             "|---|---|---|---|---|"]
    lines += [(f"| {name} | {row['hidden']} | {row['run ms']:.3f} | {row['pullback ms']:.3f} "
               f"| {row['pullback / run']:.2f} |") for name, row in rows.items()]
    return lines


def vpps_rows(lines, vocab, count, rounds, on_gpu):
    """{batch size: {contestant: {"ms": median ms a step}}} in VPPS's setting, X=H=256; with
    `on_gpu`, recjit's and PyTorch level-batched's steps on the GPU too, the parameters kept
    there (`RecjitCudaStep`)."""
    rows = {}
    for size in (1, 10, 25):
        print(f"VPPS's setting, X=H=256, batches of {size}:", flush=True)
        vpps = sst_batches(lines[:count * size], size, vocab)
        initial = initial_parameters(len(vocab), 256, 256, seed=0)
        contestants = [("recjit", lambda initial=initial: RecjitStep(initial)),
                       ("pytorch level-batched",
                        lambda initial=initial: TorchStep("torch", initial))]
        if on_gpu:
            contestants += [("recjit cuda", lambda initial=initial: RecjitCudaStep(initial)),
                            ("pytorch level-batched cuda",
                             lambda initial=initial: TorchStep("torch", initial, "cuda"))]
        rows[size] = {name: {"ms": median_ms(make(), vpps, rounds)} for name, make in contestants}
        print(f"  {rows[size]}", flush=True)
    return rows


def other_rows(args, lines, vocab, batches):
    """The pullback against the run (TreeLSTM, and every zoo model), per-tree gradients, the
    jacobian, the memory, an epoch and a DDP epoch."""
    quick = args.quick
    initial = initial_parameters(len(vocab), 300, 150, seed=0)
    results = {RUN_H256: pullback_against_run(256, 10, 20 if quick else 50),
               BACKWARD_H512: backward_against_roof(10 if quick else 30)}
    print("every zoo model's pullback against its run:", flush=True)
    results[ZOO_PULLBACKS] = zoo_pullbacks(lines, 10 if quick else 30)
    results["per-tree gradients"] = per_tree_rows(lines[:25], vocab, initial, 4 if quick else 12)
    results["jacobian"] = jacobian_rows(batches, initial, 4 if quick else 8)
    results["memory"] = backward_memory(batches[0], initial)
    print("an epoch of SST train, batches of 25:", flush=True)
    results["epoch"] = epochs(os.path.join(args.data, "train.txt"), 1000 if quick else None)
    print("an epoch of train_sst.py, 1 and 2 DDP workers:", flush=True)
    results["ddp epoch"] = ddp_epochs(args.data, 1000 if quick else None)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--quick", action="store_true", help="fewer batches and rounds")
    parser.add_argument("--machine", default=f"cpu-{os.cpu_count()}core")
    parser.add_argument("--cuda", action="store_true",
                        help="VPPS's setting on the GPU too: recjit's vjp with backend='cuda' "
                             "and PyTorch level-batched on CUDA")
    parser.add_argument("--vpps", action="store_true", help="VPPS's setting only")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.data, "train.txt")):
        parser.error(f"--data {args.data}: no train.txt there (the Stanford Sentiment "
                     "Treebank's, in PTB form)")
    count, rounds = (2, 2) if args.quick else (8, 3)
    vocab = {}
    lines = sst_lines(os.path.join(args.data, "train.txt"), count * 25)
    batches = sst_batches(lines, 25, vocab)
    results = {"machine": args.machine,
               "cpu": cpu_facts(),
               "versions": {"python": platform.python_version(), "numpy": np.__version__,
                            "numba": numba.__version__, "torch": torch.__version__,
                            "recjit": rj.__version__}}
    if not args.vpps:
        print("a training step, X=300, H=150, 25 trees:", flush=True)
        results["training step"] = training_steps(
            batches, initial_parameters(len(vocab), 300, 150, seed=0), rounds)
    if args.cuda:
        results["gpu"] = gpu_facts()
    results["vpps"] = vpps_rows(lines, vocab, count, rounds, args.cuda)
    if not args.vpps:
        results.update(other_rows(args, lines, vocab, batches))
        results["work"] = necessary_work(batches, initial_parameters(len(vocab), 300, 150,
                                                                     seed=0))
        results[TARGET_RATES] = target_rates(results)
    base = os.path.join(HERE, "results", f"training-{args.machine}")
    print(markdown(results))
    write_results(base, results, markdown(results))


if __name__ == "__main__":
    main()
