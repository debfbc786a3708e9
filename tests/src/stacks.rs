//! Real upstream stacks that read request paths their own way, for the HTTP bypass catalogue
//! (`tests/tests/proxy_http/stacks.rs`). Each is an inventory service, started as a throwaway
//! process: `PUT /inventory/<sku>` stores the body under the sku, `GET` answers it.
//!
//! - [`Stack::wsgi`]: the standard library's WSGI server (`tests/stacks/wsgi_store.py`): the
//!   path percent-decoded before routing, as Flask, Django and gunicorn apps see it;
//! - [`Stack::node`]: Node.js's `http` module routing `new URL()`'s path as Express does
//!   (`tests/stacks/url_store.js`): `\` is `/`, `#` ends the path, case is ignored;
//! - [`Stack::nginx`]: nginx storing PUT bodies as files (WebDAV, with COPY and MOVE to the
//!   path a `Destination` header names): the path decoded and normalised before it names a
//!   file.
//!
//! A missing interpreter or server fails the test with the command that installs it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use crate::{PATIENCE, Spawned, free_loopback_addr, workspace};

/// One running stack.
pub struct Stack {
    pub name: &'static str,
    /// `host:port`.
    pub addr: String,
    _process: Spawned,
}

impl Stack {
    /// The WSGI service, on the `python3` first on PATH.
    pub fn wsgi() -> Stack {
        let mut cmd = Command::new("python3");
        cmd.arg(workspace().join("tests/stacks/wsgi_store.py"));
        Stack::printing_its_port("the WSGI service (python3)", cmd)
    }

    /// The Node.js service, on the `node` first on PATH.
    pub fn node() -> Stack {
        let mut cmd = Command::new("node");
        cmd.arg(workspace().join("tests/stacks/url_store.js"));
        Stack::printing_its_port("the Node.js service (node)", cmd)
    }

    fn printing_its_port(name: &'static str, cmd: Command) -> Stack {
        let program = cmd.get_program().to_string_lossy().into_owned();
        assert!(
            Command::new(&program).arg("--version").output().is_ok(),
            "{program} is needed for {name}: ./x deps"
        );
        let process = Spawned::spawn(cmd);
        let port = process
            .stdout
            .wait_for(&format!("{name} to print its port"), |l| {
                l.parse::<u16>().is_ok()
            });
        Stack {
            name,
            addr: format!("127.0.0.1:{port}"),
            _process: process,
        }
    }

    /// nginx with its files under `dir`.
    pub fn nginx(dir: &Path) -> Stack {
        let nginx = Path::new("/usr/sbin/nginx");
        assert!(
            nginx.is_file(),
            "nginx is needed: apt-get install nginx (./x deps)"
        );
        let addr = free_loopback_addr();
        for sub in ["www", "tmp"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let d = dir.display();
        let conf = dir.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log stderr notice;\n\
                 events {{ worker_connections 64; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n\
                 proxy_temp_path {d}/tmp/proxy;\n  fastcgi_temp_path {d}/tmp/fastcgi;\n\
                 uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n\
                 server {{\n    listen {addr};\n    root {d}/www;\n\
                 location / {{ dav_methods PUT DELETE MKCOL COPY MOVE; create_full_put_path on; }}\n  }}\n}}\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new(nginx);
        cmd.arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .args(["-e", "stderr"]);
        let process = Spawned::spawn(cmd);
        // It names its event method once its listening socket is open.
        process
            .stderr
            .wait_for("nginx to start", |l| l.contains("event method"));
        Stack {
            name: "nginx",
            addr,
            _process: process,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the stack holds for `sku`, asked of it directly.
    pub fn stored(&self, sku: &str) -> Option<String> {
        let (status, body) = exchange(&self.addr, "GET", &format!("/inventory/{sku}"), "", "");
        match status {
            200 => Some(body),
            404 => None,
            other => panic!("{} answered {other} to a read of {sku}: {body}", self.name),
        }
    }
}

/// Sends `method target` with the `headers` lines (each ending in CRLF) and `body` to `addr` as
/// raw bytes, so that no client library tidies the target first; returns the status and body.
pub fn exchange(
    addr: &str,
    method: &str,
    target: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: shop\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    s.write_all(&bytes).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}
