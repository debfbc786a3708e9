//! `./x`, README's entry point, with the system it asks stubbed out: as another user it prints
//! the exact command and stops; as root it installs what is missing and checks that it did;
//! with nothing missing it installs nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use e2e::{output, workspace};

/// Stub programs in a directory put first on PATH: `id -u` says `uid`, `dpkg-query` says every
/// package is `status` (and logs the query), `apt-get` and `cargo` log their arguments.
fn stubs(dir: &Path, uid: u32, status: &str) {
    let log = dir.join("calls.log");
    let write = |name: &str, body: String| {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write("id", format!("echo {uid}"));
    write(
        "dpkg-query",
        format!("echo \"dpkg-query $*\" >> {log:?}; printf %s {status}"),
    );
    for program in ["apt-get", "cargo"] {
        write(program, format!("echo \"{program} $*\" >> {log:?}"));
    }
}

fn x(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(workspace().join("x"))
        .args(args)
        .env("PATH", format!("{}:/usr/bin:/bin", dir.display()));
    let (status, stdout, stderr) = output(cmd);
    let calls = std::fs::read_to_string(dir.join("calls.log")).unwrap_or_default();
    (
        status.code().unwrap_or(-1),
        format!("{stdout}{stderr}"),
        calls,
    )
}

#[test]
fn as_another_user_it_prints_the_command_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    stubs(dir.path(), 1000, "not-installed");
    let (code, out, calls) = x(dir.path(), &["demo"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev'"
        ),
        "{out}"
    );
    assert!(
        !calls.contains("apt-get") && !calls.contains("cargo"),
        "{calls}"
    );
}

#[test]
fn as_root_it_installs_what_is_missing_and_checks_that_it_did() {
    let dir = tempfile::tempdir().unwrap();
    stubs(dir.path(), 0, "not-installed");
    let (code, out, calls) = x(dir.path(), &["deps", "demo"]);
    assert!(
        calls.contains("apt-get update -qq\n")
            && calls.contains(
                "apt-get install -y -qq --no-install-recommends protobuf-compiler libprotobuf-dev\n"
            ),
        "{calls}"
    );
    // The stub installed nothing: x must say so rather than go on to a build that would fail.
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("apt-get did not install: protobuf-compiler libprotobuf-dev"),
        "{out}"
    );
}

#[test]
fn with_nothing_missing_it_installs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    stubs(dir.path(), 0, "installed");
    let (code, out, calls) = x(dir.path(), &["deps", "demo"]);
    assert_eq!(code, 0, "{out}");
    assert!(calls.contains("dpkg-query"), "{calls}");
    assert!(!calls.contains("apt-get"), "{calls}");
}

#[test]
fn an_unknown_command_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    stubs(dir.path(), 1000, "installed");
    let (code, out, calls) = x(dir.path(), &["dmeo"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("./x demo") && out.contains("./x test"),
        "{out}"
    );
    assert!(calls.is_empty(), "{calls}");
    let (code, out, _) = x(dir.path(), &["deps", "everything"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("usage: ./x deps [demo|test]"), "{out}");
}

/// A new machine of the project's kind (`polyglot`: Debian 12 with Rust, a JDK, Node.js and
/// pyenv's CPython, but no cargo-nextest and no test drivers), stubbed: `cargo nextest` is
/// missing, `python3` is pyenv's (`python`: what `sys.executable` says) and lacks the drivers,
/// `externally_managed` says whether it refuses pip installs (PEP 668, as Debian's does).
fn polyglot_stubs(dir: &Path, python: &str, externally_managed: bool) {
    stubs(dir, 0, "installed");
    let log = dir.join("calls.log");
    let write = |name: &str, body: String| {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write(
        "cargo",
        format!("echo \"cargo $*\" >> {log:?}; [ \"$1\" != nextest ]"),
    );
    let managed = if externally_managed { 0 } else { 1 };
    write(
        "python3",
        format!(
            "echo \"python3 $*\" >> {log:?}
case \"$*\" in
  '-c import psycopg'*) exit 1 ;;
  '-c import sys; print(sys.executable)') echo {python} ;;
  '-m pip --version') echo 'pip 23.2.1' ;;
  -c*EXTERNALLY-MANAGED*) exit {managed} ;;
esac"
        ),
    );
    for program in ["java", "mvn", "node", "npm"] {
        write(program, format!("echo \"{program} $*\" >> {log:?}"));
    }
    // Go, with an empty GOPATH: `go install` makes the program it names there.
    let gopath = dir.join("gopath");
    write(
        "go",
        format!(
            "echo \"go $*\" >> {log:?}
case \"$1\" in
  env) echo {gopath:?} ;;
  install) n=${{2%@*}}; mkdir -p {gopath:?}/bin && printf '#!/bin/sh\\n' > {gopath:?}/bin/${{n##*/}} && chmod +x {gopath:?}/bin/${{n##*/}} ;;
esac"
        ),
    );
}

#[test]
fn on_a_new_polyglot_machine_it_builds_nextest_and_installs_the_drivers_into_pyenvs_python() {
    let dir = tempfile::tempdir().unwrap();
    polyglot_stubs(
        dir.path(),
        "/root/.pyenv/versions/3.11.7/bin/python3",
        false,
    );
    let (code, out, calls) = x(dir.path(), &["deps", "test"]);
    assert_eq!(code, 0, "{out}\n{calls}");
    assert!(
        calls.contains("cargo install --quiet --locked --version 0.9.151 cargo-nextest\n"),
        "cargo-nextest is built from crates.io, pinned: {calls}"
    );
    assert!(
        calls.contains(
            "python3 -m pip install -q --disable-pip-version-check -r tests/drivers/requirements.txt -r clients/python/requirements-dev.txt ./clients/python --root-user-action=ignore\n"
        ),
        "the drivers go into the python3 on PATH through its own pip: {calls}"
    );
    assert!(
        out.contains("into /root/.pyenv/versions/3.11.7/bin/python3"),
        "{out}"
    );
    for plugin in [
        "google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12",
        "google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1",
    ] {
        assert!(
            calls.contains(&format!("go install {plugin}\n")),
            "the Go SDK's stub check gets its protoc plugins, pinned: {calls}"
        );
    }
    // The machine's runtimes are used: no Debian JDK, Node.js, Python or pip on top of them.
    assert!(!calls.contains("apt-get"), "{calls}");
    assert!(!calls.contains("break-system-packages"), "{calls}");
}

#[test]
fn debians_own_python_gets_the_drivers_past_pep_668() {
    let dir = tempfile::tempdir().unwrap();
    polyglot_stubs(dir.path(), "/usr/bin/python3", true);
    let (code, out, calls) = x(dir.path(), &["deps", "test"]);
    assert_eq!(code, 0, "{out}\n{calls}");
    assert!(
        calls.contains(
            "python3 -m pip install -q --disable-pip-version-check -r tests/drivers/requirements.txt -r clients/python/requirements-dev.txt ./clients/python --root-user-action=ignore --break-system-packages\n"
        ),
        "{calls}"
    );
}

#[test]
fn a_second_run_installs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    polyglot_stubs(
        dir.path(),
        "/root/.pyenv/versions/3.11.7/bin/python3",
        false,
    );
    // nextest and the drivers are there now.
    let log = dir.path().join("calls.log");
    std::fs::write(
        dir.path().join("cargo"),
        format!("#!/bin/sh\necho \"cargo $*\" >> {log:?}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("python3"),
        format!("#!/bin/sh\necho \"python3 $*\" >> {log:?}\n"),
    )
    .unwrap();
    let bin = dir.path().join("gopath/bin");
    std::fs::create_dir_all(&bin).unwrap();
    for plugin in ["protoc-gen-go", "protoc-gen-go-grpc"] {
        std::fs::write(bin.join(plugin), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(bin.join(plugin), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (code, out, calls) = x(dir.path(), &["deps", "test"]);
    assert_eq!(code, 0, "{out}\n{calls}");
    assert!(calls.contains("cargo nextest --version"), "{calls}");
    assert!(
        !calls.contains("cargo install")
            && !calls.contains("pip install")
            && !calls.contains("go install")
            && !calls.contains("apt-get"),
        "{calls}"
    );
}
