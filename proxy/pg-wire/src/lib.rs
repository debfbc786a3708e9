//! The PostgreSQL frontend/backend protocol (version 3), as much of it as fence-proxy reads or
//! writes: framing ([`frame`]), the start-up packets, the client's messages ([`frontend`]) and
//! the server's ([`backend`]) decoded into typed enums (a tag byte means different things in
//! the two directions), the messages the relay writes itself ([`msg`]), and a lexical scanner
//! that finds statement boundaries and kinds in SQL text ([`sql`]).
//!
//! Everything here works on byte slices and never allocates more than the output it builds; no
//! I/O and no runtime, so it can be fed arbitrary bytes by the fuzz tests. Nothing here panics on
//! any input: malformed input is a [`WireError`].

pub mod backend;
pub mod frame;
pub mod frontend;
pub mod msg;
pub mod sql;

pub use backend::Backend;
pub use frame::{Header, Startup, header, parse_startup, startup_len};
pub use frontend::{Frontend, Target};

/// Why bytes could not be read as a protocol message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message length {0} is below the minimum of 4")]
    LengthTooSmall(u32),
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("malformed {0} message")]
    Malformed(&'static str),
    #[error("unknown message type {:?}", char::from(*.0))]
    UnknownMessage(u8),
    #[error("unsupported protocol version {major}.{minor}")]
    UnsupportedVersion { major: u16, minor: u16 },
}

/// Protocol version 3.0, the only major version PostgreSQL has spoken since 7.4.
pub const PROTOCOL_3: u32 = 196_608;
/// Start-up codes that are not protocol versions.
pub const SSL_REQUEST: u32 = 80_877_103;
pub const GSSENC_REQUEST: u32 = 80_877_104;
pub const CANCEL_REQUEST: u32 = 80_877_102;
