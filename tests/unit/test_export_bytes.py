"""The same model exports to the same ONNX bytes wherever its source code lies."""

from __future__ import annotations

import importlib.util
import textwrap

import onnx
import torch

from models.export import export_onnx

MODULE = textwrap.dedent('''
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, *inputs):  # as the deployable ensembles take their inputs
            return torch.sigmoid(self.linear(inputs[0]))
''')


def export_from(folder, name: str) -> bytes:
    """Write the module under `folder`, build its model with seed 0 and export it; the ONNX file's bytes."""
    folder.mkdir(parents=True)
    source = folder / "probe_net.py"
    source.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("probe_net", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    path = export_onnx(module.Net(), {"x": torch.zeros(3, 4)}, {"x": {0: "batch"}}, ["y"], folder / name)
    return path.read_bytes()


def test_export_names_no_source_file(tmp_path):
    first = export_from(tmp_path / "checkout", "model.onnx")
    second = export_from(tmp_path / "elsewhere" / "clone", "model.onnx")
    assert first == second
    assert str(tmp_path).encode() not in first
    node = onnx.load_from_string(first).graph.node[0]
    assert "pkg.torch.onnx.stack_trace" not in {prop.key for prop in node.metadata_props}
    assert any(prop.key == "namespace" for prop in node.metadata_props)  # the rest of the metadata stays
