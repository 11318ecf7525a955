"""Data: schema, synthetic Criteo-shaped generator, batch conversion, statistics."""
