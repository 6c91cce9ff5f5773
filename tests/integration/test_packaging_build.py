"""`sam build` the application once, then import every handler from the build output alone.

Each function is imported in a fresh interpreter (`python -I -S`: no site-packages, no
PYTHONPATH, no working directory) whose sys.path is exactly what Lambda gives it: the
function's build directory, the CoreLayer's python/ directory, and a directory holding only
what the python3.11 runtime ships (boto3 and its dependencies). Shared code missing from
the layer, a dependency missing from a function's requirements.txt, or an import of torch
or model_code shows up here instead of as an ImportModuleError in AWS.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from d2ops.layer_build import core_files
from d2ops.template import REPO_ROOT, TEMPLATE_PATH, FunctionSpec, load_template, resolve

pytestmark = pytest.mark.integration

# What the AWS python3.11 runtime provides besides the standard library.
RUNTIME_MODULES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six")
LAMBDA_UNZIPPED_LIMIT = 262_144_000  # bytes, function code plus all its layers
FUNCTIONS = load_template().functions()

PROBE = r"""
import importlib, json, sys, time
cfg = json.loads(sys.argv[1])
sys.path[:0] = cfg["path"]
started = time.perf_counter()
module = importlib.import_module(cfg["module"])
handler = getattr(module, cfg["attr"])
seconds = time.perf_counter() - started
if not callable(handler):
    raise SystemExit(f"{cfg['module']}.{cfg['attr']} is not callable")
files = sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)})
print(json.dumps({"seconds": seconds, "files": files, "modules": sorted(sys.modules)}))
"""


@dataclass(frozen=True)
class Build:
    root: Path
    runtime_dir: Path
    seconds: float

    def function_dir(self, logical_id: str) -> Path:
        return self.root / logical_id

    @property
    def layer_dir(self) -> Path:
        return self.root / "CoreLayer" / "python"


def _tool_env() -> dict[str, str]:
    bin_dir = Path(sys.executable).parent
    # SAM's pip builder looks for python3.11 on PATH: use the venv's (it has pip).
    return {**os.environ, "SAM_CLI_TELEMETRY": "0", "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _runtime_provided_dir(target: Path) -> Path:
    target.mkdir()
    for name in RUNTIME_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, f"{name} is not installed in the test environment"
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (target / source.name).symlink_to(source)
    return target


@pytest.fixture(scope="session")
def sam_build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    import time

    base = tmp_path_factory.mktemp("sam")
    cache = REPO_ROOT / ".aws-sam" / "test-cache"
    # SAM keeps its cache index (build.toml) beside the build dir: carry it across sessions so
    # unchanged functions reuse their installed dependencies (.aws-sam/deps) instead of pip.
    index = cache / "build.toml"
    if index.is_file():
        shutil.copy(index, base / "build.toml")
    started = time.perf_counter()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "sam"), "build",
            "--template-file", str(TEMPLATE_PATH),
            "--build-dir", str(base / "build"),
            # Our own cache: dependency downloads are reused across runs, and a developer's
            # concurrent `sam build` (default cache dir) cannot interfere.
            "--cached", "--cache-dir", str(cache),
        ],
        cwd=REPO_ROOT, env=_tool_env(), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"sam build failed:\n{proc.stdout}\n{proc.stderr}"
    if (base / "build.toml").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copy(base / "build.toml", index)
    return Build(base / "build", _runtime_provided_dir(base / "lambda-runtime"), time.perf_counter() - started)


def _fake_values() -> tuple[dict[str, Any], Any]:
    t = load_template()
    refs: dict[str, Any] = {name: f"{name.lower()}-value" for name in t.resources}
    refs |= {name: f"{name.lower()}-param" for name in t.parameters()}
    refs |= t.parameter_defaults()

    def getatt(logical_id: str, attribute: str) -> str:
        return f"arn:aws:test:us-east-1:123456789012:{logical_id}/{attribute}"

    return refs, getatt


def _lambda_env(fn: FunctionSpec, task_root: Path) -> dict[str, str]:
    refs, getatt = _fake_values()
    env = {k: str(v) for k, v in resolve(fn.environment, refs, getatt).items()}
    return {
        **env,
        "AWS_LAMBDA_FUNCTION_NAME": f"d2ops-{fn.logical_id}",
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.11",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "LAMBDA_TASK_ROOT": str(task_root),
        "_HANDLER": fn.handler,
        "PATH": os.environ.get("PATH", ""),
    }


def _probe(fn: FunctionSpec, path: list[Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    cfg = {"path": [str(p) for p in path], "module": fn.handler_module, "attr": fn.handler_name}
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, json.dumps(cfg)],
        cwd=cwd, env=_lambda_env(fn, path[0]), capture_output=True, text=True, timeout=120,
    )


def _tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _top_level(root: Path) -> Iterator[str]:
    for p in root.iterdir():
        yield p.name.removesuffix(".py")


def _distributions(root: Path) -> dict[str, str]:
    """Installed distributions in a build directory: normalised name -> version."""
    found = {}
    for info in root.glob("*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
        found[name.lower().replace("-", "_")] = version
    return found


def test_core_layer_holds_the_core_and_its_dependencies(sam_build: Build) -> None:
    layer = sam_build.layer_dir
    # Exactly the core package: no ASL interpreter, offline runtime, CLI or benchmarks in Lambda.
    shipped = sorted(p.relative_to(layer) for p in (layer / "d2ops_core").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    assert shipped == core_files(REPO_ROOT / "src")
    present = set(_top_level(layer))
    assert "d2ops" not in present
    assert {"pydantic", "pydantic_core", "msgspec", "PIL"} <= present
    # Kept out: training frameworks (never in a Lambda) and what the runtime already provides.
    assert not present & {"torch", "torchvision", "moto", "boto3", "botocore", "model_code"}


@pytest.mark.parametrize("logical_id", sorted(FUNCTIONS))
def test_built_function_imports_its_handler_from_the_build_alone(sam_build: Build, logical_id: str) -> None:
    fn = FUNCTIONS[logical_id]
    code = sam_build.function_dir(logical_id)
    assert (code / fn.handler_module.replace(".", "/")).with_suffix(".py").is_file()
    # The shared library has one home, the layer; a copy in a function would shadow it.
    assert not (code / "d2ops").exists() and not (code / "d2ops_core").exists(), \
        f"{logical_id} bundles its own d2ops"

    # /var/task precedes /opt/python on Lambda's sys.path: a package in both would make the
    # layer's d2ops_core run against the function's copy, so the two must be the same version.
    ours, layer = _distributions(code), _distributions(sam_build.layer_dir)
    differing = {n: (ours[n], layer[n]) for n in ours.keys() & layer.keys() if ours[n] != layer[n]}
    assert differing == {}, f"{logical_id} and CoreLayer install different versions: {differing}"

    proc = _probe(fn, [code, sam_build.layer_dir, sam_build.runtime_dir], cwd=sam_build.root)
    assert proc.returncode == 0, f"{logical_id}: importing {fn.handler} from the build failed:\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    allowed = [str(code), str(sam_build.layer_dir), str(sam_build.runtime_dir), sys.base_prefix]
    strays = [f for f in result["files"]
              if "site-packages" in f or not any(f.startswith(root) for root in allowed)]
    assert strays == [], f"{logical_id} loaded files from outside its build: {strays[:5]}"
    forbidden = {m.split(".")[0] for m in result["modules"]} & {"torch", "torchvision", "model_code", "moto"}
    assert not forbidden, f"{logical_id} imports {sorted(forbidden)}"
    assert _tree_size(code) + _tree_size(sam_build.layer_dir.parent) < LAMBDA_UNZIPPED_LIMIT
    print(f"{logical_id}: handler import {result['seconds']:.2f}s, "
          f"code {_tree_size(code) / 1e6:.1f} MB + layer {_tree_size(sam_build.layer_dir.parent) / 1e6:.1f} MB")


def test_probe_catches_shared_code_missing_from_a_function(sam_build: Build) -> None:
    # Without the layer the validation handler cannot find d2ops (or its dependencies):
    # the same probe that passes above must fail, or it proves nothing.
    fn = load_template().function_for_code_dir("validate_dataset")
    proc = _probe(fn, [sam_build.function_dir(fn.logical_id), sam_build.runtime_dir], cwd=sam_build.root)
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr, proc.stderr
