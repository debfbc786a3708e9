"""Generates lockd_client's gRPC stubs from lockd's proto (lockd/lockd-proto).

    python3 clients/python/generate.py [OUT_DIR]

The stubs are checked in (src/lockd_client/_proto), so that `pip install ./clients/python`
needs no code generator; tests/test_stubs.py fails when they differ from what this script
makes of the proto today. Needs grpcio-tools (requirements-dev.txt).
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "lockd" / "lockd-proto" / "proto"
PROTO = PROTO_ROOT / "fencing" / "lock" / "v1" / "lock.proto"
DEFAULT_OUT = HERE / "src" / "lockd_client" / "_proto"


def generate(out: pathlib.Path) -> None:
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    # The proto's own directory as the include root: the modules are `lock_pb2` and
    # `lock_pb2_grpc`, and the second imports the first relatively (below).
    args = [
        "protoc",
        f"-I{PROTO.parent}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed: {' '.join(args)}")
    grpc_module = out / "lock_pb2_grpc.py"
    text = grpc_module.read_text()
    grpc_module.write_text(text.replace("import lock_pb2 as lock__pb2", "from . import lock_pb2 as lock__pb2"))


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
