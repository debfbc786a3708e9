//! A throwaway PostgreSQL for the tests: `initdb` in a temporary directory, `postgres` on a free
//! loopback port, trust authentication, removed when dropped.
//!
//! PostgreSQL refuses to run as root, so as root the harness runs it as the `postgres` user
//! (switching user in the child itself, so that the process it signals is PostgreSQL and not a
//! wrapper). The binaries are looked for in `PG_BIN`, else `/usr/lib/postgresql/15/bin`; if
//! they are missing the test fails and says how to install them (never skipped).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Spawned, free_loopback_addr, output};

pub struct Postgres {
    pub port: u16,
    process: Spawned,
    dir: tempfile::TempDir,
    /// `shared_preload_libraries`, if any (the commit hook).
    preload: Option<PathBuf>,
}

/// fence_hook (proxy/pg-hook), built once per test process with the C compiler against the
/// server's headers (`pg_config --includedir-server`, from postgresql-server-dev-15), into a
/// directory the `postgres` user can read. Fails, saying how to install them, if they are
/// missing.
fn fence_hook() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proxy/pg-hook/fence_hook.c");
        let pg_config = bin_dir().join("pg_config");
        let (status, include, stderr) = output({
            let mut c = Command::new(&pg_config);
            c.arg("--includedir-server");
            c
        });
        assert!(status.success(), "{} failed: {stderr}", pg_config.display());
        let include = PathBuf::from(include.trim());
        assert!(
            include.join("postgres.h").is_file(),
            "PostgreSQL's server headers are not in {} (apt-get install postgresql-server-dev-15)",
            include.display()
        );
        // One build per version of the source, shared by the test processes (nextest runs each
        // test in its own): built under a name of this process's, then renamed into place.
        let text = std::fs::read(&source).expect("reading fence_hook.c");
        let hash = text.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        });
        let dir = std::env::temp_dir().join("e2e-fence-hook");
        std::fs::create_dir_all(&dir).expect("a directory for fence_hook.so");
        let lib = dir.join(format!("fence_hook-{hash:016x}.so"));
        if !lib.is_file() {
            let partial = dir.join(format!("building-{}.so", std::process::id()));
            let mut cc = Command::new("cc");
            cc.args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
                .arg(&include)
                .arg("-o")
                .arg(&partial)
                .arg(&source);
            let (status, _, stderr) = output(cc);
            assert!(status.success(), "building fence_hook.so failed: {stderr}");
            std::fs::rename(&partial, &lib).expect("moving fence_hook.so into place");
        }
        lib
    })
}

fn bin_dir() -> PathBuf {
    let dir = std::env::var_os("PG_BIN").map_or_else(
        || PathBuf::from("/usr/lib/postgresql/15/bin"),
        PathBuf::from,
    );
    assert!(
        dir.join("initdb").is_file() && dir.join("postgres").is_file(),
        "PostgreSQL binaries not found in {} (set PG_BIN, or install them: apt-get install postgresql-15)",
        dir.display()
    );
    dir
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The `postgres` user's uid and gid.
fn postgres_ids() -> (u32, u32) {
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam returns a pointer to static storage or NULL; we read two integers at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "there is no `postgres` user to run PostgreSQL as (install postgresql-15, which creates it)"
    );
    // SAFETY: checked non-null just above.
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

/// A new temporary directory, owned by the `postgres` user when we are root.
fn postgres_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    if is_root() {
        let (uid, gid) = postgres_ids();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
            .expect("handing the directory to postgres");
    }
    dir
}

/// `program`, as the `postgres` user when we are root.
fn as_postgres(program: &Path) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(program);
    if is_root() {
        let (uid, gid) = postgres_ids();
        c.uid(uid).gid(gid);
    }
    c
}

/// TLS for a throwaway PostgreSQL.
pub struct PgTls<'a> {
    /// Its certificate and key.
    pub server: &'a crate::certs::Pair,
    /// Client certificates are verified against this CA (for `clientcert=verify-full` and
    /// `cert` rules).
    pub client_ca: Option<&'a Path>,
}

impl PgTls<'_> {
    /// Copies the files into the data directory (the key readable by its owner only, as
    /// PostgreSQL demands) and turns `ssl` on.
    fn install(&self, data: &Path) {
        let copy = |from: &Path, name: &str, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            let to = data.join(name);
            std::fs::copy(from, &to).expect("copying a TLS file for PostgreSQL");
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
                .expect("setting its mode");
            if is_root() {
                let (uid, gid) = postgres_ids();
                std::os::unix::fs::chown(&to, Some(uid), Some(gid)).expect("handing it over");
            }
        };
        copy(&self.server.cert, "server.crt", 0o644);
        copy(&self.server.key, "server.key", 0o600);
        let mut conf =
            String::from("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        if let Some(ca) = self.client_ca {
            copy(ca, "root.crt", 0o644);
            conf.push_str("ssl_ca_file = 'root.crt'\n");
        }
        let path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).expect("reading postgresql.conf");
        text.push_str(&conf);
        std::fs::write(&path, text).expect("writing postgresql.conf");
    }
}

impl Postgres {
    pub fn start() -> Postgres {
        Postgres::start_with_hba(&[])
    }

    /// Starts PostgreSQL with `rules` placed before the trust rules of pg_hba.conf (for
    /// password authentication of particular roles).
    pub fn start_with_hba(rules: &[&str]) -> Postgres {
        Postgres::start_configured(rules, None, None)
    }

    /// Starts PostgreSQL with `ssl = on` and `tls`'s files, and `rules` before the trust rules
    /// (`hostnossl all all 0.0.0.0/0 reject` makes it take TLS connections only).
    pub fn start_tls(tls: &PgTls<'_>, rules: &[&str]) -> Postgres {
        Postgres::start_configured(rules, Some(tls), None)
    }

    fn start_configured(
        rules: &[&str],
        tls: Option<&PgTls<'_>>,
        preload: Option<PathBuf>,
    ) -> Postgres {
        let bin = bin_dir();
        let dir = postgres_tempdir();
        let data = dir.path().join("data");
        let mut initdb = as_postgres(&bin.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        let (status, _, stderr) = output(initdb);
        assert!(status.success(), "initdb failed: {stderr}");
        if let Some(tls) = tls {
            tls.install(&data);
        }
        if !rules.is_empty() {
            let hba = data.join("pg_hba.conf");
            let old = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
            std::fs::write(&hba, format!("{}\n{old}", rules.join("\n")))
                .expect("writing pg_hba.conf");
        }
        Postgres::launched(dir, preload)
    }

    /// Starts PostgreSQL with fence_hook loaded (`shared_preload_libraries`): it judges every
    /// commit by the fence check itself.
    /// Waits for the first line of the server's log that `pred` accepts, and returns it.
    pub fn wait_log(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.process.stderr.wait_for(what, pred)
    }

    pub fn start_with_hook() -> Postgres {
        Postgres::start_configured(&[], None, Some(fence_hook().to_path_buf()))
    }

    /// Crashes PostgreSQL (an immediate shutdown: no checkpoint, every session cut) and starts
    /// it again on the same port and data; returns once it accepts connections again, after
    /// crash recovery.
    pub fn restart(&mut self) {
        self.stop();
        self.resume();
    }

    /// An immediate shutdown; returns once PostgreSQL has exited (its port is then closed).
    pub fn stop(&mut self) {
        self.process.signal(libc::SIGQUIT);
        self.process.wait();
    }

    /// PostgreSQL started on `dir/data` on a free port; returns once it accepts connections.
    fn launched(dir: tempfile::TempDir, preload: Option<PathBuf>) -> Postgres {
        let port: u16 = free_loopback_addr()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let process = launch(dir.path(), port, preload.as_deref());
        Postgres {
            port,
            process,
            dir,
            preload,
        }
    }

    /// A hot standby of this server, streaming from it (pg_basebackup -R), with the same
    /// `shared_preload_libraries`; returns once it accepts read-only connections.
    pub fn standby(&self) -> Postgres {
        let dir = postgres_tempdir();
        let mut backup = as_postgres(&bin_dir().join("pg_basebackup"));
        backup
            .args(self.client_args())
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-R", "-X", "stream", "--no-sync", "--checkpoint", "fast"]);
        let (status, _, stderr) = output(backup);
        assert!(status.success(), "pg_basebackup failed: {stderr}");
        Postgres::launched(dir, self.preload.clone())
    }

    /// Stops PostgreSQL and starts it again on the same port and data, with the commit hook in
    /// `shared_preload_libraries` or without it (taken out of it).
    pub fn restart_with_hook(&mut self, loaded: bool) {
        self.stop();
        self.preload = loaded.then(|| fence_hook().to_path_buf());
        self.resume();
    }

    /// Starts PostgreSQL again after [`Postgres::stop`], on the same port and data; returns once
    /// it accepts connections.
    pub fn resume(&mut self) {
        self.process = launch(self.dir.path(), self.port, self.preload.as_deref());
    }

    /// Runs `program` (psql, pgbench...) from the PostgreSQL client tools with `args`.
    pub fn client_tool(program: &str) -> Command {
        let path = bin_dir().join(program);
        Command::new(if path.is_file() {
            path
        } else {
            PathBuf::from(program)
        })
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The host, port and user options of PostgreSQL's client tools, for this server.
    fn client_args(&self) -> [String; 6] {
        [
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
        ]
        .map(String::from)
    }

    /// Runs SQL with psql (a client we did not write) and returns its unaligned output.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_each(&[sql])
    }

    /// Runs each statement with psql, each in a transaction of its own (for `ALTER SYSTEM` and
    /// the like, which refuse to run inside one), in one session.
    pub fn psql_each(&self, statements: &[&str]) -> String {
        let mut cmd = Command::new("psql");
        cmd.args(self.client_args())
            .args(["-d", "postgres", "-X", "-tA", "-v", "ON_ERROR_STOP=1"]);
        for s in statements {
            cmd.args(["-c", s]);
        }
        let (status, stdout, stderr) = output(cmd);
        assert!(
            status.success(),
            "psql {} failed: {stderr}",
            match statements {
                [one] => format!("{one:?}"),
                all => format!("{all:?}"),
            }
        );
        stdout.trim().to_string()
    }

    /// Runs `sql` until it answers `expected` (each run is a round trip, nothing sleeps).
    pub fn wait_until(&self, what: &str, sql: &str, expected: &str) {
        let deadline = std::time::Instant::now() + crate::PATIENCE;
        loop {
            let got = self.psql(sql);
            if got == expected {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "gave up waiting for {what}: {sql:?} answers {got:?}"
            );
        }
    }
}

/// Starts `postgres` on `dir/data` and waits until it accepts connections.
fn launch(dir: &Path, port: u16, preload: Option<&Path>) -> Spawned {
    let mut cmd = as_postgres(&bin_dir().join("postgres"));
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args([
            "-p",
            &port.to_string(),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=300",
        ])
        .arg("-k")
        .arg(dir);
    if let Some(lib) = preload {
        cmd.arg("-c")
            .arg(format!("shared_preload_libraries={}", lib.display()));
    }
    let process = Spawned::spawn(cmd);
    process
        .stderr
        .wait_for("PostgreSQL to accept connections", |l| {
            // "... read-only connections" on a hot standby
            l.contains("ready to accept connections")
                || l.contains("ready to accept read-only connections")
        });
    process
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGQUIT (immediate shutdown), not SIGKILL: a killed postmaster leaves its System V
        // shared memory segment behind, and after a few thousand of them (kernel.shmmni)
        // no PostgreSQL on the machine can start. The process's own drop kills what is left.
        self.process
            .stop_quietly(libc::SIGQUIT, std::time::Duration::from_secs(10));
    }
}
