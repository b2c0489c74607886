"""The node engine's reply channel (one worker's pipe), without workers."""

from __future__ import annotations

import pytest


def test_a_reply_that_does_not_unpickle_fails_its_command_only():
    """The engine's reply reader: an unreadable reply fails its own command
    (CommandFailed naming the device) and the next reply still resolves its command (the
    reader used to die, leaving every later command waiting for its timeout)."""
    import multiprocessing as mp

    from ditmem.parallel import commands as cmd
    from ditmem.parallel.node import CommandFailed, _Channel

    here, there = mp.Pipe()
    lost = []
    channel = _Channel(0, here, lambda d: lost.append(d) or f"device {d} gone")
    channel.start()
    channel.pending.popleft()  # no ready message in this test
    bad = channel.send(cmd.Stats())
    good = channel.send(cmd.Stats())
    there.recv(), there.recv()
    there.send_bytes(b"not a pickle")
    there.send(cmd.Reply(0, True, value=7))
    with pytest.raises(CommandFailed, match="device 0: its reply could not be read"):
        bad.result(timeout=10)
    assert good.result(timeout=10).value == 7
    there.close()
    channel._reader.join(timeout=10)
    assert lost == [0]
