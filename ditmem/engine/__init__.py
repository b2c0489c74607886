"""ditmem.engine: the serving step loop and the tools around it.

    from ditmem.engine.factory import EngineConfig, build_engine
    engine = build_engine(EngineConfig(model="tiny-qwen-image", policy="slo")).start()
    ticket = engine.submit(GenerationRequest(prompt=..., request_id="r1"), priority=0)
    result = ticket.future.result()      # GenerationResult: output uint8 [H, W, 3], timing
    engine.drain()

Modules: ``loop`` (Engine: thread, submit/cancel/stats/drain), ``executor`` (one iteration:
view -> policy -> plan), ``stages`` (encode/step/decode/offload/restore with timing and NVTX),
``intake`` (the thread-safe side), ``replay``/``demo``/``profile`` (in-process runs).
"""
