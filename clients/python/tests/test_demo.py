"""The zombie demo (examples/zombie.py) runs, and fencing holds in it: its own process is
paused for real, a newer holder writes, the zombie's write is refused."""

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def test_the_zombie_demo(testbed):
    done = subprocess.run([sys.executable, str(HERE.parent / "examples" / "zombie.py")],
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(HERE.parent / "src")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "zombie: refused: fence-proxy refused the write (FN001)" in done.stdout, done.stdout
    assert "the row holds: 'newer (token" in done.stdout, done.stdout
