"""The stages both families have, one generic Prefect flow each: `python -m flows.stages.<stage> <family>`
(flows/family.py)."""
