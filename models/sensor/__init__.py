"""Sensor failure detector: encoder, heads and the self-supervised objective."""
