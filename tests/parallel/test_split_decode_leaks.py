"""A split decode's shared-memory segments on its error paths, without workers: a stand-in
``NodeEngine`` whose devices answer ``DecodeTiles`` with real segments, one of them lost
mid-command; and a worker whose second tile fails after the first was shared. No segment
may outlive the failure (a tile segment of a device that did answer is the engine's)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from multiprocessing import shared_memory

import numpy as np
import pytest
import torch

from ditmem.parallel import commands as cmd
from ditmem.parallel.node import DeviceLost, NodeEngine
from ditmem.parallel.worker import DeviceWorker, _share_image, to_shared


def _exists(name: str) -> bool:
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return False
    segment.close()
    return True


def _stand_in(lost: int) -> tuple[NodeEngine, list[str], list[tuple]]:
    """Three devices; request "r" held on device 0 with 3 tiles; device ``lost`` dies
    while decoding its tile, the others answer (device 1 and 2 with one segment each).
    Also returned: each command as (device, kind, tile indices or blended tiles)."""
    node = object.__new__(NodeEngine)
    node._lock = threading.Lock()
    node.failed, node.dead, node.holders = {}, {}, {"r": (0,)}
    node.num_devices, node.command_timeout_s = 3, 5.0
    made: list[str] = []
    seen: list[tuple] = []

    def call(commands):
        (device, command), = commands.items()
        if isinstance(command, cmd.DecodeTiles):  # one tile a command, as ``submit``
            seen.append((device, "tiles", tuple(command.indices)))
            return {device: submit(commands)[device].result()}
        if isinstance(command, cmd.BlendTiles):
            seen.append((device, "blend", tuple(sorted(command.tiles))))
            return {device: cmd.Reply(device, True, _share_image(np.zeros((2, 2, 3),
                                                                          np.uint8)))}
        assert isinstance(command, cmd.ShareLatent)
        ref = to_shared(torch.zeros(4))
        made.append(ref.name)
        return {device: cmd.Reply(device, True, (ref, 3))}

    def submit(commands):
        futures = {}
        for device, command in commands.items():
            f: Future = Future()
            if device == lost:
                f.set_exception(DeviceLost(f"device {device} died"))
            elif command.latent is None:
                f.set_result(cmd.Reply(device, True, []))
            else:
                refs = [to_shared(torch.ones(2)) for _ in command.indices]
                made.extend(r.name for r in refs)
                f.set_result(cmd.Reply(device, True, refs))
            futures[device] = f
        return futures

    node._call, node.submit = call, submit
    return node, made, seen


@pytest.mark.parametrize("lost", [1, 2])
def test_a_spare_lost_in_a_split_hands_its_tiles_to_the_holder(lost):
    """A spare device dies in its tile: the request is held on device 0, alive, so the
    decode goes on — that tile runs on the holder, which blends the other spare's tile
    with its own; the lost device is not handed back as free (``on_tiles``); no segment
    is left (the latent's, the surviving spare's tile: both unlinked)."""
    node, made, seen = _stand_in(lost)
    other = 3 - lost
    freed = []
    image = node.decode_split("r", (0, 1, 2), (64, 48), freed.append)
    assert image.shape == (2, 2, 3)
    assert (0, "tiles", (lost,)) in seen and (lost, "tiles", (lost,)) in seen
    assert seen[-1] == (0, "blend", (other,))
    assert freed == [(other,)]
    assert len(made) == 2  # the latent and the surviving device's tile
    assert not [n for n in made if _exists(n)]


def test_a_lost_holder_fails_the_split_and_leaves_no_segment():
    """The holder itself (device 0) dies in its tiles: the decode raises ``DeviceLost``
    once the spares have stopped; their tiles' segments and the latent's are unlinked."""
    node, made, _ = _stand_in(0)
    with pytest.raises(DeviceLost):
        node.decode_split("r", (0, 1, 2), (64, 48))
    assert len(made) == 3  # the latent and both spares' tiles
    assert not [n for n in made if _exists(n)]


def test_a_worker_whose_second_tile_fails_unlinks_the_first():
    """``DecodeTiles`` from a shared latent: tile 0 decodes and is shared, tile 1 raises;
    the command fails and tile 0's segment is gone (nobody else learns its name)."""
    made: list[str] = []

    class Job:
        def __init__(self, *args, **kwargs):
            pass

        def decode_tile(self, k):
            if k == 1:
                raise RuntimeError("tile 1 out of memory")
            return torch.ones(2)

    import ditmem.models.common.tiled_decode as tiled
    import ditmem.parallel.worker as worker

    worker_self = object.__new__(DeviceWorker)
    worker_self.gen = object()
    worker_self.pool = type("Pool", (), {"device": torch.device("cpu")})()
    latent = to_shared(torch.zeros(4))
    real_to_shared = worker.to_shared

    def spy(tensor):
        ref = real_to_shared(tensor)
        made.append(ref.name)
        return ref

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(tiled, "QwenDecodeJob", Job)
        mp.setattr(tiled, "supports_tiled_decode", lambda gen: True)
        mp.setattr(worker, "to_shared", spy)
        with pytest.raises(RuntimeError, match="tile 1"):
            worker_self._decodetiles(cmd.DecodeTiles("r", (64, 48), [0, 1], latent))
    finally:
        mp.undo()
        worker.unlink_shared(latent.name)
    assert len(made) == 1
    assert not _exists(made[0])
