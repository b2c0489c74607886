"""ditmem.models.common: what the model families share (packing, open and chunked
steps, tiled decode, the generator protocol, requests, dtypes, tokenizers).

Modules: ``chunked``, ``dtypes``, ``generator``, ``open_step``, ``packing``,
``cpu_vae``, ``processor_patch``, ``request``, ``tiled_decode``, ``tokenizer``, ``vae_output``.
"""
