"""Plan-independent checkpoints: tables in logical row space (DCP), export to one file, reshard to any world.

* :mod:`rayemb.checkpoint.layout` — a live sharded model's rows as slots;
* :mod:`rayemb.checkpoint.exchange` — slots <-> the canonical row layout (all-to-all);
* :mod:`rayemb.checkpoint.store` — save/load/verify with ``torch.distributed.checkpoint``;
* :mod:`rayemb.checkpoint.export` — ``rayemb checkpoint export`` / ``reshard``.
"""
