"""A model over a corpus larger than one process, with Dask (docs/scale.md): the corpus in
partitions, each worker running the compiled kernel on its own.

    import dask.bag as db
    import recjit.dask

    lines = db.read_text("sst/train.txt", blocksize="256kB")
    states = recjit.dask.roots(tree_lstm, lines, p, vocab=vocab)   # a dask.array
    states.compute()                                                # or recjit.dask.to_npy(...)

Each worker receives the model and the parameters once (broadcast where a `distributed`
client is in use), keeps the model for as long as it lives, and so compiles each kernel once
(or loads it from numba's disk cache), however many partitions and computations it runs."""
import hashlib
import os
from dataclasses import dataclass

import cloudpickle
import dask
import dask.array as da
import dask.bag as db
import numpy as np

from .errors import InputError, RecJitError
from .linearize import Forest
from .model import RecursiveModel, checked_backend
from .schedule import checked_schedule
from .threads import set_num_threads

_RESIDENT = {}  # a shipped model's token → the first copy of it this process received


@dataclass(frozen=True)
class Options:
    """How each partition is read and run."""

    vocab: dict
    unknown: object
    output: int
    batch_size: int
    backend: str
    schedule: object
    threads: object
    meta: tuple  # (one root's state shape, its dtype), as the reference recursion gives them


@dataclass(frozen=True)
class Shipment:
    """What every partition's task needs, shipped to each worker once: the model (its
    `token` names it, whatever copy a worker received), parameters, context and options."""

    model: RecursiveModel
    params: object
    context: tuple
    token: str
    options: Options

    def resident_model(self):
        """The copy of the model this process keeps, with the kernels it compiled before."""
        return _RESIDENT.setdefault(self.token, self.model)


def roots(model, corpus, params, *, vocab=None, unknown=None, output=0, batch_size=256,
          backend="cpu", schedule=None, context=(), threads=None):
    """The `output`-th state of every root of `corpus`, in its order: a `dask.array` of one
    chunk per partition (its length known once computed).

    `corpus`: a `dask.bag.Bag` of PTB lines (`db.read_text`, one tree a line, as SST's files
    are; a treebank spreading trees over lines needs a partition per file,
    `blocksize=None`), read with `vocab`, a dict of word → id that every worker shares
    (words outside it are an error unless `unknown` gives their id); or a sequence of
    `rj.Forest`s, a partition each. Each partition runs in batches of `batch_size` trees,
    on `threads` threads of its worker (default: numba's, every core; give
    `cores // workers` where several workers share a machine)."""
    if not isinstance(model, RecursiveModel):
        raise RecJitError(f"recjit.dask.roots takes a recursive model (a cell decorated "
                          f"with @rj.recursive_model), not {type(model).__name__}")
    checked_backend(backend)
    checked_schedule(schedule, None)
    if unknown is not None:
        _whole("unknown", unknown, 0)
    partitions, sample = _partitions(corpus, vocab)
    shape, dtype = meta = _root_meta(model, sample, params, context, output)
    options = Options(vocab, unknown, output, _whole("batch_size", batch_size, 1), backend,
                      schedule, None if threads is None else _whole("threads", threads, 1),
                      meta)
    shipment = _shipped(Shipment(model, params, tuple(context), _token(model), options))
    run = dask.delayed(_partition_roots, pure=True)
    return da.concatenate([
        da.from_delayed(run(partition, shipment, index), shape=(np.nan, *shape), dtype=dtype)
        for index, partition in enumerate(partitions)])


def to_npy(model, corpus, params, directory, **options):
    """Computes `roots(model, corpus, params, **options)` and writes each partition's states
    to `directory/part-00000.npy`, … (on the worker that computed them: `directory` must be
    one they all see). Returns the paths, in the corpus's order."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InputError(f"recjit.dask.to_npy writes its files into directory {directory!r}, "
                         "which is a file")
    os.makedirs(directory, exist_ok=True)
    states = roots(model, corpus, params, **options)
    write = dask.delayed(_write_npy, pure=True)
    paths = [os.path.join(directory, f"part-{index:05d}.npy")
             for index in range(states.numblocks[0])]
    return list(dask.compute(*[write(block, path)
                               for block, path in zip(states.to_delayed().ravel(), paths)]))


def resident():
    """The models this process holds for `roots` tasks, each with the kernels it has
    compiled (or loaded from numba's disk cache): `{name#token: count}`. On a cluster,
    `client.run(recjit.dask.resident)` asks every worker."""
    return {f"{model.__name__}#{token[:8]}": model.kernels_compiled
            for token, model in _RESIDENT.items()}


def _partitions(corpus, vocab):
    """(the corpus's partitions, as delayed values; a small forest like theirs)."""
    if isinstance(corpus, db.Bag):
        if not isinstance(vocab, dict) or not vocab:
            raise InputError("recjit.dask.roots reads a bag of PTB lines with vocab=, a dict "
                             "of word → id (a forest's .vocab) that every partition shares")
        sample = Forest.from_ptb(["(0 w)"], vocab={"w": next(iter(vocab.values()))})
        return corpus.to_delayed(), sample
    forests = list(corpus) if isinstance(corpus, (list, tuple)) else None
    if not forests or not all(isinstance(forest, Forest) for forest in forests):
        raise InputError("recjit.dask.roots takes a dask.bag of PTB lines or a non-empty list "
                         f"of rj.Forest, not {type(corpus).__name__}")
    sample = forests[0].select([0]) if forests[0].roots.size else forests[0]
    return [dask.delayed(forest, pure=False, traverse=False) for forest in forests], sample


def _root_meta(model, forest, params, context, output):
    """The `output`-th root state's shape and dtype, from the reference recursion on one
    small tree (no kernel compiled here): a dask.array is typed before it is computed."""
    states = model.reference(forest, params, context=context).roots
    if isinstance(output, bool) or not isinstance(output, (int, np.integer)) or \
            not 0 <= output < len(states):
        raise RecJitError(f"output={output!r}: {model.__name__} returns {len(states)} "
                          f"state(s), numbered from 0")
    return states[output].shape[1:], states[output].dtype


def _token(model):
    """Names a model the same in every process: its pickle (a module's model pickles as a
    reference to it; another as its cell's code and the values it reads)."""
    return hashlib.sha256(cloudpickle.dumps(model)).hexdigest()


def _shipped(shipment):
    """The shipment as a task's argument: broadcast to every worker of the `distributed`
    client in use (once each, not once a task), or kept in the graph of a local scheduler."""
    try:
        from distributed import default_client
        client = default_client()
    except (ImportError, ValueError):  # no distributed, or no client
        return dask.delayed(shipment, pure=False, traverse=False)
    return client.scatter(shipment, broadcast=True, hash=False)


def _partition_roots(partition, shipment, index):
    """The root states of partition `index` of the corpus, on a worker."""
    options = shipment.options
    if options.threads is not None:
        set_num_threads(options.threads)  # numba's count is per thread, and tasks have theirs
    model = shipment.resident_model()
    try:
        forest = (partition if isinstance(partition, Forest)
                  else _forest_of_lines(partition, options))
    except InputError as error:  # its lines are counted within the partition
        raise InputError(f"partition {index} of the corpus (from 0): {error}") from None
    shape, dtype = options.meta
    states = [model.run(batch, shipment.params, backend=options.backend,
                        schedule=options.schedule, context=shipment.context).roots[options.output]
              for batch in forest.batches(options.batch_size)]
    states = np.concatenate(states) if states else np.empty((0, *shape), dtype)
    if states.shape[1:] != shape or states.dtype != dtype:
        raise RecJitError(f"{model.__name__}'s kernel gave root states of shape "
                          f"{states.shape[1:]} {states.dtype}, where its reference recursion "
                          f"gave {shape} {dtype}")
    return states


def _forest_of_lines(lines, options):
    """A partition's PTB lines as a forest, its words numbered by the shared vocabulary."""
    vocab = options.vocab
    forest = Forest.from_ptb(lines, vocab=dict(vocab))
    largest = max(vocab.values())
    words = forest.fields["word"]
    unseen = words > largest
    if unseen.any():
        if options.unknown is None:
            word = next(word for word, index in forest.vocab.items() if index > largest)
            raise InputError(f"word {word!r} is not in vocab (it has {len(vocab)} words); "
                             f"give unknown= the id to read such words as")
        words[unseen] = options.unknown
    return forest


def _write_npy(states, path):
    np.save(path, states)
    return path


def _whole(name, value, least):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise RecJitError(f"recjit.dask: {name} must be a whole number, at least {least}, "
                          f"not {value!r}")
    return int(value)
