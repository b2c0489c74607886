"""ditmem.parallel: running packed steps on several devices.

* :mod:`~ditmem.parallel.shards` — which token rows of a request each rank holds;
* :mod:`~ditmem.parallel.exchange` — the Ulysses all-to-alls around attention;
* :mod:`~ditmem.parallel.qwen_sp`, :mod:`~ditmem.parallel.wan_sp` — the sequence-parallel
  packed step of each model family (the adapters' own blocks, a head exchange attached to
  the packed layout).
"""
