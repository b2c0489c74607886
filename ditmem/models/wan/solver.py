"""Per-request UniPC solver state for Wan, kept in a ``RequestState``.

diffusers' ``UniPCMultistepScheduler`` is stateful: besides its schedule (``timesteps``,
``sigmas``, fixed by ``set_timesteps``) it carries a history that one request's steps
build up — ``model_outputs`` (the last ``solver_order`` converted model outputs),
``last_sample`` (the predictor's input, for the next corrector), ``lower_order_nums``,
``this_order`` and the step index. Many requests cannot share one such object, so each
request's history lives in its state:

* tensors ``solver.model_outputs.<k>`` (k < solver_order) and ``solver.last_sample``,
  shaped like the latents and allocated (zeros) when the request is encoded, so that a
  step never allocates;
* scalars ``step``, ``solver.valid`` (which history slots hold data),
  ``solver.timestep_index`` (schedule index per slot), ``solver.lower_order_nums``,
  ``solver.this_order``, ``solver.has_last``.

:func:`unipc_step` loads that history into a shallow copy of a scheduler configured for the
request's step count (``SolverSchedules``), runs the stock ``step`` and stores the history
back, so the update is diffusers' own arithmetic, bit for bit.
"""

from __future__ import annotations

import copy

import torch

from ditmem.memory import RequestState


class SolverSchedules:
    """Schedulers configured by ``set_timesteps(n)`` for each step count ``n`` met so far,
    copied from ``scheduler`` (a ``UniPCMultistepScheduler``); never stepped themselves."""

    def __init__(self, scheduler, device) -> None:
        self._config = scheduler.config
        self._cls = type(scheduler)
        self._device = device
        self._by_steps: dict[int, object] = {}

    def get(self, num_steps: int):
        """The configured scheduler for ``num_steps`` (built once)."""
        if num_steps not in self._by_steps:
            sched = self._cls.from_config(self._config)
            sched.set_timesteps(num_steps, device=self._device)
            self._by_steps[num_steps] = sched
        return self._by_steps[num_steps]

    def timesteps(self, num_steps: int) -> torch.Tensor:
        """The schedule's timesteps (what the pipeline iterates over)."""
        return self.get(num_steps).timesteps


def solver_order(scheduler) -> int:
    """History slots the scheduler keeps (its ``solver_order``)."""
    return int(scheduler.config.solver_order)


def init_solver(state: RequestState, scheduler, latents: torch.Tensor) -> bool:
    """Reserve the history tensors (zeros like ``latents``) and set the scalars of a fresh
    solver; ``False`` when the pool has no room (the caller frees the state)."""
    zeros = torch.zeros_like(latents)
    order = solver_order(scheduler)
    for k in range(order):
        if state.put(f"solver.model_outputs.{k}", zeros) is None:
            return False
    if state.put("solver.last_sample", zeros) is None:
        return False
    state.scalars.update({
        "step": 0,
        "solver.valid": [False] * order,
        "solver.timestep_index": [None] * order,
        "solver.lower_order_nums": 0,
        "solver.this_order": None,
        "solver.has_last": False,
    })
    return True


def unipc_step(scheduler, state: RequestState, model_output: torch.Tensor,
               sample: torch.Tensor) -> torch.Tensor:
    """One UniPC step of the request owning ``state``: loads its history into a copy of
    ``scheduler`` (configured for its step count), runs ``scheduler.step`` and stores the
    updated history. model_output/sample: ``[1, C, F, H, W]``; returns the next latents."""
    sc = state.scalars
    order = solver_order(scheduler)
    s = copy.copy(scheduler)
    s.model_outputs = [state.get(f"solver.model_outputs.{k}") if sc["solver.valid"][k] else None
                       for k in range(order)]
    s.timestep_list = [None if i is None else scheduler.timesteps[i]
                       for i in sc["solver.timestep_index"]]
    s.lower_order_nums = sc["solver.lower_order_nums"]
    s.this_order = sc["solver.this_order"]
    s.last_sample = state.get("solver.last_sample") if sc["solver.has_last"] else None
    s._begin_index = 0
    s._step_index = sc["step"]
    step = sc["step"]
    prev = s.step(model_output, scheduler.timesteps[step], sample, return_dict=False)[0]
    for k, m in enumerate(s.model_outputs):
        if m is not None:
            _store(state, f"solver.model_outputs.{k}", m)
    sc["solver.valid"] = [m is not None for m in s.model_outputs]
    sc["solver.timestep_index"] = sc["solver.timestep_index"][1:] + [step]
    sc["solver.lower_order_nums"] = s.lower_order_nums
    sc["solver.this_order"] = s.this_order
    if s.last_sample is not None:
        _store(state, "solver.last_sample", s.last_sample)
        sc["solver.has_last"] = True
    sc["step"] = step + 1
    return prev


def _store(state: RequestState, name: str, value: torch.Tensor) -> None:
    """Overwrite a reserved history tensor in place (same shape and dtype: never allocates)."""
    old = state.paged(name)
    if value.dtype != old.dtype or value.numel() != old.rows:
        raise RuntimeError(f"{name}: solver history must keep dtype {old.dtype} and "
                           f"{old.rows} elements, got {value.dtype} {tuple(value.shape)}")
    if state.put(name, value) is not old:
        raise RuntimeError(f"{name}: the reserved history tensor was not overwritten in place")
