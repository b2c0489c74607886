"""Swapping a diffusers model's attention processors for ditmem's and back: the part of
patching that the Qwen-Image and Wan adapters share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class ProcessorPatch:
    """Base of the model adapters. ``_install`` records the model's original processors
    and sets ditmem's; :meth:`unpatch` / :meth:`repatch` swap between the two exact sets of
    processor objects. Attributes: ``model`` (set by the subclass before ``_install``),
    ``patched`` (True while ditmem's processors are installed)."""

    def _install(self, original: dict, ours: dict) -> None:
        """original / ours: processor name -> processor object, same names."""
        self._original = original
        self._ours = ours
        self.model.set_attn_processor(dict(ours))
        self.patched = True

    def unpatch(self) -> None:
        """Put back the exact processor objects the model had before patching (idempotent)."""
        if self.patched:
            self.model.set_attn_processor(dict(self._original))
            self.patched = False

    def repatch(self) -> None:
        """Install ditmem's processors again after :meth:`unpatch` (idempotent)."""
        if not self.patched:
            self.model.set_attn_processor(dict(self._ours))
            self.patched = True


@contextmanager
def original_processors(adapters: Iterable[ProcessorPatch]) -> Iterator[None]:
    """Inside the ``with`` block every adapter's model runs its original processors (the
    stock model, for reference runs); ditmem's are installed again on exit, also on error."""
    adapters = list(adapters)
    for a in adapters:
        a.unpatch()
    try:
        yield
    finally:
        for a in adapters:
            a.repatch()
