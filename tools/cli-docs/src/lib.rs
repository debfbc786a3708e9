//! Man pages and shell completions generated from a binary's clap definition.
//!
//! Each binary calls [`generate_if_asked`] first thing in `main`. With `CLI_DOCS_OUT=DIR` in
//! its environment it writes into DIR, instead of running, its man pages (`NAME.1`, and
//! `NAME-SUBCOMMAND.1` for each subcommand) and its completions for bash (`NAME.bash`), zsh
//! (`_NAME`) and fish (`NAME.fish`), prints their paths, and exits. `./x man` does this for
//! every binary; the pages are never out of date with the flags, since they are made from the
//! same definition as `--help`.

use std::io;
use std::path::{Path, PathBuf};

use clap_complete::Shell;

/// The environment variable that asks a binary for its docs: the directory to write them to.
pub const ENV: &str = "CLI_DOCS_OUT";

/// With [`ENV`] set, writes the docs of `command()` there and exits (status 1, with a message,
/// when they cannot be written); otherwise returns at once and costs nothing.
pub fn generate_if_asked(command: impl FnOnce() -> clap::Command) {
    let Some(dir) = std::env::var_os(ENV) else {
        return;
    };
    let command = command();
    let name = command.get_name().to_string();
    match generate(command, Path::new(&dir)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!(
                "{name}: cannot write the man pages and completions into {}: {e}",
                Path::new(&dir).display()
            );
            std::process::exit(1);
        }
    }
}

/// Writes the man pages and completions of `command` into `dir` (created if missing) and
/// returns the files written.
pub fn generate(mut command: clap::Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    // `help` subcommands would only repeat every page once more.
    command = without_help_subcommands(command);
    command.build();
    let name = command.get_name().to_string();
    let mut files = Vec::new();
    clap_mangen::generate_to(command.clone(), dir)?;
    pages(&command, &name, dir, &mut files);
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        files.push(clap_complete::generate_to(shell, &mut command, &name, dir)?);
    }
    Ok(files)
}

fn without_help_subcommands(command: clap::Command) -> clap::Command {
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names
        .iter()
        .fold(command.disable_help_subcommand(true), |c, name| {
            c.mut_subcommand(name, without_help_subcommands)
        })
}

/// The pages clap_mangen wrote for `command` and its subcommands (it does not list them).
fn pages(command: &clap::Command, name: &str, dir: &Path, files: &mut Vec<PathBuf>) {
    files.push(dir.join(format!("{name}.1")));
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, &format!("{name}-{}", sub.get_name()), dir, files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> clap::Command {
        clap::Command::new("demo")
            .about("A demo")
            .arg(clap::Arg::new("level").long("level").help("How loud"))
            .subcommand(
                clap::Command::new("run").arg(clap::Arg::new("fast").long("fast").num_args(0)),
            )
    }

    #[test]
    fn every_page_and_completion_is_written_and_names_its_options() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(example(), dir.path()).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["demo.1", "demo-run.1", "demo.bash", "_demo", "demo.fish"]
        );
        for f in &files {
            assert!(f.is_file(), "{} was not written", f.display());
        }
        let page = std::fs::read_to_string(dir.path().join("demo.1")).unwrap();
        assert!(page.contains("level"), "{page}");
        let sub = std::fs::read_to_string(dir.path().join("demo-run.1")).unwrap();
        assert!(sub.contains("fast"), "{sub}");
        let bash = std::fs::read_to_string(dir.path().join("demo.bash")).unwrap();
        assert!(bash.contains("--level"), "{bash}");
    }
}
