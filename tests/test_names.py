"""One name per concept, and functions short enough to read at once: the old second names of Sample,
Prompt, AdapterBatch and AdapterUpdate stay gone, and no function of the core modules grows past
MAX_LINES (split it into parts named for what they do)."""
import ast
import dataclasses
from pathlib import Path

import pytest

import envs
import learner
import rollout

ROOT = Path(__file__).resolve().parent.parent
OLD_NAMES = {  # old name -> the one name now
    "Step": "rollout.Sample",
    "Turn": "envs.Prompt",
    "RoleBatch": "learner.AdapterBatch",
    "Part": "learner.AdapterUpdate",
}
CORE = ["rollout.py", "learner.py", "sft.py", "sft_teachers.py", "train.py", "session.py", "ppo.py"]
MAX_LINES = 70


@pytest.mark.parametrize("module,name", [(rollout, "Step"), (rollout, "Turn"), (envs, "Turn"),
                                         (learner, "RoleBatch"), (learner, "Part")])
def test_old_names_are_gone(module, name):
    assert not hasattr(module, name), f"{module.__name__}.{name} is back: use {OLD_NAMES[name]}"


def test_samples_are_called_samples():
    sample = rollout.Sample(0, 0, "r", 0, [1], [2], [0.0])
    episode = rollout.Episode(0, 0, None, [sample])
    batch = learner.AdapterBatch([sample], [1.0], 0, 4)
    assert episode.samples == [sample] and not hasattr(episode, "steps")
    assert batch.samples == [sample] and not hasattr(batch, "steps")
    assert "batch" in {f.name for f in dataclasses.fields(learner.AdapterUpdate)}


def project_files() -> list[Path]:
    dirs = ("envs", "agents", "rewards", "data", "tests", "bench", "configs")
    return sorted(ROOT.glob("*.py")) + [p for d in dirs for p in sorted((ROOT / d).glob("*.py"))]


def test_no_code_uses_an_old_name():
    """Not as a name, an attribute or an import anywhere (a fork of an alias under another module too)."""
    uses = []
    for path in project_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                    else node.name if isinstance(node, ast.alias) else None)
            if name in OLD_NAMES:
                uses.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name} (now {OLD_NAMES[name]})")
    assert not uses, "\n".join(uses)


def test_core_functions_are_short():
    long = []
    for f in CORE:
        for node in ast.walk(ast.parse((ROOT / f).read_text(), f)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{f}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"longer than {MAX_LINES} lines (split them):\n" + "\n".join(long)
