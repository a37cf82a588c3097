"""Checkpoints saved through the node's shardcached (write-behind).

    with client.checkpoint("run7/step1000/rank3.pt") as f:   # a binary file on the node's disk
        torch.save(model.state_dict(), f)                     # returns once durable on the node
    client.wait_uploaded("run7/step1000/rank3.pt", timeout=600)  # only jobs that must know
    state = torch.load(client.open_checkpoint("run7/step1000/rank3.pt"))  # local copy or upstream

close() (or leaving the `with` block normally) fsyncs the file and has the daemon commit it under
its name; the upload to the upstream runs in the background. An exception inside the `with`
block, or abort(), drops the file: a failed save is never reported as saved.
"""
import io
import os


class CheckpointFile(io.FileIO):
    """A checkpoint being written: an ordinary writable file (write, seek, tell) on the node's disk."""

    def __init__(self, writer, name):
        super().__init__(os.dup(writer.fileno()), "wb", closefd=True)
        self._writer = writer
        self.checkpoint_name = name
        self.saved_bytes = None

    def write(self, b):
        """Writes all of `b` (a raw file may write part of it; a full disk then raises OSError
        ENOSPC instead of leaving the rest out unnoticed)."""
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            done += super().write(view[done:])
        return done

    def close(self):
        if self.closed:
            return
        try:
            self.flush()
        except BaseException:
            self.abort()
            raise
        super().close()
        self.saved_bytes = self._writer.commit()  # fsync; durable under its name on return

    def abort(self):
        """Drops what was written (nothing is saved under the name)."""
        if not self.closed:
            super().close()
        self._writer.abort()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
            return False
        self.close()
        return False


def checkpoint(client, name):
    """A CheckpointFile for `name` ("run7/step1000/rank3.pt"); usable by torch.save."""
    return CheckpointFile(client._checkpoint_open(name), name)


def open_checkpoint(client, name):
    """Checkpoint `name` opened for reading (binary): the node's copy, else read from the upstream."""
    return io.FileIO(client._checkpoint_fd(name), "rb", closefd=True)
