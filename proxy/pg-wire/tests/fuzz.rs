//! The decoder against arbitrary bytes: random messages cut at random points must decode to the
//! same frames as when whole, and no input, valid or not, makes any parser panic.

use pg_wire::{Backend, Frontend, WireError, header, msg, parse_startup, sql, startup_len};
use proptest::prelude::*;

/// Splits a stream into frames the way the relay does, reading `chunks` one after another.
fn frames(chunks: &[&[u8]], max: usize) -> Result<Vec<(u8, Vec<u8>)>, WireError> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        while let Some(h) = header(&buf, max)? {
            if buf.len() < h.total {
                break;
            }
            let m: Vec<u8> = buf.drain(..h.total).collect();
            out.push((h.tag, m));
        }
    }
    Ok(out)
}

/// Every way a session's text can be read.
fn lexings() -> [sql::Lexing; 3] {
    [
        sql::Lexing::default(),
        sql::Lexing {
            standard_strings: false,
            ..sql::Lexing::default()
        },
        sql::Lexing {
            encoding: sql::Encoding::from_name(b"SJIS"),
            ..sql::Lexing::default()
        },
    ]
}

/// Every body parser on one message: none may panic, whatever the bytes.
fn parse_all(m: &[u8]) {
    let _ = Backend::decode(m);
    let _ = msg::data_row(m);
    match Frontend::decode(m) {
        Ok(Frontend::Query { text }) => {
            for lexing in lexings() {
                let _ = sql::split(text, lexing);
            }
        }
        Ok(Frontend::Parse { text, .. }) => {
            let _ = sql::classify(text);
        }
        _ => {}
    }
}

fn message() -> impl Strategy<Value = Vec<u8>> {
    let sqlish = proptest::collection::vec(
        prop_oneof![
            Just(b"SELECT 1".to_vec()),
            Just(b";".to_vec()),
            Just(b"'".to_vec()),
            Just(b"\"".to_vec()),
            Just(b"$$".to_vec()),
            Just(b"$a$".to_vec()),
            Just(b"--".to_vec()),
            Just(b"/*".to_vec()),
            Just(b"*/".to_vec()),
            Just(b"E'\\".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"SET fencing.token = '4'".to_vec()),
            Just(b"atomic".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..8),
        ],
        0..12,
    )
    .prop_map(|parts| {
        parts
            .concat()
            .into_iter()
            .filter(|&b| b != 0)
            .collect::<Vec<u8>>()
    });
    prop_oneof![
        sqlish.clone().prop_map(|t| {
            let mut m = Vec::new();
            msg::query(&mut m, &t);
            m
        }),
        (sqlish, proptest::collection::vec(any::<u8>(), 0..6)).prop_map(|(t, n)| {
            let mut m = Vec::new();
            msg::parse(
                &mut m,
                &n.iter().copied().filter(|&b| b != 0).collect::<Vec<_>>(),
                &t,
                &[23],
            );
            m
        }),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..5), 0..3).prop_map(
            |ps| {
                let mut m = Vec::new();
                let refs: Vec<&[u8]> = ps.iter().map(|p| p.as_slice()).collect();
                msg::bind(&mut m, b"", b"s", &refs);
                m
            }
        ),
        Just({
            let mut m = Vec::new();
            msg::execute(&mut m, b"", 0);
            m
        }),
        Just({
            let mut m = Vec::new();
            msg::sync(&mut m);
            m
        }),
        // Arbitrary tag and body, with a correct length.
        (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(tag, body)| {
            let mut m = vec![tag];
            m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
            m.extend_from_slice(&body);
            m
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn split_points_do_not_change_the_frames(
        messages in proptest::collection::vec(message(), 1..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let stream: Vec<u8> = messages.concat();
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut at = 0;
        for p in points {
            chunks.push(&stream[at..p]);
            at = p;
        }
        chunks.push(&stream[at..]);
        let whole = frames(&[&stream], usize::MAX).unwrap();
        let cut = frames(&chunks, usize::MAX).unwrap();
        prop_assert_eq!(&whole, &cut);
        prop_assert_eq!(whole.len(), messages.len());
        for ((_, m), original) in whole.iter().zip(&messages) {
            prop_assert_eq!(m, original);
            parse_all(m);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), max in 0usize..300) {
        let _ = frames(&[&bytes], max);
        let _ = startup_len(&bytes, max);
        let _ = parse_startup(&bytes);
        parse_all(&bytes);
        for lexing in lexings() {
            let _ = sql::split(&bytes, lexing);
        }
        let _ = sql::classify(&bytes);
    }

    #[test]
    fn statements_cover_the_text_in_order(text in proptest::collection::vec(any::<u8>(), 0..120)) {
        for lexing in lexings() {
            let mut end = 0;
            for s in sql::split(&text, lexing) {
                prop_assert!(s.start >= end && s.start < s.end && s.end <= text.len());
                end = s.end;
            }
        }
    }
}
