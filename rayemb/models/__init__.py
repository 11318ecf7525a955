"""Shipped models, built on the public model contract only (``rayemb.Embeddings``), as a user's model is:
``dlrm`` (:mod:`.dlrm`), ``dcn_v2`` (:mod:`.dcn_v2`) and ``two_tower`` (:mod:`.two_tower`, retrieval). ``model.name`` selects one."""
