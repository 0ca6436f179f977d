"""Errors of the Ray backend (imported without Ray)."""


class WorkerError(RuntimeError):
    """A worker of a model's group died, could not be placed or started, or failed in a way the driver cannot
    re-raise as it was; the message names the model and the rank."""


class WorkerDied(WorkerError):
    """A worker process of a model's group is gone (killed, crashed, out of memory)."""


class RayStartError(RuntimeError):
    """Ray could not be started or reached."""


class StorageError(RuntimeError):
    """The run directory is not one every node of the cluster reads and writes; the message names the node."""
