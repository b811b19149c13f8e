"""Molecules: sources, RDKit standardisation, scaffold/random/column splits and featurisation."""
