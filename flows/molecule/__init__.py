"""The molecular property model's part of the pipeline: its PipelineFamily (family.py) and the parts it calls."""
