"""A move on the node engine involves only its source and destination devices: on 4 CPU
workers (gloo; oversubscribed on a 2-core machine, which this test tolerates), a
re-shard from device 1 to device 2 while device 3 runs a long step does not wait for that
step; the session-5 way (a collective over the cover group, all 4 devices) does."""

from __future__ import annotations

import pytest

from ditmem.models.common.request import GenerationRequest
from ditmem.parallel import commands as cmd
from ditmem.parallel.node import NodeEngine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _request(rid: str, side: int, seed: int, steps: int) -> GenerationRequest:
    return GenerationRequest("a red cat on a mat", width=side, height=side,
                             num_inference_steps=steps, negative_prompt="blurry",
                             guidance_scale=4.0, seed=seed, request_id=rid)


def _move_behind(node, over_cover: bool):
    """(move timing, the busy step's seconds, whether the step was still running when the
    move returned) for m moved 1 -> 2 (and back after) while device 3 steps ``busy``."""
    stepping = node.submit({3: cmd.Step(["busy"], (3,))})
    timing = node.move("m", (2,), over_cover=over_cover)
    still_running = not stepping[3].done()
    step_s = stepping[3].result(timeout=300).seconds
    node.move("m", (1,))
    return timing, step_s, still_running


POOL_PAGES = 512


@pytest.fixture(scope="module")
def node():
    with NodeEngine("tiny-qwen-image", num_devices=4, pool_pages=POOL_PAGES,
                    page_bytes=1 << 14, host_pages=64, start_timeout_s=300,
                    command_timeout_s=300) as node:
        yield node


def test_a_move_does_not_wait_for_an_uninvolved_devices_step(node):
    assert node.encode(_request("m", 64, 1, 4), 1)
    assert node.encode(_request("busy", 384, 2, 20), 3)
    node.move("m", (2,))  # warm both paths once
    node.move("m", (1,), over_cover=True)
    p2p, p2p_step, p2p_early = _move_behind(node, over_cover=False)
    cover, cover_step, _ = _move_behind(node, over_cover=True)
    assert node.holders["m"] == (1,)
    node.release("m")
    node.release("busy")
    assert {d: s.device_pages for d, s in node.stats().items()} == dict.fromkeys(range(4), 0)
    assert p2p_early, "the point-to-point move returned only after device 3's step"
    assert p2p.wait_s < 0.3 * p2p_step, (p2p.wait_s, p2p_step)
    assert p2p.wall_s < 0.5 * p2p_step, (p2p.wall_s, p2p_step)
    assert set(p2p.queued_s) == {1, 2}            # only the devices it involves
    assert set(cover.queued_s) == {0, 1, 2, 3}
    assert cover.wait_s >= 0.8 * cover_step > 0    # the baseline waits for device 3


def _fill(node, device: int) -> list[str]:
    """Encode requests on ``device`` until its pool has no room for the smallest one."""
    names = []
    for side in (384, 128, 32):
        while len(names) < 400:
            rid = f"fill-{len(names)}"
            if not node.encode(GenerationRequest("a", width=side, height=side,
                                                 num_inference_steps=1, seed=1,
                                                 request_id=rid), device):
                break
            names.append(rid)
    return names


def test_a_failed_move_leaves_no_part_behind(node):
    """1 -> (2, 3) with device 3's pool full: device 3 cannot take its part (the move
    fails naming it) while device 2 took its own; releasing the request frees every
    device's pages (device 2's part used to stay: the engine released only the old
    holders)."""
    from ditmem.parallel.node import CommandFailed

    m = _request("m", 128, 1, 4)
    assert node.encode(m, 1)
    node.move("m", (2, 3))
    part = {d: s.device_pages for d, s in node.stats().items()}[3]  # its degree-2 part
    node.move("m", (1,))
    fillers = _fill(node, 3)
    try:
        free = {d: POOL_PAGES - s.device_pages for d, s in node.stats().items()}
        assert free[3] < part <= free[2], (free, part)
        with pytest.raises(CommandFailed, match="device 3: MemoryError"):
            node.move("m", (2, 3))
        stats = node.stats()
        assert "m" in stats[2].held and "m" not in stats[3].held  # the case under test
    finally:
        for rid in ["m", *fillers]:
            node.release(rid)
    assert {d: (s.device_pages, s.held) for d, s in node.stats().items()} == dict.fromkeys(
        range(4), (0, []))
