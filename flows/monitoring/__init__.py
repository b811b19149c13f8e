"""The `monitor` flow and what it needs: reading the prediction store, reports, recalibration."""
