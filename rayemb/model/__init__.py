"""Models: a DLRM whose sparse arch is any module returning a KeyedTensor."""
