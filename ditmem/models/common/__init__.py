"""ditmem.models.common: what the model families share (packing, open and chunked
steps, the generators' block-step base class, tiled decode, the generator protocol,
requests, dtypes, tokenizers).

Modules: ``block_steps``, ``chunked``, ``dtypes``, ``generator``, ``open_step``, ``packing``,
``cpu_vae``, ``processor_patch``, ``request``, ``tiled_decode``, ``tokenizer``, ``vae_output``.
"""
