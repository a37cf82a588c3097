"""The package as users get it: type stubs that cover every public call of the compiled module
(with docstrings), and `pip install ./python` into a virtual environment."""
import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardcache
from shardcache import _shardcache

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "shardcache"
DUNDERS = {"__len__", "__iter__", "__next__", "__dlpack__", "__dlpack_device__", "__init__"}


def _stub():
    tree = ast.parse((PACKAGE / "_shardcache.pyi").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n.name: ast.get_docstring(n) for n in node.body
                              if isinstance(n, (ast.FunctionDef, ast.AnnAssign)) and hasattr(n, "name")}
            out[node.name]["__doc__"] = ast.get_docstring(node)
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = ast.get_docstring(node)
    return out


def test_the_stubs_name_every_public_call_with_a_docstring():
    stub = _stub()
    for name, obj in vars(_shardcache).items():
        if name.startswith("_") or name in ("DEFAULT_SOCKET",):
            continue
        assert name in stub, "%s is missing from _shardcache.pyi" % name
        if inspect.isclass(obj) and name != "Error":
            assert stub[name]["__doc__"], "class %s has no docstring in the stub" % name
            for attr in dir(obj):
                if attr.startswith("_") and attr not in DUNDERS:
                    continue
                if attr == "__init__" and name not in ("Client", "Stager"):
                    continue
                assert attr in stub[name], "%s.%s is missing from _shardcache.pyi" % (name, attr)
                assert stub[name][attr], "%s.%s has no docstring in _shardcache.pyi" % (name, attr)
        elif callable(obj) and not inspect.isclass(obj):
            assert stub[name], "%s has no docstring in the stub" % name


def test_the_torch_module_documents_every_public_call():
    pytest.importorskip("torch")
    import shardcache.torch as st
    for name in st.__all__:
        obj = getattr(st, name)
        if inspect.isclass(obj):
            assert obj.__doc__, name
            for attr, member in vars(obj).items():
                if callable(member) and not attr.startswith("_"):
                    assert member.__doc__, "%s.%s has no docstring" % (name, attr)


@pytest.mark.slow
def test_pip_install_builds_the_module_against_the_system_libraries(tmp_path, socket_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", str(HERE.parent)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert pip.returncode == 0, pip.stdout.decode()[-4000:]
    code = ("import shardcache, shardcache.torch, sys; c = shardcache.Client(sys.argv[1]); "
            "b = next(iter(c.loader('tokens-v3', batch_size=4))); "
            "print(shardcache.__file__, len(b))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy, not the build tree
    run = subprocess.run([str(venv / "bin" / "python"), "-c", code, socket_path], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path))
    out = run.stdout.decode()
    assert run.returncode == 0, out
    assert str(venv) in out and out.strip().endswith(" 4")
    # The stubs and the typed marker are installed with it.
    site = next((venv / "lib").glob("python3*/site-packages/shardcache"))
    assert (site / "_shardcache.pyi").exists() and (site / "py.typed").exists()
