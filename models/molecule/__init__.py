"""Molecular property model: graph encoder, heads and the masked-atom objective."""
