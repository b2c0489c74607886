"""ditmem.engine: the serving step loop (the runtime; the demo, replay and profile
commands around it are in ``ditmem.tools``).

    from ditmem.engine.factory import EngineConfig, build_engine
    engine = build_engine(EngineConfig(model="tiny-qwen-image", policy="slo")).start()
    ticket = engine.submit(GenerationRequest(prompt=..., request_id="r1"), priority=0)
    result = ticket.future.result()      # GenerationResult: output uint8 [H, W, 3], timing
    engine.drain()

Modules: ``loop`` (Engine: thread, submit/cancel/stats/drain), ``executor`` (one iteration:
view -> policy -> plan), ``stages`` (encode/step/decode/offload/restore with timing and NVTX),
``intake`` (the thread-safe side).
"""
