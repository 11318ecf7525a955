"""The model contract: the embedding modules a model factory receives (:mod:`.contract`), how a job names
its factory (:mod:`.factory`), and the job's tables (:mod:`.tables`). Shipped models are :mod:`rayemb.models`."""
