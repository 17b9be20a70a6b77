"""The layers hold: import-linter's contracts in pyproject.toml (one-way layers, no import cycle among any
package's modules) pass, and every import made inside a function says why it is deferred."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PACKAGES = ("groundwork", "cluster", "trainables", "orchestrator")


def test_import_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 kept, 0 broken" in proc.stdout


def function_level_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, the import, the line above) for each import statement inside a function."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    out.append((inner.lineno, lines[inner.lineno - 1], lines[inner.lineno - 2]))
    return out


def test_every_deferred_import_says_why():
    # A function-level import is for start-up time (or a process that needs what the driver must not load),
    # never to dodge a cycle: the contracts above forbid cycles, and each deferral carries its reason.
    silent = [f"{path.relative_to(REPO)}:{line}: {text.strip()}"
              for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
              for line, text, above in function_level_imports(path)
              if "#" not in text and not above.strip().startswith("#")]
    assert not silent, "\n".join(silent)


def test_a_launch_driver_checks_and_submits_without_torch():
    # The driver of a launch on a pool (orchestrator up) runs no model: importing torch there cost ~1.2 s of a
    # 3 s start. Every check of the default job, a token model's and a text model's, with torch unimportable.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import orchestrator.cli, orchestrator.launcher.launch, orchestrator.launcher.on_pool\n"
            "from orchestrator.config import LaunchConfig\n"
            "from orchestrator.preflight import checked_plan\n"
            "for model in ('digits-cnn', 'gpt-char', 'gpt2-124m', 'llama-toy'):\n"
            "    checked_plan(LaunchConfig.model_validate({'train': {'model': model}}))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_group_of_its_own_is_built_and_its_controller_started_without_torch(tmp_path):
    # Neither the driver nor Ray Train's controller runs a tensor op: torch imported in each (through Ray's
    # TorchConfig, or the worker's module) cost ~1.2 s of CPU apiece on the way to the first step. The driver
    # builds the trainer and pickles the controller's callbacks (the backend among them) and the train function
    # (which goes through the object store to the workers); a fresh process, as the controller is, unpickles
    # them; torch is unimportable in both.
    blob = tmp_path / "controller.pkl"
    build = ("import sys; sys.modules['torch'] = None\n"
             "from pathlib import Path\n"
             "import ray.cloudpickle as cp\n"
             "import orchestrator.launcher.own_group\n"
             "from orchestrator.config import LaunchConfig\n"
             "from orchestrator.preflight import checked_plan\n"
             "from orchestrator.raytrain.entry import train_worker\n"
             "from orchestrator.raytrain.job import Job, WorkerArgs\n"
             "from orchestrator.raytrain.trainer import make_trainer\n"
             "cfg = LaunchConfig.model_validate({'train': {'model': 'digits-cnn'}})\n"
             "_, plan, _ = checked_plan(cfg)\n"
             "trainer = make_trainer(train_worker, WorkerArgs(Job(name='t', train=cfg.train)), plan,"
             f" Path({str(tmp_path / 'runs' / 't')!r}))\n"
             "calls = (trainer._create_default_callbacks(), trainer._get_train_func())\n"
             f"Path({str(blob)!r}).write_bytes(cp.dumps(calls))\n")
    load = ("import sys; sys.modules['torch'] = None\n"
            "from pathlib import Path\n"
            "import ray.cloudpickle as cp\n"
            f"callbacks, train_fn = cp.loads(Path({str(blob)!r}).read_bytes())\n"
            "backend = next(c for c in callbacks if type(c).__name__ == 'BackendSetupCallback')._backend\n"
            "print(type(backend).__module__, type(backend).__name__, callable(train_fn))\n")
    for code in (build, load):
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["orchestrator.raytrain.backend", "LeanTorchBackend", "True"]
