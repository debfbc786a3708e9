//! Generates the protobuf and tonic code. Needs `protoc` (Debian: `apt-get install
//! protobuf-compiler`; `./x` installs it), or the `PROTOC` environment variable pointing at one.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    if std::env::var_os("PROTOC").is_none() && which("protoc").is_none() {
        panic!(
            "protoc, the protobuf compiler, is needed to build lockd-proto: run `./x deps demo` \
             (Debian: it runs `apt-get install protobuf-compiler libprotobuf-dev`), or set \
             PROTOC=/path/to/protoc"
        );
    }
    tonic_prost_build::configure()
        .compile_protos(&["proto/fencing/lock/v1/lock.proto"], &["proto"])
        .expect("compiling proto/fencing/lock/v1/lock.proto");
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}
