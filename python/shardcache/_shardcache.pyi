"""Type stubs of the compiled shardcache module (python/src/module.cc, stager_binding.cc)."""
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy

DEFAULT_SOCKET: str


class Error(RuntimeError):
    """A failed call to shardcached; `code` is the gRPC-style status code, `code_name` its name."""
    code: int
    code_name: str


class Payload:
    """A batch's payload bytes as a 1-D uint8 DLPack tensor; keeps the batch alive."""

    def __dlpack__(self, *, stream: None = None) -> Any:
        """A DLPack capsule of the payload (host memory)."""

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(1, 0): host memory."""


class Batch:
    """One batch in shared memory, valid until released or collected. Views (memoryviews,
    arrays, tensors) of it keep it alive; its slot returns to the daemon when the last goes."""

    def __len__(self) -> int:
        """Samples in the batch."""

    @property
    def sample_ids(self) -> numpy.ndarray:
        """int64 array of the global sample ids in this batch."""

    def sample(self, i: int) -> memoryview:
        """Read-only memoryview of sample i's bytes."""

    @property
    def data(self) -> memoryview:
        """Read-only memoryview of the whole payload (samples back to back, in batch order)."""

    @property
    def record_bytes(self) -> int:
        """Bytes per sample for a records dataset (the batch is dense [B, record_bytes]); 0 otherwise."""

    @property
    def payload_bytes(self) -> int:
        """Bytes of the payload."""

    @property
    def seq(self) -> int:
        """The batch's sequence number within its loader."""

    @property
    def wait_us(self) -> int:
        """How long the daemon waited for this batch's data (0 when it was prefetched)."""

    @property
    def samples_consumed_after(self) -> int:
        """The rank's resume point once this batch and every one before it are consumed."""

    @property
    def has_fields(self) -> bool:
        """True when the batch describes its samples' fields (tar datasets)."""

    @property
    def keys(self) -> List[str]:
        """WebDataset keys of the samples (tar datasets; empty strings otherwise)."""

    def fields(self, i: int) -> Dict[str, Any]:
        """Sample i as a dict: '__key__', '__id__' and a read-only memoryview per member name."""

    def columns(self) -> Tuple[List[str], numpy.ndarray]:
        """(names, table): one int64 array [1 + 2 * len(names), B]; row 0 the sample ids, rows
        1 + 2k and 2 + 2k the offsets (from the payload start) and lengths (-1 where a sample
        lacks it) of field names[k]."""

    def payload(self) -> Payload:
        """The whole payload as one uint8 vector for torch.from_dlpack / numpy.from_dlpack."""

    def __dlpack__(self, *, stream: None = None) -> Any:
        """DLPack of the dense [B, record_bytes] uint8 batch (records datasets only)."""

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(1, 0): host memory."""

    def release(self) -> None:
        """Return the slot now; raises BufferError while views of the batch are alive."""


class Loader:
    """One rank's epoch of a dataset, batch by batch (see Client.loader)."""

    def __iter__(self) -> Iterator[Batch]:
        """The loader itself: iterating reads the current epoch from its position."""

    def __next__(self) -> Batch:
        """The next batch; StopIteration at the end of the epoch."""

    def __len__(self) -> int:
        """Batches in this rank's epoch."""

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank stands: plan parameters, dataset version, epoch, samples consumed and
        the global position (for a resume on another world size)."""

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from a state_dict() of this job (any rank or world size); the next iteration
        raises shardcache.Error naming both versions if the dataset was re-indexed since."""

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads epoch `epoch` from its start."""

    @property
    def epoch(self) -> int:
        """The epoch the next or current iteration reads."""

    @property
    def samples_per_epoch(self) -> int:
        """This rank's samples in the epoch (padding included)."""

    @property
    def loader_samples(self) -> int:
        """Samples this loader delivers from its resume point (its worker's share)."""

    @property
    def dataset_samples(self) -> int:
        """Samples in the whole dataset."""

    @property
    def record_bytes(self) -> int:
        """Bytes per sample of a records dataset; 0 otherwise."""

    @property
    def version(self) -> str:
        """The dataset version (hash of its manifest) this loader reads."""

    @property
    def format(self) -> str:
        """'records', 'tar' or 'megatron'."""

    @property
    def sample_dtype(self) -> str:
        """Megatron: numpy dtype name of the tokens ('uint16', 'int32', ...); '' otherwise."""

    def close(self) -> None:
        """Close the daemon-side loader now (batches still alive stay valid)."""


class Client:
    """A connection to the node's shardcached; one per process (a forked child connects anew)."""

    def __init__(self, socket_path: str = ..., reconnect_timeout_ms: int = 60000) -> None:
        """Connect and map the shared-memory arena; raises shardcache.Error (PermissionDenied,
        Unavailable, FailedPrecondition for a daemon of another protocol version). When the
        daemon restarts, loaders continue on its successor at their position after a pause of
        up to reconnect_timeout_ms (0: the loss raises Unavailable)."""

    def loader(self, dataset: str, batch_size: int = 32, seed: int = 0, epoch: int = 0, shuffle: str = "none",
               rank: int = 0, world_size: int = 1, drop_last: bool = False, block_window_shards: int = 0,
               timeout_ms: int = 0, pad: bool = True, worker: int = 0, num_workers: int = 1,
               fields: bool = True) -> Loader:
        """A loader of rank `rank` of `world_size` (shuffle: none|global|block). Every rank gets
        the same number of samples: drop_last=False pads a rank one short with the first sample
        of its own order (pad=False: each sample exactly once, ranks may differ by one);
        worker/num_workers read every num_workers-th batch of the rank; fields=True describes
        tar samples' members (Batch.fields / columns)."""

    def stats(self) -> str:
        """The daemon's serve statistics, one JSON object."""

    def checkpoint(self, name: str) -> Any:
        """A writable binary file for checkpoint `name` ("run7/step1000/rank3.pt") on the node's
        disk, usable by torch.save. close() (or leaving `with` normally) fsyncs it and returns once
        it is durable on the node; the daemon uploads it in the background. An exception in the
        `with` block, or abort(), drops it. A full disk raises OSError (ENOSPC) in write/close."""

    def open_checkpoint(self, name: str) -> Any:
        """Checkpoint `name` opened for reading (binary, for torch.load): the node's copy, else
        read from the upstream first (resume on another node)."""

    def checkpoints(self, name: str = "") -> List[Dict[str, Any]]:
        """States of the checkpoints saved through this node ("" = all): dicts with name, state
        (local | uploading | remote | failed), size, uploaded_bytes, upload_bytes_per_s, eta_s,
        local, error."""

    def wait_uploaded(self, name: str, timeout: float = 3600.0) -> None:
        """Waits until checkpoint `name` is committed upstream (verified); raises Error when its
        upload failed for good (the reason) or `timeout` seconds pass (how far it got)."""

    @property
    def arena_bytes(self) -> int:
        """Size of this connection's shared-memory arena."""

    @property
    def slot_count(self) -> int:
        """Slots in the arena (batches that can be held at once)."""

    @property
    def slot_bytes(self) -> int:
        """Bytes per slot (the largest batch)."""


def cuda_available() -> bool:
    """True when this build has CUDA and the runtime sees a GPU (Stager then stages to it)."""


def cuda_compiled_in() -> bool:
    """True when this build contains the CUDA path."""


class DeviceTensor:
    """One tensor of a DeviceBatch; torch.from_dlpack / numpy.from_dlpack take it."""

    @property
    def shape(self) -> Tuple[int, ...]:
        """The tensor's shape."""

    @property
    def dtype(self) -> str:
        """uint8, int64, float32 or bfloat16."""

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""

    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """DLPack capsule; the consumer's stream waits for the copy."""

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(2, ordinal) on CUDA, (1, 0) on the host path."""


class DeviceBatch:
    """A batch staged in device memory (host memory without a GPU)."""

    def __len__(self) -> int:
        """Samples in the batch."""

    @property
    def num_tensors(self) -> int:
        """Tensors the conversion produced (1, or 2 for tokens_shift)."""

    def tensor(self, i: int) -> DeviceTensor:
        """The i-th tensor."""

    @property
    def tensors(self) -> List[DeviceTensor]:
        """Every tensor."""

    @property
    def data(self) -> DeviceTensor:
        """The only tensor (raw bytes, tokens or images)."""

    @property
    def inputs(self) -> DeviceTensor:
        """convert='tokens_shift': the input tokens."""

    @property
    def targets(self) -> DeviceTensor:
        """convert='tokens_shift': the target tokens (inputs shifted by one)."""

    @property
    def sample_ids(self) -> numpy.ndarray:
        """int64 global sample ids."""

    @property
    def sample_offsets(self) -> numpy.ndarray:
        """Where each sample starts in the data tensor."""

    @property
    def device(self) -> str:
        """'cuda:N' or 'cpu'."""

    def wait(self, stream: int) -> None:
        """Make a CUDA stream (integer handle) wait for this batch's copy; no-op on the host path."""

    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """DLPack of the only tensor, like batch.data."""

    def __dlpack_device__(self) -> Tuple[int, int]:
        """Where the batch lives."""


class Stager:
    """Stages the epoch a loader describes into device memory, `depth` batches ahead, with an
    optional fused conversion (tokens_int64, tokens_shift, image_f32, image_bf16)."""

    def __init__(self, client: Client, loader: Any, depth: int = 2, convert: Optional[str] = None,
                 token_dtype: str = "uint16", image_size: Optional[Tuple[int, int]] = None, channels: int = 3,
                 mean: Sequence[float] = ..., std: Sequence[float] = ..., device: str = "auto",
                 device_id: int = 0, force_bounce: bool = False) -> None:
        """`loader` is a shardcache.Loader or its state_dict(); device: 'auto', 'cuda' or 'host'."""

    def __iter__(self) -> Iterator[DeviceBatch]:
        """The stager itself."""

    def __next__(self) -> DeviceBatch:
        """The next staged batch; StopIteration at the end of the epoch."""

    def __len__(self) -> int:
        """Batches in the epoch."""

    def set_epoch(self, epoch: int) -> None:
        """Stage epoch `epoch` from its start next."""

    @property
    def epoch(self) -> int:
        """The epoch being staged."""

    @property
    def device(self) -> str:
        """'cuda:0 (NVIDIA H200, sm_90)' or 'host'."""

    def __dlpack_device__(self) -> Tuple[int, int]:
        """Where staged batches live."""

    def stats(self) -> Dict[str, Any]:
        """This stager's counters (the trainer process has no metrics endpoint): batches_staged,
        bytes_staged, bytes_bounced, batches_gathered, arena_registered, h2d_payload_bytes,
        h2d_index_bytes."""
