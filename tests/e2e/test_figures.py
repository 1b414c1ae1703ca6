"""The figures the README and bench/results/README.md quote are what their result files hold
(tools/check_figures.py lists each claim and computes its text from the file)."""
import subprocess
import sys

from support import ROOT


def test_every_quoted_figure_is_its_files():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "check_figures.py")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NOT FOUND" not in done.stdout
