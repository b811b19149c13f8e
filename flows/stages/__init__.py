"""The stages both families have, one generic Prefect flow each: `python -m flows.stages.<stage> <family>`
(flows/family.py).

Run that way (Python sets `sys.argv[0]` to "-m" while it imports the package), a stage ends with what started it
from its first moment: its imports (PyTorch, Prefect, MLflow) take seconds, and a pipeline killed meanwhile must not
leave it to run the stage on its own (flows/termination.py guards the rest of its life)."""

import sys

from contract.lifetime import die_with_parent

if sys.argv[:1] == ["-m"]:
    die_with_parent()
