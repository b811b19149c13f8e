"""Data layer: sources, validation, splits, windows and featurisation (numpy/RDKit, no torch)."""
