"""Exceptions of ditmem.memory.

Running out of *device* pages is not an error: ``PagePool.allocate`` returns ``None`` and the
caller (the scheduler) decides who yields. Everything here is a hard error: a host pool that
is full, a tensor used after ``free``, a page freed twice, a transfer handle misused.
Shape and dtype mistakes raise ``ValueError`` naming the argument.
"""

from __future__ import annotations


class MemoryManagerError(RuntimeError):
    """Base class of the errors raised by ditmem.memory."""


class HostPoolExhausted(MemoryManagerError):
    """The host pool has fewer free pages than a transfer needs (a hard limit)."""


class DoubleFreeError(MemoryManagerError):
    """A page (or a tensor) was freed more often than it was allocated."""


class TensorFreedError(MemoryManagerError):
    """A ``PagedTensor`` was used after ``free()``."""


class TensorStateError(MemoryManagerError):
    """The operation does not fit the tensor's state (on host, in flight, ...)."""


class TransferError(MemoryManagerError):
    """A transfer handle was finished twice, cancelled after finishing, or is foreign."""
