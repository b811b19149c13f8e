"""The sensor failure detector's part of the pipeline: its PipelineFamily (family.py), the parts it calls and its
own stage, novelty."""
