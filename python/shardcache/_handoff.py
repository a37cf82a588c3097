"""Hand-off of batch items from DataLoader workers to the main process through reused shared
memory.

torch passes a tensor between processes as a shared-memory descriptor: each one costs the
receiver a connection to the sender, and each batch a fresh shared-memory file whose pages the
kernel must allocate and zero on first touch (about 1 ms per MiB on a VM). A worker of a
shardcache dataset instead copies each item's data and table into one of a few buffers it keeps
(pages stay allocated), and sends a buffer's descriptor only the first time; the main process
keeps the buffers it has seen and builds the item as views of them. When the last view of an
item dies, the main process marks its buffer free in a flag array the worker reads, and the
worker fills it again.

Flags: one int64 per (worker id, buffer); 0 = free, else the token of the item using it, which
only the main process clears, and only if the token is still that item's (a worker process of
an earlier epoch may have left its own there). A worker that finds none of its buffers free
(the trainer holds many items) sends a one-off buffer instead, never waits.
"""
import itertools
import multiprocessing
import os
import uuid
import weakref

import torch as _torch

BUFFERS_PER_WORKER = 6

_registry = weakref.WeakValueDictionary()  # main process: uid -> Handoff, to free flags
_seen = {}    # main process: (uid, worker, buffer) -> (pid, generation, uint8 tensor over the buffer)
_pools = {}   # worker process: (uid, pid) -> {buffer: [generation, uint8 tensor]}
_tokens = itertools.count(1)


class Handoff:
    """Made by the dataset in the main process; travels to its workers (fork or spawn)."""

    def __init__(self, max_workers):
        self.uid = uuid.uuid4().hex
        self.flags = multiprocessing.RawArray("q", max_workers * BUFFERS_PER_WORKER)
        _registry[self.uid] = self
        weakref.finalize(self, _forget, self.uid)

    def __setstate__(self, state):
        self.__dict__.update(state)
        _registry.setdefault(self.uid, self)

    def pack(self, worker, build_args, data, table):
        """In a worker: the item (_build(kind, data, table, extra)) as a picklable _Packed."""
        kind, extra = build_args
        data_bytes = data.numel() * data.element_size()
        at = (data_bytes + 7) // 8 * 8
        need = at + table.numel() * 8
        pid = os.getpid()
        pool = _pools.setdefault((self.uid, pid), {})
        first = worker * BUFFERS_PER_WORKER
        slot = next((j for j in range(first, first + BUFFERS_PER_WORKER) if self.flags[j] == 0), -1)
        send = None
        if slot < 0:
            base = _shared(need)  # every buffer is in use: a one-off one
            send, gen, token = base, 0, 0
        else:
            entry = pool.get(slot)
            if entry is None or entry[1].numel() < need:
                gen = entry[0] + 1 if entry else 1
                entry = pool[slot] = [gen, _shared(need + need // 4)]
                send = entry[1]
            gen, base = entry
            token = next(_tokens) << 24 | pid & 0xffffff
            self.flags[slot] = token
        if data_bytes:
            base[:data_bytes].copy_(data.reshape(-1).view(_torch.uint8))
        base[at:need].copy_(table.contiguous().view(-1).view(_torch.uint8))
        return _Packed(self.uid, worker, slot, pid, gen, token, send, kind, data.dtype, data_bytes,
                       tuple(table.shape), extra)

    def _free(self, slot, token):
        if self.flags[slot] == token:
            self.flags[slot] = 0


def _forget(uid):
    for key in [k for k in _seen if k[0] == uid]:
        del _seen[key]


def _shared(nbytes):
    storage = _torch.UntypedStorage._new_shared(max(8, nbytes))
    return _torch.empty(0, dtype=_torch.uint8).set_(_torch.storage.TypedStorage(wrap_storage=storage,
                                                                                 dtype=_torch.uint8))


class _Packed:
    __slots__ = ("args",)

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return _unpack, self.args


def _unpack(uid, worker, slot, pid, gen, token, sent, kind, dtype, data_bytes, shape, extra):
    """In the main process: the item as views of the buffer."""
    from shardcache.torch import _build  # the item layout lives with the dataset
    if slot < 0:
        base = sent
    else:
        key = (uid, worker, slot)
        if sent is not None:
            _seen[key] = (pid, gen, sent)
        seen = _seen.get(key)
        if seen is None or seen[:2] != (pid, gen):
            raise RuntimeError("shardcache: a DataLoader worker referred to a shared buffer this process "
                               "never received")
        # The item's own numpy view of the buffer: when the last tensor made from it dies, the
        # buffer is free again.
        view = seen[2].numpy()
        handoff = _registry.get(uid)
        if handoff is not None:
            weakref.finalize(view, handoff._free, slot, token)
        base = _torch.from_numpy(view)
    at = (data_bytes + 7) // 8 * 8
    count = 1
    for n in shape:
        count *= n
    data = base[:data_bytes].view(dtype)
    table = base[at:at + 8 * count].view(_torch.int64).view(shape)
    return _build(kind, data, table, extra)
