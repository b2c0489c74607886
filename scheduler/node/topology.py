"""A node of D devices and its aligned power-of-two device groups, created once.

Group ``(degree d, index k)`` holds devices ``k·d … k·d + d − 1``; for D = 8 that is 8
singles, 4 pairs, 2 quads and 1 octet (15 groups). A set of free devices is a bit mask
(bit i = device i), so "is this group free" is one AND.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .speedup import Links


@dataclass(frozen=True, slots=True)
class Group:
    """An aligned group of ``degree`` devices starting at device ``index · degree``."""

    degree: int
    index: int
    first: int = field(init=False, compare=False, repr=False)
    devices: range = field(init=False, compare=False, repr=False)
    mask: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        first = self.index * self.degree
        object.__setattr__(self, "first", first)
        object.__setattr__(self, "devices", range(first, first + self.degree))
        object.__setattr__(self, "mask", ((1 << self.degree) - 1) << first)

    def __str__(self) -> str:
        last = self.first + self.degree - 1
        return f"{self.first}" if self.degree == 1 else f"{self.first}-{last}"


class Node:
    """``devices`` devices (≥ 1) with the given links; every aligned group built once."""

    def __init__(self, devices: int, links: Links | None = None):
        if not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be an int >= 1, got {devices!r}")
        self.devices = devices
        self.links = links
        self.degrees: tuple[int, ...] = tuple(
            1 << k for k in range(devices.bit_length()) if 1 << k <= devices
        )
        self._groups = {d: tuple(Group(d, k) for k in range(devices // d)) for d in self.degrees}
        self.all_mask = (1 << devices) - 1
        self._parents: dict[Group, Group] = {}
        for d in self.degrees[1:]:
            for g in self._groups[d]:
                for child in self._groups[d // 2][2 * g.index : 2 * g.index + 2]:
                    self._parents[child] = g

    @property
    def max_degree(self) -> int:
        return self.degrees[-1]

    def groups(self, degree: int | None = None) -> tuple[Group, ...]:
        """Groups of ``degree`` (all groups, smallest first, when None)."""
        if degree is None:
            return tuple(g for d in self.degrees for g in self._groups[d])
        if degree not in self._groups:
            raise ValueError(
                f"degree {degree} is not a power of two <= {self.devices} devices "
                f"(choose from {', '.join(map(str, self.degrees))})"
            )
        return self._groups[degree]

    def group_of(self, device: int, degree: int) -> Group:
        """The group of ``degree`` that contains ``device``."""
        return self.groups(degree)[device // degree]

    def parent(self, group: Group) -> Group | None:
        """The group of twice the degree containing ``group`` (None at the top)."""
        return self._parents.get(group)

    def free_groups(self, free_mask: int, degree: int) -> list[Group]:
        """Groups of ``degree`` whose devices are all in ``free_mask``."""
        return [g for g in self.groups(degree) if g.mask & free_mask == g.mask]

    @staticmethod
    def count(mask: int) -> int:
        return mask.bit_count()
