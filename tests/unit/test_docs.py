"""The documentation stays a user's guide that is true of the code: a short README, no commit ids or dates in the
guides or in code comments, every relative link and every named module, file and setting exists."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

from serving.settings import ServingSettings

PROJECT = Path(__file__).resolve().parents[2]
DOCS = PROJECT / "docs"
README = PROJECT / "README.md"
MAX_README_LINES = 150
# Folders whose code comments and docstrings must carry no commit id or date.
CODE_FOLDERS = ("data", "models", "contract", "serving", "flows", "bench")
# Folders whose code names only docs files that exist (in comments, docstrings, messages).
DOC_NAMING_FOLDERS = ("data", "models", "contract", "serving", "flows", "bench", "tests")
# Generated from bench/results/*.json (bench/report.py), and the history of choices: these may carry dates.
NOT_GUIDES = (DOCS / "results.md", DOCS / "results", DOCS / "decisions")

COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_PATH = re.compile(r"\b(?:data|models|flows|serving|contract|bench|tests)/[\w/]+\.py\b")
MODULE = re.compile(r"(?:python|torchrun)\b[^`\n]*? -m ([a-z_][\w.]*)")
DOC_PATH = re.compile(r"\bdocs/[\w/.-]+\.md\b")
SERVING_VARIABLE = re.compile(r"\bSERVING_[A-Z_]*[A-Z]\b")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def guides() -> list[Path]:
    return [path for path in markdown_files()
            if not any(path == skip or skip in path.parents for skip in NOT_GUIDES)]


def dated_or_commit_ids(text: str) -> list[str]:
    return COMMIT_ID.findall(text) + DATE.findall(text)


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of Python source."""
    found = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return found


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines, more than {MAX_README_LINES}"


@pytest.mark.parametrize("path", guides(), ids=lambda path: str(path.relative_to(PROJECT)))
def test_guides_carry_no_commit_ids_or_dates(path):
    found = dated_or_commit_ids(path.read_text())
    assert not found, f"{path.relative_to(PROJECT)} names {found}: measurements go to docs/results.md, history to " \
                      "docs/decisions/"


@pytest.mark.parametrize("folder", CODE_FOLDERS)
def test_code_comments_carry_no_commit_ids_or_dates(folder):
    found = [f"{path.relative_to(PROJECT)}:{line}: {match}" for path in sorted((PROJECT / folder).rglob("*.py"))
             for line, text in comments_and_docstrings(path.read_text()) for match in dated_or_commit_ids(text)]
    assert not found, "comments with a commit id or date:\n" + "\n".join(found)


@pytest.mark.parametrize("folder", DOC_NAMING_FOLDERS)
def test_code_names_existing_docs(folder):
    missing = [f"{path.relative_to(PROJECT)}: {name}" for path in sorted((PROJECT / folder).rglob("*.py"))
               for name in DOC_PATH.findall(path.read_text()) if not (PROJECT / name).exists()]
    assert not missing, "code naming docs that do not exist:\n" + "\n".join(missing)


def test_the_checks_find_commit_ids_and_dates():
    assert dated_or_commit_ids("measured at 4a5e9d0 on 2026-12-06") == ["4a5e9d0", "2026-12-06"]
    assert dated_or_commit_ids("1000000 rows, a decade, 0.0001") == []
    source = '"""Measured on 2026-12-06."""\n\ndef f():\n    """Doc."""\n    return "9f3b2c1"  # at 9f3b2c1\n'
    assert sorted(comments_and_docstrings(source)) == [(1, "Measured on 2026-12-06."), (4, "Doc."), (5, "# at 9f3b2c1")]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(PROJECT)))
def test_relative_links_point_at_existing_files(path):
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        destination = (path.parent / file).resolve() if file else path
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{path.relative_to(PROJECT)}: " + "; ".join(broken)


@pytest.mark.parametrize("path", guides(), ids=lambda path: str(path.relative_to(PROJECT)))
def test_named_code_files_and_modules_exist(path):
    text = path.read_text()
    missing = [name for name in CODE_PATH.findall(text) if not (PROJECT / name).exists()]
    for module in MODULE.findall(text):
        if not module.endswith(".") and not module_exists(module):  # `flows.stages.<stage>`: a placeholder
            missing.append(f"-m {module}")
    assert not missing, f"{path.relative_to(PROJECT)} names what does not exist: {missing}"


def module_exists(module: str) -> bool:
    """A module of this project (its file, or a package's __main__), or an installed one."""
    top = module.split(".")[0]
    if not (PROJECT / top).is_dir():
        return importlib.util.find_spec(top) is not None
    base = PROJECT / module.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__main__.py").exists()


def test_every_service_setting_is_documented_and_every_documented_one_exists():
    documented = set(SERVING_VARIABLE.findall((DOCS / "reference" / "environment.md").read_text()))
    settings = {f"SERVING_{name.upper()}" for name in ServingSettings.model_fields}
    assert settings <= documented, f"not in docs/reference/environment.md: {sorted(settings - documented)}"
    named = {name for path in markdown_files() for name in SERVING_VARIABLE.findall(path.read_text())}
    assert named <= settings, f"the docs name settings the service does not have: {sorted(named - settings)}"
