"""Sensor time series: sources, validation, unit/time splits, windows and featurisation."""
