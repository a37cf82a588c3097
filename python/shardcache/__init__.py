"""shardcache: read training batches from the node's shardcached through shared memory.

    import shardcache, numpy
    client = shardcache.Client("/run/shardcache/shardcached.sock")
    loader = client.loader("tokens-v3", batch_size=32, seed=17, epoch=0, shuffle="block",
                           rank=0, world_size=8, drop_last=True)   # shuffle: none|global|block
    for batch in loader:                 # shardcache.Batch, valid until released / collected
        ids = batch.sample_ids           # numpy int64, global sample ids in this batch
        raw = batch.sample(0)            # memoryview of one sample's bytes
        x = numpy.from_dlpack(batch)     # dense batches; torch.from_dlpack(batch) likewise
    state = loader.state_dict()          # resume: client.loader(...).load_state_dict(state)

A loader iterates one epoch; `loader.set_epoch(e)` starts another. Errors raise
`shardcache.Error` with `.code` (a gRPC-style status code) and `.code_name`.
`shardcache.torch.IterableDataset` wraps a loader for torch.utils.data (torch is imported only
when that module is used).
"""
from ._shardcache import Batch, Client, Error, Loader, DEFAULT_SOCKET
from . import _checkpoint

# Checkpoints (write-behind through the node): client.checkpoint(name) is a file for torch.save,
# client.wait_uploaded(name, timeout), client.checkpoints(), client.open_checkpoint(name).
Client.checkpoint = _checkpoint.checkpoint
Client.open_checkpoint = _checkpoint.open_checkpoint
# GPU staging: shardcache.Stager(client, loader, depth=2, convert=...) yields DeviceBatch objects
# whose tensors export to torch.from_dlpack as CUDA tensors ordered after the copy.
from ._shardcache import DeviceBatch, DeviceTensor, Stager, cuda_available

__all__ = ["Batch", "Client", "Error", "Loader", "DEFAULT_SOCKET",
           "DeviceBatch", "DeviceTensor", "Stager", "cuda_available"]
