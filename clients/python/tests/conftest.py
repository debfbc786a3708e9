"""The servers of the SDK's tests: clients/testbed (throwaway lockd instances, PostgreSQL behind
fence-proxy, an HTTP service behind it), started once per test session.

The tests import lockd_client from this tree (src/), not from an installed copy. The testbed
binary is $LOCKD_TESTBED, else target/debug/testbed of the repository; build it with
`cargo build -p testbed` (`./x test` does). Missing, it fails the tests with that command.
"""

import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "src"))


class Testbed:
    def __init__(self):
        binary = os.environ.get("LOCKD_TESTBED") or str(REPO / "target" / "debug" / "testbed")
        if not os.path.exists(binary):
            pytest.fail(f"the testbed binary {binary} is missing: build it with "
                        "`cargo build --workspace --bins` (or set LOCKD_TESTBED)", pytrace=False)
        self.proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the testbed {binary} exited before describing its servers "
                        f"(status {self.proc.wait()}); see its output above", pytrace=False)
        self.servers = json.loads(line)
        self._lock = threading.Lock()

    def command(self, line: str) -> str:
        with self._lock:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
        assert answer.startswith("ok"), f"testbed {line!r}: {answer}"
        return answer[3:]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def testbed():
    bed = Testbed()
    yield bed
    bed.close()
