"""Embedding modules: hybrid hot/cold embedding, CPU-capable sharders, collective byte accounting."""
