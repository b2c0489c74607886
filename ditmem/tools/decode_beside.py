"""Timing the decode beside another process's steps: the contention a replay meets.

``ditmem demo`` (one device) replays each policy in its own process, one per core, and
each measures the profile first, all at once. Both then time their decodes at the same
moments, so the profile's decode is one decode beside another — the slowest neighbour
there is: a decode moves more memory than a step. In the run a decode's neighbour is mostly
a step (decodes are about a fifth of the work), and session 15 read the decodes at
x0.70-0.72 of the profile in both processes, which put the trace at load 0.73 for the
requested 0.8 (docs/results/profile.md, session 15).

So after the profile, the processes take turns (:func:`time_in_turns`): in turn k process k
times the decode tile while every other process runs steps of the middle side until it is
done; then each process's decode figures are scaled by what its turn measured
(:func:`rescale_decodes`), before the profiles are averaged.
"""

from __future__ import annotations

import copy


def time_in_turns(index: int, processes: int, barrier, done: list, timed_sample, background,
                  repeats: int, *, rounds: int = 3, what: str = "") -> float:
    """Seconds of ``timed_sample`` as measured by process ``index`` of ``processes`` while
    the others run ``background()`` over and over.

    Every process calls this at once with the same ``barrier`` (a reusable one for all
    ``processes``: ``multiprocessing`` or ``threading``) and ``done`` (one Event per
    process). Turn k: process k takes a :func:`~ditmem.tools.profile.stable_median` of
    ``timed_sample()`` (which returns the seconds of the part that counts), then sets
    ``done[k]``; the others call ``background()`` until ``done[k]`` is set. The turns go
    round ``rounds`` times and the result is the median of this process's rounds, so a
    slow spell of a second or two on a shared machine moves one round, not the answer
    (session 16: one turn read the tile x1.8 the other runs' and the run's). ``what``
    names the measurement in the profile's log lines."""
    import statistics

    from ditmem.tools.profile import stable_median

    if not 0 <= index < processes:
        raise ValueError(f"index: expected 0 <= index < {processes}, got {index}")
    if len(done) != processes:
        raise ValueError(f"done: expected {processes} events, got {len(done)}")
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    mine: list[float] = []
    for _ in range(rounds):
        for turn in range(processes):
            barrier.wait()
            last = (turn - 1) % processes
            if index == last:  # everyone has left turn ``last``'s loop: ready it again
                done[last].clear()
            if turn == index:
                try:
                    mine.append(stable_median(timed_sample, repeats, what=what).seconds)
                finally:
                    done[turn].set()
            else:
                while not done[turn].is_set():
                    background()
    barrier.wait()
    done[index].clear()
    return statistics.median(mine)


def rescale_decodes(profile: dict, tile_s: float, how: str) -> dict:
    """A copy of ``profile`` whose decode figures (each model's ``decode_tile_s`` and
    ``decode_s_per_megapixel``) are scaled by ``tile_s`` ÷ its ``decode_tile_s``: the tile
    as timed again under other conditions (``how``, added to each source). A model without
    a tile geometry is left as it is."""
    if not tile_s > 0:
        raise ValueError(f"tile_s: expected seconds > 0, got {tile_s!r}")
    out = copy.deepcopy(profile)
    for section in out["models"].values():
        old = section.get("decode_tile_s")
        if old is None:
            continue
        factor = tile_s / float(old["value"])
        for field in ("decode_tile_s", "decode_s_per_megapixel"):
            section[field]["value"] = float(section[field]["value"]) * factor
            section[field]["source"] += (f"; x{factor:.2f} as timed {how} "
                                         f"(tile {1000 * tile_s:.1f} ms)")
    return out


def decode_sample(gen, pool, side: int, *, frames: int = 1, counter=None):
    """A ``timed_sample`` (for :func:`time_in_turns` and the profile's ``measure``): each
    call encodes a 2-step ``side``² request (numbered from ``counter``, an iterator of
    ints; a fresh count by default), runs its steps, and returns the seconds of its decode
    alone, as a run meets it: right after the request's last step."""
    from ditmem.tools.profile import profile_request, timed

    counter = iter(range(10**9)) if counter is None else counter
    device = getattr(gen, "device", None)

    def sample() -> float:
        state = gen.encode(profile_request(side, next(counter), 2, frames), pool)
        while not gen.is_done(state):
            gen.step([state])
        dt = timed(lambda: gen.decode(state), device)
        gen.release(state)
        return dt

    return sample


class StepBackground:
    """A ``background`` for :func:`time_in_turns`: each call runs one step of a ``side``²
    request (encoded on the first call, again whenever its steps run out); ``release()``
    frees it after."""

    def __init__(self, gen, pool, side: int, *, frames: int = 1):
        self.gen, self.pool, self.side, self.frames = gen, pool, side, frames
        self.state = None
        self.count = 0

    def __call__(self) -> None:
        from ditmem.tools.profile import profile_request

        if self.state is not None and self.gen.is_done(self.state):
            self.release()
        if self.state is None:
            self.count += 1
            self.state = self.gen.encode(
                profile_request(self.side, 10**6 + self.count, 1000, self.frames), self.pool)
        self.gen.step([self.state])

    def release(self) -> None:
        if self.state is not None:
            self.gen.release(self.state)
            self.state = None
