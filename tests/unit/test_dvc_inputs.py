"""What DVC hashes as a stage's code: bytecode caches are not stage inputs (they exist or not depending on the
machine and PYTHONDONTWRITEBYTECODE, and made a fresh clone's `dvc.lock` differ from the committed one); the models/
code a stage runs is."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from flows.family import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).with_name("dvc")
PROJECT_PACKAGES = {"contract", "data", "flows", "models"}


def ignored(*paths: str) -> set[str]:
    """The paths `dvc check-ignore` says DVC leaves out of its hashes."""
    answer = subprocess.run([str(DVC), "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return set(answer.stdout.split())


def test_bytecode_caches_are_not_stage_inputs_and_sources_are():
    caches = ["data/sensors/__pycache__/split.cpython-311.pyc", "models/molecule/__pycache__/network.cpython-312.pyc"]
    sources = ["data/sensors/split.py", "models/molecule/network.py", "models/schedules.py"]
    assert ignored(*caches, *sources) == set(caches)


def imported_modules(path: Path) -> set[str]:
    """Dotted names of the project modules `path` imports, anywhere in it (function-local imports too)."""
    package = path.relative_to(ROOT).parent.parts
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package upwards
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # a module imported from its package
    return {name for name in names if name.split(".")[0] in PROJECT_PACKAGES}


def module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    return next((p for p in (path / "__init__.py", path.with_suffix(".py")) if p.is_file()), None)


def stage_code(module: str, declared: Callable[[Path], bool]) -> set[Path]:
    """The project files `module` reaches through its imports. The pipeline's plumbing (flows/*.py: tracking, params,
    locking, ...) and the registry contract are followed only where the stage declares them: they do not make the
    stage's outputs."""
    seen, todo = set(), [module]
    while todo:
        path = module_file(todo.pop())
        if path is None or path in seen:
            continue
        seen.add(path)
        relative = path.relative_to(ROOT)
        plumbing = relative.parts[0] == "contract" or (relative.parts[0] == "flows" and len(relative.parts) == 2)
        if not plumbing or declared(relative):
            todo.extend(imported_modules(path))
    return seen


def _imports(node: ast.AST) -> set[str]:
    """The project modules imported anywhere inside `node` (absolute imports: the family modules use no other)."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            names.update(alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            names.add(child.module)
            names.update(f"{child.module}.{alias.name}" for alias in child.names)
    return {name for name in names if name.split(".")[0] in PROJECT_PACKAGES}


def family_code(stage_files: set[Path], family: str) -> set[str]:
    """The project modules a generic stage (flows/stages/) runs of a family (flows/family.py): the family module's
    module-level imports and the imports inside the methods the stage's files call on it (`parts.<method>` or
    `family.<method>`), and inside the methods (`self.<method>`) and module functions those call in turn."""
    family_module = FAMILIES[family]
    called = {node.attr for path in stage_files for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in ("parts", "family")}
    tree = ast.parse(module_file(family_module).read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        functions.update({node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)})
    modules = {family_module} | _imports(ast.Module(
        body=[node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))], type_ignores=[]))
    todo, seen = [name for name in called if name in functions], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        modules |= _imports(functions[name])
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Name) and node.id in functions:  # a module function
                todo.append(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and node.attr in functions:
                todo.append(node.attr)
    return modules


def stage_code_of(module: str, family: str | None, declared: Callable[[Path], bool]) -> set[Path]:
    """The project files a stage's command runs; a generic stage, of its family module only what family_code says."""
    code = stage_code(module, declared)
    for name in family_code(code, family) if family else ():
        code |= {module_file(name)} if name == FAMILIES[family] else stage_code(name, declared)
    return code


def test_every_stage_declares_the_models_and_flow_code_it_runs():
    """A change to a module under models/ or flows/<family>/ that a stage runs re-runs that stage: it is one of the
    stage's deps (itself or its folder). A generic stage (`flows.stages.<stage> <family>`) runs the methods of the
    family it calls (family_code)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    undeclared = {}
    for name, stage in stages.items():
        command = stage["cmd"].split()
        module = command[command.index("-m") + 1]
        family = command[command.index("-m") + 2] if module.startswith("flows.stages.") else None
        deps = [Path(d) for d in stage.get("deps", [])]
        declared = lambda path: any(path == d or d in path.parents for d in deps)  # noqa: E731
        code = stage_code_of(module, family, declared)
        stage_made = lambda parts: parts[0] == "models" or (parts[0] == "flows" and len(parts) == 3)  # noqa: E731
        missing = sorted(str(p.relative_to(ROOT)) for p in code
                         if stage_made(p.relative_to(ROOT).parts) and p.name != "__init__.py"
                         and not declared(p.relative_to(ROOT)))
        if missing:
            undeclared[name] = missing
    assert undeclared == {}
