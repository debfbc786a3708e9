//! The byte form of a stored lease record (redb values).
//!
//! ```text
//! u8   record version (1)
//! [16] lease id
//! u64  token            (big-endian, like every integer here)
//! u64  ttl_ms
//! u16  resource length, then the bytes
//! u16  holder length, then the bytes
//! u8   0 = no request id | 1 = u16 length, then the bytes
//! ```
//!
//! A reentrant lease's record is version 2: the same, then
//!
//! ```text
//! u16  owner length, then the bytes
//! u32  holds
//! u8   0 = no re-entry request id | 1 = u16 length, then the bytes
//! ```
//!
//! A semaphore's permit is version 3: version 1's fields, then
//!
//! ```text
//! u32  permits (1 ..= limits::PERMITS_MAX, the semaphore's number of permits)
//! ```
//!
//! (a permit is never reentrant). A read-write lock's lease is version 4: version 1's fields,
//! then
//!
//! ```text
//! u8   1 = a reader (on a reader's slot, NAME@read-K) | 2 = the writer (on NAME)
//! ```
//!
//! (never reentrant, never a permit). A lease without an owner, permits or side is still
//! written as version 1, so that files written before reentrant leases existed, and the
//! leases that are none of these, read the same.
//!
//! Decoding is strict: every field is validated and the record must end exactly where its last
//! field does, so that a torn or foreign value is reported as corruption, not misread.

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Reentrant, RwRole};

use crate::StoreError;

const RECORD_VERSION: u8 = 1;
/// With the reentrant part.
const RECORD_VERSION_REENTRANT: u8 = 2;
/// With the semaphore's number of permits.
const RECORD_VERSION_PERMIT: u8 = 3;
/// With the read-write lock's side.
const RECORD_VERSION_RW: u8 = 4;

pub(crate) fn encode(rec: &LeaseRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + rec.resource.as_str().len() + rec.holder.len());
    out.push(match (&rec.reentrant, rec.permits, rec.rw) {
        (None, None, None) => RECORD_VERSION,
        (Some(_), None, None) => RECORD_VERSION_REENTRANT,
        (None, Some(_), None) => RECORD_VERSION_PERMIT,
        (None, None, Some(_)) => RECORD_VERSION_RW,
        _ => unreachable!("the core grants one kind of lease at a time"),
    });
    out.extend_from_slice(rec.lease_id.as_bytes());
    out.extend_from_slice(&rec.token.get().to_be_bytes());
    out.extend_from_slice(&rec.ttl_ms.to_be_bytes());
    put_str(&mut out, rec.resource.as_str());
    put_str(&mut out, &rec.holder);
    match &rec.request_id {
        None => out.push(0),
        Some(id) => {
            out.push(1);
            put_str(&mut out, id);
        }
    }
    if let Some(r) = &rec.reentrant {
        put_str(&mut out, &r.owner);
        out.extend_from_slice(&r.holds.to_be_bytes());
    }
    if let Some(n) = rec.permits {
        out.extend_from_slice(&n.to_be_bytes());
    }
    match rec.rw {
        None => {}
        Some(RwRole::Read) => out.push(1),
        Some(RwRole::Write) => out.push(2),
    }
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Names, holders and request ids are bounded far below 64 KiB by the core's limits.
    let len = u16::try_from(s.len()).expect("stored strings are shorter than 64 KiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn decode(bytes: &[u8]) -> Result<LeaseRecord, StoreError> {
    let mut r = Reader { bytes, at: 0 };
    let version = r.u8()?;
    if !(RECORD_VERSION..=RECORD_VERSION_RW).contains(&version) {
        return Err(corrupt(format!(
            "lease record version {version}, expected {RECORD_VERSION} ..= {RECORD_VERSION_RW}"
        )));
    }
    let lease_id = LeaseId::from_bytes(r.take(16)?.try_into().expect("16 bytes"));
    let token = FencingToken::new(r.u64()?).ok_or_else(|| corrupt("token out of range".into()))?;
    let ttl_ms = r.u64()?;
    let resource =
        ResourceName::new(r.str()?).map_err(|e| corrupt(format!("resource name: {e}")))?;
    let holder = r.str()?.to_string();
    let request_id = match r.u8()? {
        0 => None,
        1 => Some(r.str()?.to_string()),
        other => return Err(corrupt(format!("request id flag {other}"))),
    };
    let reentrant = match version {
        RECORD_VERSION_REENTRANT => Some(Reentrant {
            owner: r.str()?.to_string(),
            holds: u32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes")),
        }),
        _ => None,
    };
    let permits = match version {
        RECORD_VERSION_PERMIT => Some(u32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes"))),
        _ => None,
    };
    let rw = match version {
        RECORD_VERSION_RW => match r.u8()? {
            1 => Some(RwRole::Read),
            2 => Some(RwRole::Write),
            other => return Err(corrupt(format!("read-write side {other}"))),
        },
        _ => None,
    };
    if r.at != bytes.len() {
        return Err(corrupt(format!(
            "{} trailing bytes after a lease record",
            bytes.len() - r.at
        )));
    }
    Ok(LeaseRecord {
        resource,
        lease_id,
        token,
        holder,
        ttl_ms,
        request_id,
        reentrant,
        permits,
        rw,
    })
}

fn corrupt(what: String) -> StoreError {
    StoreError::Corrupt(what)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt("lease record is truncated".into()))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> Result<&'a str, StoreError> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes"));
        std::str::from_utf8(self.take(len.into())?)
            .map_err(|_| corrupt("string is not UTF-8".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(request_id: Option<&str>) -> LeaseRecord {
        LeaseRecord {
            resource: ResourceName::new("inventory:sku-1").unwrap(),
            lease_id: LeaseId::from_bytes([7; 16]),
            token: FencingToken::new(42).unwrap(),
            holder: "web-1 pid 7 ünïcode".into(),
            ttl_ms: 30_000,
            request_id: request_id.map(str::to_string),
            reentrant: None,
            permits: None,
            rw: None,
        }
    }

    fn reentrant(request_id: Option<&str>) -> LeaseRecord {
        LeaseRecord {
            reentrant: Some(Reentrant {
                owner: "worker-7".into(),
                holds: 3,
            }),
            ..record(request_id)
        }
    }

    fn permit() -> LeaseRecord {
        LeaseRecord {
            resource: ResourceName::new("jobs@permit-3").unwrap(),
            permits: Some(8),
            ..record(Some("req-1"))
        }
    }

    #[test]
    fn a_permit_is_version_3_and_appends_its_semaphores_permits() {
        let plain = encode(&LeaseRecord {
            permits: None,
            ..permit()
        });
        let bytes = encode(&permit());
        assert_eq!(bytes[0], 3);
        assert_eq!(bytes[1..plain.len()], plain[1..]);
        assert_eq!(bytes[plain.len()..], 8u32.to_be_bytes());
        for len in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..len]), Err(StoreError::Corrupt(_))),
                "prefix of {len} bytes of a permit"
            );
        }
    }

    fn side(rw: RwRole) -> LeaseRecord {
        LeaseRecord {
            resource: ResourceName::new("doc@read-2").unwrap(),
            rw: Some(rw),
            ..record(Some("req-1"))
        }
    }

    #[test]
    fn a_read_write_lease_is_version_4_and_appends_its_side() {
        let plain = encode(&LeaseRecord {
            rw: None,
            ..side(RwRole::Read)
        });
        for (rw, byte) in [(RwRole::Read, 1u8), (RwRole::Write, 2)] {
            let bytes = encode(&side(rw));
            assert_eq!(bytes[0], 4);
            assert_eq!(bytes[1..plain.len()], plain[1..]);
            assert_eq!(bytes[plain.len()..], [byte]);
            for len in 0..bytes.len() {
                assert!(
                    matches!(decode(&bytes[..len]), Err(StoreError::Corrupt(_))),
                    "prefix of {len} bytes of a read-write lease"
                );
            }
            let mut bad = bytes.clone();
            *bad.last_mut().unwrap() = 3;
            assert!(matches!(decode(&bad), Err(StoreError::Corrupt(_))));
        }
    }

    #[test]
    fn round_trips() {
        for rec in [
            record(None),
            record(Some("req-1")),
            reentrant(None),
            reentrant(Some("req-1")),
            permit(),
            side(RwRole::Read),
            side(RwRole::Write),
        ] {
            assert_eq!(decode(&encode(&rec)).unwrap(), rec);
        }
    }

    #[test]
    fn a_reentrant_record_is_version_2_and_appends_its_part() {
        let plain = encode(&record(Some("q")));
        let bytes = encode(&reentrant(Some("q")));
        assert_eq!(bytes[0], 2);
        assert_eq!(bytes[1..plain.len()], plain[1..]);
        let mut tail = vec![0, 8];
        tail.extend(b"worker-7");
        tail.extend(3u32.to_be_bytes());
        assert_eq!(bytes[plain.len()..], tail);
    }

    #[test]
    fn the_byte_layout_is_stable() {
        // A fixture: changing the layout must change RECORD_VERSION (and migrate), not this.
        let bytes = encode(&record(Some("q")));
        let mut expected = vec![1];
        expected.extend([7; 16]);
        expected.extend(42u64.to_be_bytes());
        expected.extend(30_000u64.to_be_bytes());
        expected.extend([0, 15]);
        expected.extend(b"inventory:sku-1");
        expected.extend([0, 21]);
        expected.extend("web-1 pid 7 ünïcode".as_bytes());
        expected.extend([1, 0, 1, b'q']);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn every_truncation_and_extension_is_reported_as_corruption() {
        let bytes = encode(&record(Some("req-1")));
        let owned = encode(&reentrant(Some("req-1")));
        for len in 0..owned.len() {
            assert!(
                matches!(decode(&owned[..len]), Err(StoreError::Corrupt(_))),
                "prefix of {len} bytes of a reentrant record"
            );
        }
        for len in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..len]), Err(StoreError::Corrupt(_))),
                "prefix of {len} bytes"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(StoreError::Corrupt(_))));
        let mut bad_version = bytes.clone();
        bad_version[0] = 9;
        assert!(matches!(decode(&bad_version), Err(StoreError::Corrupt(_))));
        let mut zero_token = bytes;
        zero_token[17..25].copy_from_slice(&0u64.to_be_bytes());
        assert!(matches!(decode(&zero_token), Err(StoreError::Corrupt(_))));
    }
}
