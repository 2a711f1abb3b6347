"""How the package is laid out and installed."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_clone_named_steersman_does_not_shadow_the_package(tmp_path):
    """A clone in a folder named ``steersman``, used from its parent folder, is only a
    namespace-package candidate there (its top level has no ``__init__.py``); the src layout's
    editable install puts ``src/`` on ``sys.path``, where the real package wins."""
    clone = tmp_path / "steersman"
    (clone / "src").mkdir(parents=True)
    (clone / "README.md").write_text("a clone\n")
    out = subprocess.run([sys.executable, "-c", "from steersman import TensorDict; import steersman;"
                          " print(steersman.__file__)"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve().parent.name == "steersman"
    assert not (ROOT / "steersman").exists() and (ROOT / "src" / "steersman" / "__init__.py").is_file()
