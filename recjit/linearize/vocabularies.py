"""What readers and processes remember of the vocabularies forests hold: dicts of a word (a
label) to its id, which may hold a corpus's every word.

`Recent` keeps the last few dicts seen, each with a value, while a dict keeps its words: while
its length and its last key stay what they were. A caller that renumbers ids in place, words
kept, is not noticed.

A forest pickles its vocabulary as `Pickled`: the dict's own pickle and its digest, made once
while the dict keeps its words, and loaded once a process, so that forests sent with the same
vocabulary share the dict the first one loaded. Pickled and loaded with every batch a
DataLoader's workers send, a corpus's vocabulary cost more than reading the batches
(docs/processes.md)."""
import collections
import hashlib
import pickle
import threading


class Recent:
    """The last few dicts entered, by a key, each with a value that `find` gives while the
    dict keeps its words. The dicts are held, not only their ids, so that an id is never
    another dict's."""

    SIZE = 8

    def __init__(self):
        self.entries = collections.OrderedDict()  # key: (dict, length, last key, value)
        self.lock = threading.Lock()

    def find(self, key, vocabulary=None):
        """The value entered under `key`, if its dict (`vocabulary`, where given) kept its
        words since; else None."""
        entry = self.entries.get(key)
        if entry is None or (vocabulary is not None and entry[0] is not vocabulary):
            return None
        if entry[1] != len(entry[0]) or _last_key(entry[0]) is not entry[2]:
            return None
        return entry[3]

    def enter(self, key, vocabulary, value):
        with self.lock:
            self.entries[key] = (vocabulary, len(vocabulary), _last_key(vocabulary), value)
            self.entries.move_to_end(key)
            while len(self.entries) > self.SIZE:
                self.entries.popitem(last=False)


class Pickled:
    """A vocabulary as it pickles: `payload`, the dict's pickle; `digest`, the payload's."""

    __slots__ = ("digest", "payload")

    def __init__(self, vocabulary):
        self.payload = pickle.dumps(vocabulary, protocol=pickle.HIGHEST_PROTOCOL)
        self.digest = hashlib.blake2b(self.payload, digest_size=16).digest()

    def __reduce__(self):
        return unpickled, (self.digest, self.payload)


_pickled = Recent()  # id of a dict pickled here → its `Pickled`
_loaded = Recent()  # digest of a vocabulary loaded here → the dict


def pickled(vocabulary):
    """`vocabulary` as it pickles: one `Pickled` while the dict keeps its words, so that a
    dump of many forests holds it once (pickle's memo), and later dumps make it no more."""
    found = _pickled.find(id(vocabulary), vocabulary)
    if found is None:
        found = Pickled(vocabulary)
        _pickled.enter(id(vocabulary), vocabulary, found)
    return found


def unpickled(digest, payload):
    """The dict a `Pickled` stands for: the one this process loaded with its digest, while it
    keeps its words, else the payload loaded."""
    found = _loaded.find(digest)
    if found is None:
        found = pickle.loads(payload)
        _loaded.enter(digest, found, found)
    return found


def _last_key(vocabulary):
    """The key last added to dict `vocabulary` (None if it is empty)."""
    return next(reversed(vocabulary), None)
