"""Molecular property model: graph (GINE) and SMILES (transformer) encoders, cross-attention, gated fusion, pretraining objectives."""
