"""The layers contract (``.importlinter``, docs/architecture.md): import-linter's ``lint-imports`` on the package as it
installs. setup.py maps the top-level folders envs/, algos/, peers/ and eval/ to graftzoo.* (``package_dir``), so the
package is assembled in a temporary folder the way a regular install lays it out, and linted there.

``python tests/test_layers.py`` (``make lint``) runs the same check outside pytest."""
import ast
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def package_roots() -> dict:
    """setup.py's ROOTS (package name -> folder), read without running setup.py."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ROOTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ROOTS mapping")


def assemble(dest: Path) -> Path:
    """The installed layout of the graftzoo package under ``dest`` (Python sources only)."""
    for name, folder in sorted(package_roots().items()):  # graftzoo first, then its mapped subpackages
        shutil.copytree(REPO / folder, dest / name.replace(".", "/"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "configs", "data"))
    return dest


def lint(dest: Path) -> subprocess.CompletedProcess:
    assemble(dest)
    return subprocess.run([str(LINT), str(REPO / ".importlinter"), "--no-cache"], cwd=dest,
                          capture_output=True, text=True, timeout=300)


def test_layers_contract_is_kept(tmp_path):
    res = lint(tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "2 kept, 0 broken" in res.stdout


def test_a_room_violation_is_caught(tmp_path):
    """The rooms of graftzoo.training are a contract too: the model room importing the learning step breaks it."""
    assemble(tmp_path)
    bad = tmp_path / "graftzoo" / "training" / "models" / "fsdp.py"
    bad.write_text(bad.read_text() + "\nfrom graftzoo.training.learning import step  # noqa\n")
    res = subprocess.run([str(LINT), str(REPO / ".importlinter"), "--no-cache"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "graftzoo.training.models is not allowed to import graftzoo.training.learning" \
        in res.stdout, res.stdout[-3000:]


def test_a_layer_violation_is_caught(tmp_path):
    """The check can fail: a contract module that imports the trainer breaks the contract."""
    assemble(tmp_path)
    bad = tmp_path / "graftzoo" / "contract" / "types.py"
    bad.write_text(bad.read_text() + "\nfrom graftzoo.training import trainer  # noqa\n")
    res = subprocess.run([str(LINT), str(REPO / ".importlinter"), "--no-cache"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "graftzoo.contract is not allowed to import graftzoo.training" in res.stdout


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        out = lint(Path(d))
    print(out.stdout[out.stdout.find("Contracts"):] if "Contracts" in out.stdout else out.stdout, out.stderr)
    sys.exit(out.returncode)
