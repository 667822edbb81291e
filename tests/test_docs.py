"""What the README and docs/ say about the code, checked against the code: the layout table, the
architecture's rules, the stabiliser table's keys and defaults, and the folders the README's examples use.
(docs/reproduce.md's fidelity tables have their own file, test_fidelity.py.)"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from trl import GRPOConfig

from prompt_aug import sources, train
from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.demo import smoke

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _layout_paths() -> set[str]:
    """Every file the README's layout table names: ``a/b.py, c.py`` means ``a/b.py`` and ``a/c.py``."""
    section = README.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    paths = set()
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if "/" in name and not name.endswith("/"):
                folder = name.rsplit("/", 1)[0] + "/"
                paths.add(name)
            elif not name.endswith("/"):
                paths.add(folder + name)
    return paths


def test_the_layout_table_lists_every_module():
    modules = {
        p.relative_to(REPO).as_posix() for d in ("prompt_aug", "rewards") for p in (REPO / d).rglob("*.py")
    }
    listed = _layout_paths()
    assert modules - listed == set(), f"modules missing from the README's layout table: {modules - listed}"
    assert {p for p in listed if p.endswith(".py")} - modules == set(), (
        "the layout table names a missing file"
    )


def _layers() -> dict[str, int]:
    """Module -> layer, from the table in docs/architecture.md."""
    layers = {}
    for line in (REPO / "docs/architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for module in re.findall(r"`([\w.]+)`", cells[1]):
                layers[module] = int(cells[0])
    return layers


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """The modules of prompt_aug / rewards that the file of module ``name`` imports, anywhere in it (inside
    functions too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                if node.module:
                    found.add(".".join([*base, node.module]))
                else:
                    found |= {".".join([*base, alias.name]) for alias in node.names}
            else:
                found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.split(".")[0] in ("prompt_aug", "rewards") and m != name}


def test_every_import_stays_within_its_layer_or_goes_down():
    layers = _layers()
    files = [p for d in ("prompt_aug", "rewards") for p in sorted((REPO / d).rglob("*.py"))]
    modules = {_module_name(p) for p in files}
    assert modules - set(layers) == set(), f"docs/architecture.md gives no layer to {modules - set(layers)}"
    assert set(layers) - modules == set(), (
        f"docs/architecture.md names missing modules {set(layers) - modules}"
    )
    climbs = []
    for path in files:
        module = _module_name(path)
        for imported in _imports(path, module):
            target = next(
                m for m in (imported, imported.rsplit(".", 1)[0]) if m in layers
            )  # a name in a module
            if layers[target] > layers[module]:
                climbs.append(f"{module} (layer {layers[module]}) imports {target} (layer {layers[target]})")
    assert not climbs, climbs


def test_the_layer_check_sees_an_import_inside_a_function(tmp_path):
    copy = tmp_path / "records.py"
    copy.write_text(
        (REPO / "prompt_aug/records.py").read_text() + "\n\ndef late():\n    from .trainer import T\n"
    )
    assert "prompt_aug.trainer" in _imports(copy, "prompt_aug.records")
    assert _layers()["prompt_aug.trainer"] > _layers()["prompt_aug.records"]


def test_evaluation_modules_import_only_the_ones_below_them():
    order = ["benchmarks", "backends", "runner", "report", "cli", "callback"]  # docs/architecture.md
    folder = REPO / "prompt_aug/evaluation"
    assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == set(order)
    for rank, name in enumerate(order):
        tree = ast.parse((folder / f"{name}.py").read_text())
        local = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1]
        assert not [m for m in local if m not in order[:rank]], (name, local)


def test_the_grading_machinery_imports_no_reward_function():
    # rewards/grading/ sits beneath the reward functions: of the package above it, only the format rules.
    for path in (REPO / "rewards/grading").glob("*.py"):
        tree = ast.parse(path.read_text())
        above = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 2]
        above += [
            n.module.split(".")[1]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("rewards.")
        ]
        assert set(above) <= {"formats", "grading"}, (path.name, above)


def test_the_training_path_imports_no_demo_module_unless_the_recipe_asks(tmp_path):
    # A non-demo run imports the training entry point and resolves a real model and dataset by name; a demo
    # recipe (built-in model or dataset, DemoArguments keys) loads demo modules through the hook only.
    code = """
import json, sys
from prompt_aug import train
script_args, args, model_args, demo_args = train.parse_args(
    ["--config", "recipes/qwen2.5-math-1.5b/prompt_aug.yaml", "--dry_run", "--output_dir", sys.argv[1]])
from prompt_aug.models import resolve_model_path
assert resolve_model_path(model_args, args) == model_args.model_name_or_path
assert not demo_args.enabled
train.demo_stage().before_grpo(demo_args, None, None, "rows", [], args)
train.main(["--config", "recipes/qwen2.5-math-1.5b/prompt_aug.yaml", "--dry_run", \
"--output_dir", sys.argv[1]])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("prompt_aug"))))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert "prompt_aug.train" in loaded and "prompt_aug.trainer" in loaded
    assert [m for m in loaded if m.startswith("prompt_aug.demo.")] == [], loaded


def test_the_built_in_names_match_what_the_demo_builds():
    assert set(sources.builtin_names("model")) == set(smoke.TINY_MODELS)
    assert set(sources.builtin_names("dataset")) == set(smoke.BUILTIN_DATASETS)
    for name in sources.builtin_names("dataset"):  # each builds through its import path, to its stated size
        assert len(sources.builtin_rows(name, 4, 0)) == (sources.BUILTINS[name].rows or 4), name


def test_only_the_demo_and_sources_import_the_demo_package():
    files = sorted((REPO / "prompt_aug").rglob("*.py"))
    demo = {p: any(m.startswith("prompt_aug.demo") for m in _imports(p, _module_name(p))) for p in files}
    allowed = [p for p in files if p.parent.name == "demo" or p.name == "sources.py"]
    assert [str(p.relative_to(REPO)) for p in files if demo[p] and p not in allowed] == []
    assert demo[REPO / "prompt_aug" / "demo" / "__init__.py"]  # the check sees the demo's own imports


def test_readme_stabiliser_table_names_real_keys_with_their_defaults():
    section = README.split("### Stabilisers from the seed systems", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    systems = {row.split("|")[1].strip() for row in rows}
    assert {"Perplexity", "ProRL", "RLinf", "DAPO"} <= systems
    fields = [*PromptAugGRPOConfig.__dataclass_fields__.values(), *GRPOConfig.__dataclass_fields__.values()]
    defaults = {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory() for f in fields
    }
    checked = 0
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        for key, default in zip(re.findall(r"`(\w+)`", cells[2]), cells[3].split(",")):
            assert key in defaults, f"README names an unknown key {key}"
            assert str(defaults[key]).lower() == default.strip().strip("`").lower(), (key, default)
            checked += 1
    assert checked >= 10


def test_readme_examples_use_the_folders_the_recipes_write():
    written = {yaml.safe_load(p.read_text())["output_dir"] for p in (REPO / "recipes").rglob("*.yaml")}
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.DOTALL))
    chosen = set(re.findall(r"--(?:output_dir|out) (outputs/\S+)", blocks))  # folders it writes
    used = set(re.findall(r"(?<![\w/-])(outputs/[\w./-]+)", blocks)) - chosen
    assert used, "no outputs/ path in the README's examples"
    for path in used:
        assert any(path == w or path.startswith(w + "/") for w in written), (
            f"README uses {path}; recipes write {written}"
        )


def _gpu_commands() -> list[list[str]]:
    """The commands of the README's GPU section, one token list each (environment assignments dropped)."""
    section = README.split("\n## On GPUs\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            tokens = [t for t in shlex.split(line.rstrip(" &")) if not re.match(r"^[A-Z_]+=", t)]
            if tokens:
                commands.append(tokens)
    return commands


def test_the_readme_gpu_commands_parse_as_written():
    from prompt_aug.evaluation.cli import parse_args as eval_args

    launches = evaluations = 0
    for tokens in _gpu_commands():
        if tokens[:2] == ["accelerate", "launch"]:
            config = yaml.safe_load((REPO / tokens[tokens.index("--config_file") + 1]).read_text())
            recipe_args = tokens[tokens.index("prompt_aug.train") + 1 :]
            processes = str(config["num_processes"])
            parsed = train.parse_args([*recipe_args, "--dry_run", "--num_processes", processes])
            assert parsed.training_args.output_dir and parsed.model_args.model_name_or_path, tokens
            launches += 1
        elif tokens[0] == "prompt-aug-eval":
            assert eval_args(tokens[1:]).model, tokens
            evaluations += 1
        else:
            # Installs, logins and the server: what they take is not the package's to parse.
            known = ("python3", "python", "pip", "trl", "wandb")
            assert tokens[0] in known, f"a README GPU command this test does not check: {tokens}"
    assert launches >= 3 and evaluations >= 1


def test_the_license_file_is_the_one_pyproject_declares():
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    text = (REPO / "LICENSE").read_text()
    assert declared == "Apache-2.0"
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a header alone
