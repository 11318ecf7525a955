"""Shipped models, built on the public model contract only (``rayemb.Embeddings``), as a user's model is:
``dlrm`` (:mod:`.dlrm`) and ``dcn_v2`` (:mod:`.dcn_v2`). ``model.name`` selects one."""
