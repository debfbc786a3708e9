//! The tidy checks. Each rule is a function of what it reads (`cargo metadata`, the source
//! files) that returns its violations, so that a test can show each rule failing on a broken
//! input as well as holding on the real tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::{output, workspace};
use serde_json::Value;

/// The crates of ours each crate may depend on (ARCHITECTURE.md, "Dependency rules"), for
/// `[dependencies]` and `[build-dependencies]`; `None`: any (examples and tests). `cli-docs`
/// is the man page generator every binary calls.
const RULES: &[(&str, Option<&[&str]>)] = &[
    ("fencing", Some(&[])),
    ("lockd-core", Some(&["fencing"])),
    ("lockd-store", Some(&["fencing", "lockd-core"])),
    (
        "lockd-store-kv",
        Some(&["fencing", "lockd-core", "lockd-store"]),
    ),
    (
        "lockd-store-etcd",
        Some(&["fencing", "lockd-core", "lockd-store", "lockd-store-kv"]),
    ),
    (
        "lockd-store-zk",
        Some(&["fencing", "lockd-core", "lockd-store", "lockd-store-kv"]),
    ),
    (
        "lockd-store-redis",
        Some(&["fencing", "lockd-core", "lockd-store", "lockd-store-kv"]),
    ),
    ("lockd-proto", Some(&[])),
    (
        "lockd-server",
        Some(&[
            "fencing",
            "lockd-core",
            "lockd-store",
            "lockd-store-etcd",
            "lockd-store-zk",
            "lockd-store-redis",
            "lockd-proto",
            "cli-docs",
            "tlsconf",
            "opskit",
        ]),
    ),
    (
        "lockd-client",
        Some(&["fencing", "lockd-proto", "cli-docs", "tlsconf"]),
    ),
    (
        "lockbench",
        Some(&["fencing", "lockd-proto", "lockd-client"]),
    ),
    ("shards", Some(&[])),
    (
        "http-relay",
        Some(&["fencing", "shards", "tlsconf", "opskit"]),
    ),
    ("pg-wire", Some(&[])),
    (
        "pg-relay",
        Some(&["fencing", "pg-wire", "shards", "tlsconf", "opskit"]),
    ),
    (
        "fence-proxy",
        Some(&[
            "fencing",
            "shards",
            "http-relay",
            "pg-relay",
            "cli-docs",
            "tlsconf",
            "opskit",
        ]),
    ),
    ("verifier", Some(&["fencing", "cli-docs"])),
    ("cli-docs", Some(&[])),
    ("tlsconf", Some(&[])),
    ("opskit", Some(&[])),
    ("e2e", None),
    ("cron-dedup", None),
    ("zombie", None),
    ("faults", None),
    ("testbed", None),
];

/// Third-party crates a crate must not depend on: `fencing` is std, serde and the HMAC of signed tokens; `pg-wire`
/// stays fuzzable (no I/O, no runtime).
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("pg-wire", &["tokio", "mio", "socket2", "async-std"]),
    ("fencing", &["tokio", "anyhow", "thiserror"]),
];

/// Dependencies no source file names, with why they are needed anyway.
const USED_UNSEEN: &[(&str, &str, &str)] = &[
    (
        "lockd-proto",
        "tonic-prost",
        "the code tonic-prost-build generates into OUT_DIR calls it",
    ),
    (
        "lockd-proto",
        "prost",
        "the messages generated into OUT_DIR derive prost::Message",
    ),
];

/// Longest file, in lines, unless it is on [`LONG_FILES`].
const LINE_BUDGET: usize = 1000;

/// Files allowed over [`LINE_BUDGET`], and why.
const LONG_FILES: &[(&str, &str)] = &[
    (
        "proxy/pg-relay/src/machine.rs",
        "the PostgreSQL session's sans-I/O state machine: one match over state and message, whose arms read best side by side",
    ),
    (
        "proxy/pg-relay/src/machine_tests.rs",
        "one expect-test transcript per protocol path of the state machine",
    ),
    (
        "proxy/http-relay/src/h1.rs",
        "HTTP/1.1 framing and its edge cases, with the tests beside each (720 lines of code)",
    ),
];

/// A workspace package as `cargo metadata` describes it.
pub struct Package {
    pub name: String,
    pub dir: PathBuf,
    /// (name as the code spells it, package name, kind: "normal", "dev" or "build", ours)
    pub deps: Vec<Dep>,
    /// Source roots of library targets, and of binary targets.
    pub lib: Option<PathBuf>,
    pub bins: Vec<PathBuf>,
}

pub struct Dep {
    pub package: String,
    pub ident: String,
    pub kind: String,
    pub ours: bool,
}

pub fn packages() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ])
    .current_dir(workspace());
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "cargo metadata failed: {stderr}");
    let meta: Value = serde_json::from_str(&stdout).expect("cargo metadata prints JSON");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            let targets = p["targets"].as_array().unwrap();
            let root_of = |kind: &str| {
                targets
                    .iter()
                    .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == kind))
                    .map(|t| PathBuf::from(t["src_path"].as_str().unwrap()))
                    .collect::<Vec<_>>()
            };
            Package {
                name: p["name"].as_str().unwrap().to_string(),
                dir: manifest.parent().unwrap().to_path_buf(),
                deps: p["dependencies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| {
                        let package = d["name"].as_str().unwrap().to_string();
                        Dep {
                            ident: d["rename"].as_str().unwrap_or(&package).replace('-', "_"),
                            package,
                            kind: d["kind"].as_str().unwrap_or("normal").to_string(),
                            ours: d["path"].is_string(),
                        }
                    })
                    .collect(),
                lib: root_of("lib").into_iter().next(),
                bins: root_of("bin"),
            }
        })
        .collect()
}

/// Every `.rs` file under `dir` (target/ and node_modules/ left out).
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && name != "node_modules" && name != ".git" {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Violations of [`RULES`] and [`FORBIDDEN`].
pub fn dependency_rule_violations(packages: &[Package]) -> Vec<String> {
    let rules: BTreeMap<&str, Option<&[&str]>> = RULES.iter().copied().collect();
    let mut out = Vec::new();
    for p in packages {
        let Some(allowed) = rules.get(p.name.as_str()) else {
            out.push(format!(
                "{} has no dependency rule: add one to ARCHITECTURE.md and to RULES",
                p.name
            ));
            continue;
        };
        for d in p.deps.iter().filter(|d| d.kind != "dev") {
            if let Some(allowed) = allowed
                && d.ours
                && !allowed.contains(&d.package.as_str())
            {
                out.push(format!("{} must not depend on {}", p.name, d.package));
            }
            for (krate, banned) in FORBIDDEN {
                if p.name == *krate && banned.contains(&d.package.as_str()) {
                    out.push(format!("{} must not depend on {}", p.name, d.package));
                }
            }
        }
    }
    out
}

/// Files that do not open with a module doc comment.
pub fn undocumented_modules(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .map(|f| format!("{} does not start with a `//!` module doc", f.display()))
        .collect()
}

/// Library code that uses `anyhow` (libraries have typed errors; binaries, tests and
/// examples may use it). A library's files are those under its `src/` but its binaries'.
pub fn anyhow_in_libraries(packages: &[Package]) -> Vec<String> {
    let mut out = Vec::new();
    for p in packages.iter().filter(|p| p.name != "e2e") {
        let Some(lib) = &p.lib else { continue };
        let src = lib.parent().unwrap();
        let bin_dirs: Vec<&Path> = p.bins.iter().map(|b| b.parent().unwrap()).collect();
        if p.bins.is_empty()
            && p.deps
                .iter()
                .any(|d| d.package == "anyhow" && d.kind == "normal")
        {
            out.push(format!("library {} declares anyhow", p.name));
        }
        for f in rust_files(src) {
            let in_bin = p.bins.contains(&f)
                || bin_dirs.iter().any(|d| *d != src && f.starts_with(d))
                || f.starts_with(src.join("bin"));
            if !in_bin && std::fs::read_to_string(&f).unwrap().contains("anyhow") {
                out.push(format!("{} (library {}) uses anyhow", f.display(), p.name));
            }
        }
    }
    out
}

/// Whether `text` names the crate `ident` as code does: `ident::`, `use ident`,
/// `extern crate ident`.
fn names_crate(text: &str, ident: &str) -> bool {
    text.match_indices(ident).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let boundary = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let after = &text[at + ident.len()..];
        boundary
            && (after.starts_with("::")
                || text[..at].ends_with("use ")
                || text[..at].ends_with("extern crate "))
    })
}

/// Declared dependencies no file of the crate names.
pub fn unused_dependencies(packages: &[Package]) -> Vec<String> {
    let mut out = Vec::new();
    for p in packages {
        let texts: Vec<String> = rust_files(&p.dir)
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect();
        for d in &p.deps {
            let excused = USED_UNSEEN
                .iter()
                .any(|(k, dep, _)| *k == p.name && *dep == d.package);
            if !excused && !texts.iter().any(|t| names_crate(t, &d.ident)) {
                out.push(format!(
                    "{} declares {} ({}) and never uses it",
                    p.name, d.package, d.kind
                ));
            }
        }
    }
    out
}

/// Files over [`LINE_BUDGET`] that are not on [`LONG_FILES`], and entries of it that are no
/// longer needed.
pub fn files_over_budget(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let lines = std::fs::read_to_string(f).unwrap().lines().count();
        let rel = f
            .strip_prefix(root)
            .unwrap_or(f)
            .to_string_lossy()
            .into_owned();
        let allowed = LONG_FILES.iter().any(|(p, _)| *p == rel);
        if lines > LINE_BUDGET && !allowed {
            out.push(format!(
                "{rel} has {lines} lines, over the budget of {LINE_BUDGET}: split it, or add it to LONG_FILES with why"
            ));
        }
        if lines <= LINE_BUDGET && allowed {
            out.push(format!(
                "{rel} is within the budget now: take it off LONG_FILES"
            ));
        }
    }
    out
}

/// Packages whose manifest does not take the workspace's lints.
pub fn without_workspace_lints(packages: &[Package]) -> Vec<String> {
    packages
        .iter()
        .filter(|p| {
            let manifest = std::fs::read_to_string(p.dir.join("Cargo.toml")).unwrap_or_default();
            !manifest.contains("\n[lints]\nworkspace = true\n")
        })
        .map(|p| {
            format!(
                "{} does not take the workspace lints ([lints] workspace = true)",
                p.name
            )
        })
        .collect()
}

fn assert_none(what: &str, violations: Vec<String>) {
    assert!(
        violations.is_empty(),
        "{what}:\n  {}",
        violations.join("\n  ")
    );
}

fn all_rust_files() -> Vec<PathBuf> {
    rust_files(&workspace())
}

#[test]
fn every_crate_keeps_the_dependency_rules() {
    let packages = packages();
    assert!(
        packages.len() >= RULES.len(),
        "cargo metadata listed too few packages"
    );
    assert_none(
        "dependency rules broken",
        dependency_rule_violations(&packages),
    );
}

#[test]
fn every_crate_takes_the_workspace_lints() {
    assert_none(
        "crates without the lints",
        without_workspace_lints(&packages()),
    );
}

#[test]
fn every_module_starts_with_its_doc() {
    assert_none(
        "modules without a doc",
        undocumented_modules(&all_rust_files()),
    );
}

#[test]
fn libraries_have_typed_errors() {
    assert_none("anyhow in libraries", anyhow_in_libraries(&packages()));
}

#[test]
fn every_dependency_is_used() {
    assert_none("unused dependencies", unused_dependencies(&packages()));
}

#[test]
fn no_file_is_over_the_line_budget() {
    let files = all_rust_files();
    assert!(files.len() > 100, "found only {} Rust files", files.len());
    assert_none(
        "files over the line budget",
        files_over_budget(&workspace(), &files),
    );
}

/// Each rule fails on a tree that breaks it: a fake package, a file, a manifest.
mod the_rules_can_fail {
    use super::*;

    fn dep(package: &str, kind: &str, ours: bool) -> Dep {
        Dep {
            package: package.to_string(),
            ident: package.replace('-', "_"),
            kind: kind.to_string(),
            ours,
        }
    }

    fn package(dir: &Path, name: &str, deps: Vec<Dep>, bins: Vec<PathBuf>) -> Package {
        Package {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            deps,
            lib: Some(dir.join("src/lib.rs")),
            bins,
        }
    }

    #[test]
    fn a_forbidden_dependency_of_ours_and_a_runtime_in_pg_wire() {
        let dir = tempfile::tempdir().unwrap();
        let client = package(
            dir.path(),
            "lockd-client",
            vec![
                dep("lockd-core", "normal", true),
                dep("lockd-store", "dev", true),
            ],
            vec![],
        );
        let wire = package(
            dir.path(),
            "pg-wire",
            vec![dep("tokio", "normal", false)],
            vec![],
        );
        let stranger = package(dir.path(), "newcomer", vec![], vec![]);
        let v = dependency_rule_violations(&[client, wire, stranger]);
        assert_eq!(
            v,
            [
                "lockd-client must not depend on lockd-core",
                "pg-wire must not depend on tokio",
                "newcomer has no dependency rule: add one to ARCHITECTURE.md and to RULES",
            ],
        );
    }

    #[test]
    fn a_crate_without_the_lints() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Cargo.toml"), "[package]\nname = \"p\"\n").unwrap();
        let v = without_workspace_lints(&[package(dir.path(), "p", vec![], vec![])]);
        assert_eq!(
            v,
            ["p does not take the workspace lints ([lints] workspace = true)"]
        );
    }

    #[test]
    fn a_module_without_its_doc() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.rs");
        let bad = dir.path().join("bad.rs");
        std::fs::write(&good, "//! Does a thing.\nfn f() {}\n").unwrap();
        std::fs::write(&bad, "// not a module doc\nfn f() {}\n").unwrap();
        let v = undocumented_modules(&[good, bad.clone()]);
        assert_eq!(
            v,
            [format!(
                "{} does not start with a `//!` module doc",
                bad.display()
            )]
        );
    }

    #[test]
    fn anyhow_in_a_library_but_not_in_its_binary() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("bin/tool")).unwrap();
        std::fs::write(src.join("lib.rs"), "//! L.\npub mod m;\n").unwrap();
        std::fs::write(
            src.join("m.rs"),
            "//! M.\npub fn f() -> anyhow::Result<()> { Ok(()) }\n",
        )
        .unwrap();
        std::fs::write(
            src.join("main.rs"),
            "//! B.\nfn main() -> anyhow::Result<()> { Ok(()) }\n",
        )
        .unwrap();
        std::fs::write(
            src.join("bin/tool/main.rs"),
            "//! T.\nuse anyhow::Context;\n",
        )
        .unwrap();
        let with_bins = package(
            dir.path(),
            "lib-and-bins",
            vec![dep("anyhow", "normal", false)],
            vec![src.join("main.rs"), src.join("bin/tool/main.rs")],
        );
        let lib_only = package(
            dir.path(),
            "lib-only",
            vec![dep("anyhow", "normal", false)],
            vec![],
        );
        let v = anyhow_in_libraries(&[with_bins]);
        assert_eq!(
            v,
            [format!(
                "{} (library lib-and-bins) uses anyhow",
                src.join("m.rs").display()
            )]
        );
        let v = anyhow_in_libraries(&[lib_only]);
        assert_eq!(v[0], "library lib-only declares anyhow");
    }

    #[test]
    fn a_dependency_nothing_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        std::fs::write(
            dir.path().join("src/lib.rs"),
            "//! L.\nuse serde::Serialize;\n#[tokio::test]\nasync fn t() {}\n// my_serde_json::x and thiserror are mentioned, not used\n",
        )
        .unwrap();
        let p = package(
            dir.path(),
            "p",
            vec![
                dep("serde", "normal", false),
                dep("tokio", "dev", false),
                dep("serde-json", "normal", false),
                dep("thiserror", "normal", false),
            ],
            vec![],
        );
        assert_eq!(
            unused_dependencies(&[p]),
            [
                "p declares serde-json (normal) and never uses it",
                "p declares thiserror (normal) and never uses it",
            ]
        );
    }

    #[test]
    fn a_file_over_the_budget_and_an_allowance_no_longer_needed() {
        let dir = tempfile::tempdir().unwrap();
        let long = dir.path().join("long.rs");
        std::fs::write(&long, "//! L.\n".repeat(LINE_BUDGET + 1)).unwrap();
        let short = dir.path().join(LONG_FILES[0].0);
        std::fs::create_dir_all(short.parent().unwrap()).unwrap();
        std::fs::write(&short, "//! S.\n").unwrap();
        let v = files_over_budget(dir.path(), &[long, short]);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].starts_with("long.rs has 1001 lines"), "{v:?}");
        assert!(v[1].ends_with("take it off LONG_FILES"), "{v:?}");
    }
}
