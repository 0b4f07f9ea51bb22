"""The house in one direction: imports point down the layers, never up, never in a cycle, and entry
points never import each other. The layers (README "Layout" states the same list), bottom first:"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = [
    ("leaves", ["lora", "ppo", "model", "trajectories", "config", "config_rules", "collectives", "chat"]),
    ("scoring, parsing, tools", ["rewards", "agents", "runtime", "rundir"]),
    ("workflows and data", ["envs", "data", "workflows", "sft_teachers"]),
    ("engines and the episode driver", ["engines", "sampling", "static_step", "prefix_kv", "vllm_engine", "rollout"]),
    ("the learner", ["idle", "learner", "critic", "sft_train"]),
    ("a run's live objects", ["session"]),
    ("entry points", ["train", "eval", "sft", "play", "export", "compare", "recipes"]),
]
ENTRY_POINTS = LAYERS[-1][1]


def project_modules() -> dict[str, Path]:
    """Every module of the project (tests, bench and configs are not part of the house)."""
    files = [p for p in ROOT.glob("*.py")] + [p for d in ("runtime", "envs", "agents", "rewards", "data") for p in (ROOT / d).glob("*.py")]
    out = {}
    for p in files:
        rel = p.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = p
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules a file imports anywhere in it (function-level imports count too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n:
                out.add(n)
    return out


def layer_of(module: str) -> int:
    """The layer of the entry of LAYERS that names the module or the folder holding it (a folder is in one layer)."""
    for i, (_, names) in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and README's Layout)")


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Upward imports, imports between entry points, and import cycles, as readable lines."""
    bad = []
    for m, deps in sorted(graph.items()):
        for d in sorted(deps - {m}):
            if m in ENTRY_POINTS and d in ENTRY_POINTS:
                bad.append(f"entry point {m} imports entry point {d}")
            elif layer_of(d) > layer_of(m):
                bad.append(f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]}): upward")
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan: strongly connected components of more than one module are cycles
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return bad + [f"import cycle: {' -> '.join(c)}" for c in cycles]


def test_a_folder_is_in_one_layer():
    """No entry of LAYERS names a module inside a folder another entry names: a module that belongs to another
    layer than its folder moves to a folder of that layer (the sandbox and the tool runtime left envs/ for
    runtime/), so a file's folder tells its layer."""
    names = [n for _, ns in LAYERS for n in ns]
    assert [(a, b) for a in names for b in names if a.startswith(b + ".")] == []
    mods = project_modules()
    assert {m.partition(".")[0] for m in mods} <= set(names)  # every folder and top-level module named as a whole


def test_imports_point_down_the_layers():
    mods = project_modules()
    graph = {m: imports(p, set(mods)) for m, p in mods.items()}
    assert violations(graph) == []


def test_the_contract_catches_an_upward_import_an_entry_point_import_and_a_cycle():
    mods = project_modules()
    graph = {m: imports(p, set(mods)) for m, p in mods.items()}
    graph["ppo"] = graph["ppo"] | {"train"}  # a leaf reaching for the trainer
    graph["eval"] = graph["eval"] | {"train"}
    graph["data.math_data"] = graph["data.math_data"] | {"workflows"}  # workflows -> data.math_data -> workflows
    got = violations(graph)
    assert "ppo (leaves) imports train (entry points): upward" in got
    assert "entry point eval imports entry point train" in got
    assert any(x.startswith("import cycle:") and "workflows" in x and "data.math_data" in x for x in got)
