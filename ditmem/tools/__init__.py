"""ditmem.tools: the commands around the runtime: the in-process demo and replay,
device profiling, plots, reports and the HTTP bench client (``ditmem demo``,
``ditmem profile``, ``ditmem bench``).

Modules: ``bench``, ``demo``, ``demo_runs``, ``node_demo``, ``plots``, ``profile``,
``profile_devices``, ``replay``, ``report``.
"""
