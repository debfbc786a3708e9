"""The checked-in gRPC stubs are what generate.py makes of lockd's proto today."""

import filecmp
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def test_stubs_are_fresh(tmp_path):
    done = subprocess.run([sys.executable, str(HERE.parent / "generate.py"), str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"generate.py failed (pip install -r requirements-dev.txt?): {done.stderr}"
    checked_in = HERE.parent / "src" / "lockd_client" / "_proto"
    for name in ("lock_pb2.py", "lock_pb2_grpc.py"):
        assert filecmp.cmp(tmp_path / name, checked_in / name, shallow=False), \
            f"{name} is stale: run python3 clients/python/generate.py and commit the result"
