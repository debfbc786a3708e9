//! A PostgreSQL client that sends exactly what a test says, for what no driver at hand does:
//! start-up keys of any name (as asyncpg's `server_settings` and pgx's `RuntimeParams` send
//! them), the extended protocol with several Executes before one Sync (as JDBC batches do),
//! bound values for any statement; TLS after an SSLRequest or straight away (libpq 17's
//! `sslnegotiation=direct`). Blocking, trust authentication only, one message exchange at a
//! time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use pg_wire::{Backend, msg};

/// What PostgreSQL (through the proxy) answered to one exchange, up to its ReadyForQuery.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The rows' columns as text (NULL as `None`).
    pub rows: Vec<Vec<Option<String>>>,
    /// The SQLSTATE and message of each error.
    pub errors: Vec<(String, String)>,
    /// The message of each notice (as `client_min_messages` lets them through).
    pub notices: Vec<String>,
    /// The transaction status of the last ReadyForQuery.
    pub status: char,
}

impl Answer {
    /// The first error's SQLSTATE, or "" when there was none.
    pub fn code(&self) -> &str {
        self.errors.first().map_or("", |e| e.0.as_str())
    }
}

/// A byte stream Raw speaks over: TCP, or TLS over it.
trait Wire: Read + Write + Send {}
impl<T: Read + Write + Send> Wire for T {}

pub struct Raw {
    stream: Box<dyn Wire>,
    buf: Vec<u8>,
}

impl Tls {
    /// Verifying the server against the CA file `ca` as `127.0.0.1`, offering ALPN
    /// `postgresql`, after an SSLRequest.
    pub fn to_loopback(ca: &std::path::Path) -> Tls {
        Tls::with_alpn(ca, &[b"postgresql"], false)
    }

    /// As [`Tls::to_loopback`], offering `alpn`; `direct`: without an SSLRequest.
    pub fn with_alpn(ca: &std::path::Path, alpn: &[&[u8]], direct: bool) -> Tls {
        let files = tlsconf::ClientFiles {
            ca: Some(ca.to_path_buf()),
            ..Default::default()
        };
        Tls {
            config: tlsconf::client_config(&files, alpn).expect("a client configuration"),
            name: "127.0.0.1".into(),
            direct,
        }
    }
}

/// How [`Raw::connect_tls`] opens TLS.
pub struct Tls {
    pub config: std::sync::Arc<tlsconf::rustls::ClientConfig>,
    /// The name the server's certificate must carry.
    pub name: String,
    /// A TLS handshake straight away, without an SSLRequest.
    pub direct: bool,
}

/// A TCP connection with the harness's timeouts.
fn tcp(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream
        .set_read_timeout(Some(crate::PATIENCE))
        .expect("a read timeout");
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    stream
}

impl Raw {
    /// Connects to `addr` (host:port) as `postgres` to database `postgres`, with `params`
    /// added to the start-up packet.
    pub fn connect(addr: &str, params: &[(&str, &str)]) -> Raw {
        Raw::connect_as(addr, "postgres", params)
    }

    /// As `user`, to database `postgres` unless `params` names another.
    pub fn connect_as(addr: &str, user: &str, params: &[(&str, &str)]) -> Raw {
        let mut all: Vec<(&str, &str)> = vec![("user", user)];
        if !params.iter().any(|(k, _)| *k == "database") {
            all.push(("database", "postgres"));
        }
        all.extend_from_slice(params);
        Raw::connect_startup(addr, &all)
    }

    /// With exactly these start-up keys.
    pub fn connect_startup(addr: &str, params: &[(&str, &str)]) -> Raw {
        let stream = tcp(addr);
        let mut raw = Raw {
            stream: Box::new(stream),
            buf: Vec::new(),
        };
        raw.start(addr, params);
        raw
    }

    /// As `postgres` to database `postgres`, in TLS; the error says what failed (the answer
    /// to the SSLRequest, the handshake, or the start-up).
    pub fn connect_tls(addr: &str, tls: &Tls) -> Result<Raw, String> {
        Raw::connect_tls_with(addr, tls, &[])
    }

    /// As [`Raw::connect_tls`], with `params` added to the start-up packet.
    pub fn connect_tls_with(addr: &str, tls: &Tls, params: &[(&str, &str)]) -> Result<Raw, String> {
        let stream = tls_stream(addr, tls)?;
        let mut raw = Raw {
            stream: Box::new(stream),
            buf: Vec::new(),
        };
        let mut all: Vec<(&[u8], &[u8])> = vec![(b"user", b"postgres"), (b"database", b"postgres")];
        all.extend(params.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
        let mut packet = Vec::new();
        msg::startup(&mut packet, &all);
        raw.stream
            .write_all(&packet)
            .map_err(|e| format!("sending the start-up packet: {e}"))?;
        let answer = raw.try_answer()?;
        match answer.errors.first() {
            None => Ok(raw),
            Some(e) => Err(format!("start-up: {} {}", e.0, e.1)),
        }
    }

    /// Sends `bytes` in TLS (a cancel request, say) and reads until the server closes; an end
    /// without TLS's close_notify is an error, as libpq reports it.
    pub fn tls_exchange(addr: &str, tls: &Tls, bytes: &[u8]) -> Result<Vec<u8>, String> {
        let mut stream = tls_stream(addr, tls)?;
        stream.write_all(bytes).map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        stream
            .read_to_end(&mut got)
            .map_err(|e| format!("reading to the end: {e}"))?;
        Ok(got)
    }

    fn start(&mut self, addr: &str, params: &[(&str, &str)]) {
        let all: Vec<(&[u8], &[u8])> = params
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
            .collect();
        let mut packet = Vec::new();
        msg::startup(&mut packet, &all);
        self.send(&packet);
        let answer = self.answer();
        assert!(
            answer.errors.is_empty(),
            "start-up through {addr}: {answer:?}"
        );
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("writing to the proxy");
    }

    fn message(&mut self) -> Result<Vec<u8>, String> {
        loop {
            if let Ok(Some(h)) = pg_wire::header(&self.buf, usize::MAX)
                && self.buf.len() >= h.total
            {
                return Ok(self.buf.drain(..h.total).collect());
            }
            let mut chunk = [0u8; 16 << 10];
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| format!("reading from the proxy: {e}"))?;
            if n == 0 {
                return Err("the proxy closed the connection".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads up to and including the next ReadyForQuery.
    fn answer(&mut self) -> Answer {
        self.try_answer().unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_answer(&mut self) -> Result<Answer, String> {
        let mut a = Answer::default();
        loop {
            // A FATAL error is the last thing said: no ReadyForQuery follows it.
            let m = match self.message() {
                Ok(m) => m,
                Err(_) if !a.errors.is_empty() => return Ok(a),
                Err(e) => return Err(e),
            };
            match Backend::decode(&m).expect("a server message") {
                Backend::DataRow { message } => a.rows.push(
                    msg::data_row(message)
                        .expect("a data row")
                        .into_iter()
                        .map(|c| c.map(|c| String::from_utf8_lossy(c).into_owned()))
                        .collect(),
                ),
                Backend::Error(f) => a.errors.push((
                    String::from_utf8_lossy(f.code).into_owned(),
                    String::from_utf8_lossy(f.message).into_owned(),
                )),
                Backend::Notice => a.notices.push(
                    String::from_utf8_lossy(
                        msg::error_fields(&m).expect("a notice's fields").message,
                    )
                    .into_owned(),
                ),
                Backend::ReadyForQuery { status } => {
                    a.status = status as char;
                    return Ok(a);
                }
                _ => {}
            }
        }
    }

    /// Sends a simple Query without reading the answer ([`Raw::read_answer`] reads it).
    pub fn send_simple(&mut self, sql: &str) {
        let mut q = Vec::new();
        msg::query(&mut q, sql.as_bytes());
        self.send(&q);
    }

    /// Parse, Bind and Execute of `sql` (unnamed), and no Sync: PostgreSQL runs it and the
    /// implicit transaction stays open until a Sync that never comes (a client paused there).
    pub fn send_unsynced(&mut self, sql: &str) {
        let mut m = Vec::new();
        msg::parse(&mut m, b"", sql.as_bytes(), &[]);
        msg::bind(&mut m, b"", b"", &[]);
        msg::execute(&mut m, b"", 0);
        self.send(&m);
    }

    /// Reads the answer to what was sent, up to its ReadyForQuery (or a FATAL error).
    pub fn read_answer(&mut self) -> Answer {
        self.answer()
    }

    /// A simple Query.
    pub fn simple(&mut self, sql: &str) -> Answer {
        let mut m = Vec::new();
        msg::query(&mut m, sql.as_bytes());
        self.send(&m);
        self.answer()
    }

    /// Each statement parsed, bound with its text parameters and executed, all before one
    /// Sync (one implicit transaction unless they hold BEGIN).
    pub fn batch(&mut self, statements: &[(&str, &[&str])]) -> Answer {
        let mut m = Vec::new();
        for (sql, params) in statements {
            msg::parse(&mut m, b"", sql.as_bytes(), &[]);
            let params: Vec<&[u8]> = params.iter().map(|p| p.as_bytes()).collect();
            msg::bind(&mut m, b"", b"", &params);
            msg::execute(&mut m, b"", 0);
        }
        msg::sync(&mut m);
        self.send(&m);
        self.answer()
    }

    /// Prepares `sql` as the named statement `name` (Parse, Sync).
    pub fn prepare(&mut self, name: &str, sql: &str) -> Answer {
        let mut m = Vec::new();
        msg::parse(&mut m, name.as_bytes(), sql.as_bytes(), &[]);
        msg::sync(&mut m);
        self.send(&m);
        self.answer()
    }

    /// Binds and executes the named statement `name`, without parameters (Bind, Execute, Sync).
    pub fn execute_prepared(&mut self, name: &str) -> Answer {
        let mut m = Vec::new();
        msg::bind(&mut m, b"", name.as_bytes(), &[]);
        msg::execute(&mut m, b"", 0);
        msg::sync(&mut m);
        self.send(&m);
        self.answer()
    }

    /// A FunctionCall message (the fast-path interface libpq's large objects use): the
    /// function `oid` with text arguments, answered with a text result.
    pub fn function_call(&mut self, oid: u32, args: &[&str]) -> Answer {
        let mut body = Vec::new();
        body.extend_from_slice(&oid.to_be_bytes());
        body.extend_from_slice(&1u16.to_be_bytes()); // one format code for every argument:
        body.extend_from_slice(&0u16.to_be_bytes()); // text
        body.extend_from_slice(&(args.len() as u16).to_be_bytes());
        for a in args {
            body.extend_from_slice(&(a.len() as u32).to_be_bytes());
            body.extend_from_slice(a.as_bytes());
        }
        body.extend_from_slice(&0u16.to_be_bytes()); // the result, as text
        let mut m = vec![b'F'];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(&body);
        self.send(&m);
        self.answer()
    }

    /// One statement with bound parameters (Parse, Bind, Execute, Sync).
    pub fn extended(&mut self, sql: &str, params: &[&str]) -> Answer {
        self.batch(&[(sql, params)])
    }
}

/// A TLS connection to `addr` as [`Tls`] says, its handshake done.
fn tls_stream(
    addr: &str,
    tls: &Tls,
) -> Result<tlsconf::rustls::StreamOwned<tlsconf::rustls::ClientConnection, TcpStream>, String> {
    let mut stream = tcp(addr);
    if !tls.direct {
        let mut request = Vec::new();
        msg::ssl_request(&mut request);
        stream.write_all(&request).map_err(|e| e.to_string())?;
        let mut answer = [0u8; 1];
        stream
            .read_exact(&mut answer)
            .map_err(|e| format!("reading the answer to SSLRequest: {e}"))?;
        if answer[0] != b'S' {
            return Err(format!("SSLRequest answered {:?}", char::from(answer[0])));
        }
    }
    let name = tlsconf::rustls::pki_types::ServerName::try_from(tls.name.clone())
        .map_err(|e| e.to_string())?;
    let conn = tlsconf::rustls::ClientConnection::new(std::sync::Arc::clone(&tls.config), name)
        .map_err(|e| e.to_string())?;
    let mut stream = tlsconf::rustls::StreamOwned::new(conn, stream);
    while stream.conn.is_handshaking() {
        stream
            .conn
            .complete_io(&mut stream.sock)
            .map_err(|e| format!("TLS handshake: {e}"))?;
    }
    Ok(stream)
}
