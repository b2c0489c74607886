"""Timing the decode tile beside the other replay processes' steps (``decode_beside``)."""

from __future__ import annotations

import copy
import threading
import time

import pytest

from ditmem.tools.decode_beside import StepBackground, rescale_decodes, time_in_turns


def _turns(processes: int, sample_s: list[float]):
    """Run ``time_in_turns`` in ``processes`` threads; a sample reads 2.0 when another
    thread ran its background during it and 1.0 when none did (plus ``sample_s[i]``)."""
    barrier = threading.Barrier(processes)
    done = [threading.Event() for _ in range(processes)]
    background_calls = [0] * processes
    results: dict[int, float] = {}

    def run(i: int) -> None:
        def sample() -> float:
            before = sum(background_calls) - background_calls[i]
            time.sleep(0.003)
            others = sum(background_calls) - background_calls[i]
            return sample_s[i] + (2.0 if others > before else 1.0)

        def background() -> None:
            background_calls[i] += 1
            time.sleep(0.0002)

        results[i] = time_in_turns(i, processes, barrier, done, sample, background, 3)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "time_in_turns hung"
    return results, background_calls


@pytest.mark.parametrize("processes", [2, 3])
def test_each_process_times_while_the_others_run_their_background(processes):
    results, calls = _turns(processes, [0.0, 10.0, 20.0][:processes])
    # every sample of every turn saw another process's background run: 2.0, never 1.0
    assert results == {i: [2.0, 12.0, 22.0][i] for i in range(processes)}
    assert all(c > 0 for c in calls)  # each process ran background in the others' turns


def test_one_process_times_alone():
    results, calls = _turns(1, [0.0])
    assert results == {0: 1.0} and calls == [0]


def test_bad_index_or_events_are_value_errors():
    barrier, done = threading.Barrier(2), [threading.Event(), threading.Event()]
    with pytest.raises(ValueError, match="index"):
        time_in_turns(2, 2, barrier, done, lambda: 1.0, lambda: None, 3)
    with pytest.raises(ValueError, match="done"):
        time_in_turns(0, 2, barrier, done[:1], lambda: 1.0, lambda: None, 3)


def _section(tile_s: float | None, per_mp: float):
    out = {"decode_s_per_megapixel": {"value": per_mp, "source": "slope"}}
    if tile_s is not None:
        out["decode_tile_s"] = {"value": tile_s, "source": "tile"}
    return out


def test_rescale_scales_both_decode_figures_by_the_retimed_tile():
    profile = {"models": {"qwen-image": _section(0.050, 0.80),
                          "wan": _section(None, 2.0)}}
    before = copy.deepcopy(profile)
    out = rescale_decodes(profile, 0.035, "beside steps")
    q = out["models"]["qwen-image"]
    assert q["decode_tile_s"]["value"] == pytest.approx(0.035)
    assert q["decode_s_per_megapixel"]["value"] == pytest.approx(0.80 * 0.7)
    assert "x0.70 as timed beside steps" in q["decode_tile_s"]["source"]
    assert out["models"]["wan"] == before["models"]["wan"]  # no tile geometry: as it was
    assert profile == before  # a copy
    with pytest.raises(ValueError, match="tile_s"):
        rescale_decodes(profile, 0.0, "x")


class _Gen:
    """Counts encodes, steps and releases; a request is done after its steps."""

    def __init__(self):
        self.encoded, self.released, self.steps = [], [], 0

    def encode(self, request, pool):
        state = {"id": request.request_id, "left": 2}
        self.encoded.append(state["id"])
        return state

    def step(self, states):
        self.steps += 1
        for s in states:
            s["left"] -= 1

    def is_done(self, state):
        return state["left"] <= 0

    def release(self, state):
        self.released.append(state["id"])


def test_step_background_encodes_again_when_its_request_runs_out_and_releases():
    gen = _Gen()
    background = StepBackground(gen, pool=None, side=64)
    for _ in range(5):
        background()
    assert gen.steps == 5
    assert len(gen.encoded) == 3 and len(set(gen.encoded)) == 3  # 2 steps each
    background.release()
    assert sorted(gen.released) == sorted(gen.encoded)


def test_demo_retimes_the_real_tile_beside_real_steps():
    """Two replay 'processes' (threads) on the tiny Qwen-Image: each profile's decode
    figures come from its own turn, timed while the other stepped the middle side."""
    import argparse

    from ditmem import models
    from ditmem.tools.demo import retime_decodes

    gen = models.load("tiny-qwen-image")
    args = argparse.Namespace(workload="seed-mix", divisor=8, decode_tile=(64, 48),
                              pool_mb=32, page_kb=64)
    profile = {"models": {"qwen-image": _section(1.0, 100.0)}}
    barrier, done = threading.Barrier(2), [threading.Event(), threading.Event()]
    out: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(
        i, retime_decodes(profile, gen, args, i, barrier, done))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "retime_decodes hung"
    for i in range(2):
        q = out[i]["models"]["qwen-image"]
        assert 0 < q["decode_tile_s"]["value"] < 1.0  # a 64² decode: milliseconds
        assert q["decode_s_per_megapixel"]["value"] == pytest.approx(
            100.0 * q["decode_tile_s"]["value"])
        assert "128x128 steps" in q["decode_tile_s"]["source"]
    single = retime_decodes(profile, gen, args, 0, barrier, done[:1])
    assert single == profile  # one process: nothing beside it to time against


def test_a_slow_round_does_not_move_the_median_of_the_rounds():
    """Process 0's second round reads 9 s a sample (a slow spell), its others 1 s: with a
    warm-up and two agreeing passes of 3 a round is 7 samples, so calls 7-13 are slow."""
    barrier = threading.Barrier(2)
    done = [threading.Event(), threading.Event()]
    calls = [0]
    results: dict[int, float] = {}

    def sample0() -> float:
        calls[0] += 1
        return 9.0 if 8 <= calls[0] <= 14 else 1.0

    def run(i: int) -> None:
        sample = sample0 if i == 0 else (lambda: 2.0)
        results[i] = time_in_turns(i, 2, barrier, done, sample, lambda: time.sleep(1e-4), 3)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "time_in_turns hung"
    assert calls[0] == 21  # three rounds of seven samples
    assert results == {0: 1.0, 1: 2.0}
    assert not any(e.is_set() for e in done)  # ready for another measurement
