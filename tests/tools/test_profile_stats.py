"""The start-up measurement's statistics (``ditmem.tools.profile.stable_median``,
``stable_medians``) on a fake timed function: no real timing anywhere."""

import pytest

from ditmem.tools.profile import measure, stability_note, stable_median, stable_medians


def feed(values):
    """A fake ``sample()`` returning ``values`` in order (and failing past their end)."""
    it = iter(values)
    calls = []

    def sample():
        v = next(it)
        calls.append(v)
        return v

    return sample, calls


def test_the_first_call_is_discarded_and_the_median_of_two_agreeing_passes_kept():
    # a cold first call 10x the rest; passes [1.0, 1.2, 0.9] and [1.1, 1.0, 1.05]
    sample, calls = feed([10.0, 1.0, 1.2, 0.9, 1.1, 1.0, 1.05])
    r = stable_median(sample, 3, log=lambda _m: None)
    assert len(calls) == 7
    assert r.agreed and r.passes == [1.0, 1.05]
    # median of the six kept samples: (1.0 + 1.05) / 2
    assert r.seconds == pytest.approx(1.025)


def test_passes_that_disagree_by_more_than_ten_percent_are_measured_again_and_logged():
    # pass 1 median 1.0, pass 2 median 1.5 (a slow spell: +50 %), pass 3 median 1.45:
    # passes 2 and 3 agree (1.45 vs 1.5: 3.4 %)
    logged = []
    sample, calls = feed([9.9, 1.0, 1.0, 1.0, 1.5, 1.5, 1.5, 1.45, 1.45, 1.45])
    r = stable_median(sample, 3, what="step 256x256 batch 1", log=logged.append)
    assert len(calls) == 10
    assert r.agreed and r.passes == [1.0, 1.5, 1.45]
    assert r.seconds == pytest.approx(1.475)  # median of {1.5 x3, 1.45 x3}
    assert len(logged) == 1 and "step 256x256 batch 1" in logged[0] and "again" in logged[0]
    assert "1000.0, 1500.0, 1450.0 ms" in logged[0]


def test_a_ten_percent_difference_is_still_agreement_and_eleven_is_not():
    r = stable_median(feed([0, 1.0, 1.0, 1.1, 1.1])[0], 2, log=lambda _m: None)
    assert r.agreed and len(r.passes) == 2
    r = stable_median(feed([0, 1.0, 1.0, 1.11, 1.11, 1.11, 1.11])[0], 2,
                      log=lambda _m: None)
    assert r.agreed and r.passes == [1.0, 1.11, 1.11]


def test_without_agreement_it_stops_at_max_passes_with_the_median_of_all_and_says_so():
    logged = []
    values = [5.0] + [1.0, 1.0] + [2.0, 2.0] + [4.0, 4.0] + [8.0, 8.0]
    sample, calls = feed(values)
    r = stable_median(sample, 2, max_passes=4, what="decode 256x256", log=logged.append)
    assert len(calls) == 9
    assert not r.agreed and r.passes == [1.0, 2.0, 4.0, 8.0]
    assert r.seconds == pytest.approx(3.0)  # median of 1,1,2,2,4,4,8,8
    assert len(logged) == 1 and "unstable" in logged[0] and "decode 256x256" in logged[0]


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="repeats"):
        stable_median(lambda: 1.0, 0)
    with pytest.raises(ValueError, match="max_passes"):
        stable_median(lambda: 1.0, 2, max_passes=1)


def test_interleaved_operations_keep_their_ratio_through_a_slow_spell():
    """Two operations, one twice the other, on a device that turns 30 % slower after the
    first 8 samples (a neighbour's work): measured one after the other, the second is timed
    in the slow spell and reads 2.6 x the first; measured interleaved, 2.0 x."""
    calls = {"n": 0}

    def op(seconds):
        calls["n"] += 1
        return seconds * (1.3 if calls["n"] > 8 else 1.0)

    quiet = dict(log=lambda _m: None)
    one = stable_median(lambda: op(1.0), 3, **quiet)
    two = stable_median(lambda: op(2.0), 3, **quiet)
    assert two.seconds / one.seconds == pytest.approx(2.6)

    calls["n"] = 0
    logged = []
    a, b = stable_medians(lambda: (op(1.0), op(2.0)), 3, whats=("one", "two"),
                          log=logged.append)
    assert b.seconds / a.seconds == pytest.approx(2.0)
    # passes of 3 samples (6 calls) after 1 warm-up sample (2 calls): the spell starts in
    # pass 2, pass 3 agrees with it; both operations are logged with their passes
    assert a.agreed and b.agreed and len(a.passes) == len(b.passes) == 3
    assert [m.split(":")[1].strip() for m in logged] == ["one", "two"]


def test_interleaved_passes_end_when_every_operation_agrees():
    # operation 1 agrees from pass 2; operation 2 only from pass 3: both get 3 passes, and
    # each keeps the median of its own last two
    rows = iter([(9, 9), (1.0, 5.0), (1.0, 5.0), (1.0, 8.0), (1.0, 8.0), (1.05, 8.2),
                 (1.05, 8.2)])
    a, b = stable_medians(lambda: next(rows), 2, log=lambda _m: None)
    assert a.passes == [1.0, 1.0, 1.05] and b.passes == [5.0, 8.0, 8.2]
    assert a.seconds == pytest.approx(1.025) and b.seconds == pytest.approx(8.1)
    with pytest.raises(ValueError, match="repeats"):
        stable_medians(lambda: (1.0,), 0)


class FakeGen:
    """A generator stand-in whose ops advance a fake clock: the first decode of the
    process costs 5 s (cold), later ones 1 s; a step of b requests costs b x 0.1 s."""

    def __init__(self, clock):
        self.clock = clock
        self.decodes = 0

    def state_bytes(self, r):
        return r.width * r.height

    def encode(self, r, pool):
        self.clock.t += 0.01
        return {"left": r.num_inference_steps}

    def step(self, batch):
        self.clock.t += 0.1 * len(batch)
        for s in batch:
            s["left"] -= 1

    def is_done(self, s):
        return s["left"] <= 0

    def decode(self, s):
        self.decodes += 1
        self.clock.t += 5.0 if self.decodes == 1 else 1.0

    def release(self, s):
        pass


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_measure_discards_the_cold_first_decode(monkeypatch):
    import time

    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    gen = FakeGen(clock)
    m = measure(gen, [64], [1, 2], 3, pool=None, log=lambda *_: None)
    assert m["decode_s"][64] == pytest.approx(1.0)  # not (5 + 1) / 2
    assert [p["seconds"] for p in m["steps"]] == pytest.approx([0.1, 0.2])
    assert m["encode_s"] == pytest.approx(0.01)
    assert all(c["agreed"] and len(c["passes"]) == 2 for c in m["checks"])
    assert stability_note(m["checks"]).startswith("median of two passes agreeing within 10 %")


def test_simultaneous_measurements_are_averaged_point_by_point():
    import copy

    from ditmem.tools.profile import average_profiles, build_profile

    measured = {"steps": [{"tokens": 16, "batch": 1, "seconds": 0.004},
                          {"tokens": 256, "batch": 1, "seconds": 0.010}],
                "encode_s": 0.002, "decode_s": {64: 0.01, 256: 0.16},
                "state_bytes": {64: 1000.0, 256: 16000.0}, "key": "qwen-image", "frames": 1,
                "decode_tile": (256, 224, 0.16)}
    a = build_profile(measured, model="m", name="t", pool_mb=64, max_batch=4,
                      weights_bytes=10, link=1e9)
    m2 = copy.deepcopy(measured)
    m2["steps"][0]["seconds"], m2["steps"][1]["seconds"] = 0.006, 0.014
    m2["encode_s"], m2["decode_tile"] = 0.004, (256, 224, 0.20)
    b = build_profile(m2, model="m", name="t", pool_mb=64, max_batch=4, weights_bytes=10,
                      link=1e9)
    out = average_profiles([a, b])
    sec = out["models"]["qwen-image"]
    assert [q["seconds"] for q in sec["step"]["points"]["value"]] == pytest.approx([0.005, 0.012])
    assert sec["encode_s"]["value"] == pytest.approx(0.003)
    assert sec["decode_tile_s"]["value"] == pytest.approx(0.18)
    assert "mean of 2 measurements" in sec["step"]["points"]["source"]
    assert a["models"]["qwen-image"]["encode_s"]["value"] == pytest.approx(0.002)  # untouched
    assert average_profiles([a]) == a
    with pytest.raises(ValueError, match="profiles"):
        average_profiles([])


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_a_sample_on_cuda_times_the_work_not_its_launch():
    """``torch.cuda._sleep`` returns at once and keeps the GPU busy: the wall clock alone
    would time the launch (microseconds); the sample must see the sleep."""
    import torch

    from ditmem.tools.profile import timed

    device = torch.device("cuda")
    torch.cuda.synchronize()
    spin = int(torch.cuda.get_device_properties(device).clock_rate * 1e3 * 0.05)  # ~50 ms
    assert timed(lambda: torch.cuda._sleep(spin), device) > 0.02
    torch.cuda.synchronize()


def test_a_sample_on_the_cpu_is_its_wall_time():
    import time

    import torch

    from ditmem.tools.profile import timed

    for device in (None, torch.device("cpu")):
        assert 0.02 <= timed(lambda: time.sleep(0.03), device) < 1.0


class OrderedGen(FakeGen):
    """An encode costs 0.03 s right after a step of any request and 0.01 s otherwise (the
    tiny model's encodes ran faster back to back than after a step, on this CPU)."""

    def __init__(self, clock):
        super().__init__(clock)
        self.last = None

    def encode(self, r, pool):
        self.clock.t += 0.03 if self.last == "step" else 0.01
        self.last = "encode"
        return {"left": r.num_inference_steps}

    def step(self, batch):
        super().step(batch)
        self.last = "step"

    def decode(self, s):
        super().decode(s)
        self.last = "decode"


@pytest.mark.parametrize(("order", "encode_s"), [("back-to-back", 0.01), ("after-step", 0.03)])
def test_measure_times_encodes_back_to_back_or_right_after_another_requests_step(
        monkeypatch, order, encode_s):
    import time

    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    m = measure(OrderedGen(clock), [64, 128], [1], 3, pool=None, log=lambda *_: None,
                encode_order=order)
    assert m["encode_s"] == pytest.approx(encode_s)
    assert [p["seconds"] for p in m["steps"]] == pytest.approx([0.1, 0.1])
    with pytest.raises(ValueError, match="encode_order"):
        measure(OrderedGen(clock), [64], [1], 3, pool=None, encode_order="after-decode")


def test_measure_times_a_sides_batch_sizes_together(monkeypatch):
    """A slow spell starting during a side's step measurements (from the 12th step call on,
    ×1.3) leaves the batch-2 / batch-1 ratio at the fake device's 2.0."""
    import time

    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    gen = FakeGen(clock)
    calls = {"n": 0}
    step = gen.step

    def slow_step(batch):
        calls["n"] += 1
        t0 = clock.t
        step(batch)
        if calls["n"] >= 12:
            clock.t += 0.3 * (clock.t - t0)

    gen.step = slow_step
    m = measure(gen, [64], [1, 2], 3, pool=None, log=lambda *_: None)
    one, two = (p["seconds"] for p in m["steps"])
    assert two / one == pytest.approx(2.0)

