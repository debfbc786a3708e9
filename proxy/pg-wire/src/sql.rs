//! Just enough SQL lexing to find where the statements of a simple Query begin and end, and
//! what kind of statement each one is, so that the relay can tell where a transaction begins
//! and where it commits.
//!
//! What the relay builds on this must be *fail closed*: a statement this module cannot place in
//! a known kind is [`Kind::Data`] (it may read or write, and may change the session's settings),
//! which is what gets checked. Only statements recognised by their leading keywords are
//! anything else. So the only way to be wrong in the unsafe direction would be to split a
//! query string where PostgreSQL does not, or to miss a split it makes: the scanner follows
//! PostgreSQL's lexer (`scan.l`) for everything that can hold a `;` that ends nothing:
//!
//! - quoted strings, with `''`; backslash escapes in `E'...'`, and in plain `'...'` too when the
//!   session has `standard_conforming_strings = off` ([`Lexing::standard_strings`]); `U&'...'`,
//!   `B'...'`, `X'...'`, `N'...'`;
//! - quoted identifiers (`"..."`, `U&"..."`), dollar-quoted strings (`$tag$...$tag$`, where a
//!   `$` inside an identifier or a `$1` parameter starts none);
//! - `--` comments to the end of the line and nested `/* */` comments;
//! - SQL-standard function bodies (`CREATE FUNCTION ... BEGIN ATOMIC ...; END`), where the
//!   semicolons end statements of the body, not the query (as psql does it: `CASE` and `END`
//!   counted inside the body);
//! - white space as PostgreSQL 16 has it (space, tab, newline, carriage return, form feed,
//!   vertical tab), so that no keyword hides behind a byte this scanner would not skip;
//! - the client-only multibyte encodings (SJIS, BIG5, GBK, UHC, GB18030, JOHAB), whose second
//!   byte can be `\`: inside an escape string a lead byte takes the next byte with it
//!   ([`Encoding`]).
//!
//! Unterminated quotes and comments run to the end of the text, as they do for PostgreSQL (which
//! then reports the syntax error itself, and runs nothing).

/// How the session's text is to be read: from the server's `ParameterStatus` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lexing {
    /// `standard_conforming_strings`: when off, backslashes escape in plain `'...'` strings.
    pub standard_strings: bool,
    pub encoding: Encoding,
}

impl Default for Lexing {
    fn default() -> Lexing {
        Lexing {
            standard_strings: true,
            encoding: Encoding::AsciiSafe,
        }
    }
}

/// The client encoding, as far as lexing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// UTF8 and every other encoding in which a byte below 0x80 is always that ASCII character.
    AsciiSafe,
    /// Shift JIS (`SJIS`, `SHIFT_JIS_2004`): lead bytes 0x81-0x9F and 0xE0-0xFC.
    Sjis,
    /// BIG5, GBK, UHC, GB18030: lead bytes 0x81-0xFE (GB18030's four-byte characters are two
    /// such pairs).
    DoubleByte,
    /// JOHAB: lead bytes 0x84-0xD3, 0xD8-0xDE, 0xE0-0xF9.
    Johab,
}

impl Encoding {
    /// From the name PostgreSQL reports for `client_encoding`.
    pub fn from_name(name: &[u8]) -> Encoding {
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("SJIS") || is("SHIFT_JIS_2004") {
            Encoding::Sjis
        } else if is("BIG5") || is("GBK") || is("UHC") || is("GB18030") {
            Encoding::DoubleByte
        } else if is("JOHAB") {
            Encoding::Johab
        } else {
            Encoding::AsciiSafe
        }
    }

    /// Whether `b` starts a two-byte character (whose second byte may look like ASCII).
    fn lead(self, b: u8) -> bool {
        match self {
            Encoding::AsciiSafe => false,
            Encoding::Sjis => matches!(b, 0x81..=0x9f | 0xe0..=0xfc),
            Encoding::DoubleByte => matches!(b, 0x81..=0xfe),
            Encoding::Johab => matches!(b, 0x84..=0xd3 | 0xd8..=0xde | 0xe0..=0xf9),
        }
    }
}

/// What a statement does, as far as the fence cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// Ends the transaction by committing it: `COMMIT`, `END`, and `PREPARE TRANSACTION` (the
    /// prepared transaction keeps its locks until `COMMIT PREPARED`). `chain`: `AND CHAIN`, a
    /// new transaction begins at once.
    Commit { chain: bool },
    /// `ROLLBACK`, `ABORT` (not `ROLLBACK TO`).
    Rollback { chain: bool },
    /// `ROLLBACK TO [SAVEPOINT]`: undoes settings made since the savepoint and releases the
    /// locks taken since, the check's own included.
    RollbackTo,
    /// `SAVEPOINT`, `RELEASE`.
    Savepoint,
    /// Changes settings and touches no data: `SET` (not `SET CONSTRAINTS`), `RESET`, `DISCARD`.
    Settings,
    /// Touches neither data nor settings and runs no user code: `SHOW`, `LISTEN`, `UNLISTEN`,
    /// `NOTIFY`, `DEALLOCATE`, `PREPARE name AS` (which only defines), `CLOSE`, `CHECKPOINT`,
    /// and an empty statement.
    Inert,
    /// Cannot run inside a transaction block or a pipeline, so no check can share its
    /// transaction, and writes no rows: `VACUUM`, `CLUSTER` of the whole database, `REINDEX`
    /// of a database or system or `CONCURRENTLY`, `CREATE`/`DROP DATABASE` and `TABLESPACE`,
    /// `CREATE`/`DROP INDEX CONCURRENTLY`, `ALTER SYSTEM`, the subscription commands, `COMMIT
    /// PREPARED`, `ROLLBACK PREPARED` (the transaction it ends was checked before its `PREPARE
    /// TRANSACTION`). `CLUSTER t` and `REINDEX TABLE t` run in a transaction: they are `Data`.
    Standalone,
    /// `COPY ... FROM STDIN`: data, whose copy data follows the Query (so nothing may be sent
    /// between the Query and that data).
    CopyIn,
    /// Anything else: it may read or write data, and may change the session's settings (any
    /// function it calls, any trigger it fires may call `set_config`).
    Data,
    /// A statement whose text the relay does not know (bound to a prepared statement it never
    /// saw parsed, or whose name SQL `PREPARE` may have reused): it may be anything, a `COMMIT`
    /// included. [`classify`] never returns it.
    Unknown,
}

/// How the relay treats a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub kind: Kind,
    /// Its text mentions `fencing` or `set_config`: it very likely changes the fencing
    /// settings, so the next statement that touches data is checked again, at once.
    pub mentions_settings: bool,
    /// It may drop or replace the relay's prepared statements: it mentions `deallocate`,
    /// `discard` or `__fence_proxy`.
    pub drops_statements: bool,
}

impl Class {
    /// A statement the relay knows nothing about ([`Kind::Unknown`]).
    pub const UNKNOWN: Class = Class {
        kind: Kind::Unknown,
        mentions_settings: true,
        drops_statements: false,
    };
}

/// One statement of a query string: `text[start..end]`, the trailing `;` included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statement {
    pub start: usize,
    pub end: usize,
    pub class: Class,
}

/// A token of the scanner: a word (keyword or unquoted identifier), a `;`, or anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Word { start: usize, end: usize },
    Semi,
    Other,
}

struct Scanner<'a> {
    t: &'a [u8],
    i: usize,
    lexing: Lexing,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

fn ident_cont(b: u8) -> bool {
    ident_start(b) || b.is_ascii_digit() || b == b'$'
}

impl Scanner<'_> {
    fn peek(&self, k: usize) -> Option<u8> {
        self.t.get(self.i + k).copied()
    }

    /// Skips white space and comments.
    fn skip_blank(&mut self) {
        loop {
            match (self.peek(0), self.peek(1)) {
                (Some(c), _) if is_space(c) => self.i += 1,
                (Some(b'-'), Some(b'-')) => {
                    while self.peek(0).is_some_and(|c| c != b'\n' && c != b'\r') {
                        self.i += 1;
                    }
                }
                (Some(b'/'), Some(b'*')) => self.skip_block_comment(),
                _ => return,
            }
        }
    }

    fn skip_block_comment(&mut self) {
        let mut depth = 0usize;
        while self.i < self.t.len() {
            if self.t[self.i..].starts_with(b"/*") {
                depth += 1;
                self.i += 2;
            } else if self.t[self.i..].starts_with(b"*/") {
                depth -= 1;
                self.i += 2;
                if depth == 0 {
                    return;
                }
            } else {
                self.i += 1;
            }
        }
    }

    /// At a quote: skips the string or quoted identifier. `escapes`: backslash escapes.
    fn skip_quoted(&mut self, quote: u8, escapes: bool) {
        self.i += 1;
        while let Some(c) = self.peek(0) {
            // A backslash escapes the next byte; so does a lead byte of a two-byte character
            // take its second byte, which may look like a backslash or a quote.
            if escapes && (c == b'\\' || self.lexing.encoding.lead(c)) {
                self.i += 2;
            } else if c == quote {
                if self.peek(1) == Some(quote) {
                    self.i += 2;
                } else {
                    self.i += 1;
                    return;
                }
            } else {
                self.i += 1;
            }
        }
        self.i = self.t.len();
    }

    /// At a `$` that is not inside an identifier: a dollar-quoted string, a parameter, or a
    /// lone `$`.
    fn skip_dollar(&mut self) {
        let start = self.i;
        let mut j = start + 1;
        if self.t.get(j).is_some_and(|c| c.is_ascii_digit()) {
            while self.t.get(j).is_some_and(|c| c.is_ascii_digit()) {
                j += 1;
            }
            self.i = j;
            return;
        }
        while self.t.get(j).is_some_and(|&c| ident_cont(c) && c != b'$') {
            j += 1;
        }
        if self.t.get(j) != Some(&b'$') {
            self.i = start + 1;
            return;
        }
        let tag = &self.t[start..=j];
        let body = j + 1;
        self.i = self.t[body..]
            .windows(tag.len())
            .position(|w| w == tag)
            .map_or(self.t.len(), |p| body + p + tag.len());
    }

    fn next(&mut self) -> Option<(usize, Tok)> {
        self.skip_blank();
        let start = self.i;
        let c = self.peek(0)?;
        let tok = match c {
            b';' => {
                self.i += 1;
                Tok::Semi
            }
            b'\'' => {
                self.skip_quoted(b'\'', !self.lexing.standard_strings);
                Tok::Other
            }
            b'"' => {
                self.skip_quoted(b'"', false);
                Tok::Other
            }
            b'$' => {
                self.skip_dollar();
                Tok::Other
            }
            _ if ident_start(c) => {
                while self.peek(0).is_some_and(ident_cont) {
                    self.i += 1;
                }
                let word = &self.t[start..self.i];
                match (word, self.peek(0), self.peek(1)) {
                    // E'...': an escape string.
                    ([b'e' | b'E'], Some(b'\''), _) => {
                        self.skip_quoted(b'\'', true);
                        Tok::Other
                    }
                    // B'...', X'...', N'...': standard quoting rules.
                    ([b'b' | b'B' | b'x' | b'X' | b'n' | b'N'], Some(b'\''), _) => {
                        self.skip_quoted(b'\'', !self.lexing.standard_strings);
                        Tok::Other
                    }
                    // U&'...' and U&"...": no backslash escapes in the quoting.
                    ([b'u' | b'U'], Some(b'&'), Some(q @ (b'\'' | b'"'))) => {
                        self.i += 1;
                        self.skip_quoted(q, false);
                        Tok::Other
                    }
                    _ => Tok::Word { start, end: self.i },
                }
            }
            _ if c.is_ascii_digit() => {
                while self
                    .peek(0)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
                {
                    self.i += 1;
                }
                Tok::Other
            }
            _ => {
                self.i += 1;
                Tok::Other
            }
        };
        Some((start, tok))
    }
}

/// The words of one statement that its kind is read from, and what it mentions.
#[derive(Default)]
struct Words<'a> {
    /// The first few words, in order (`words` of them, the rest empty), held inline: every
    /// Query is split, and a vector per statement was an allocation per statement on the
    /// relay's hottest path. `first_is_word` says whether the statement began with one.
    leading: [&'a [u8]; LEADING_WORDS],
    words: usize,
    first_is_word: bool,
    any_token: bool,
    index: bool,
    concurrently: bool,
    stdin: bool,
    from: bool,
    tablespace: bool,
}

const LEADING_WORDS: usize = 6;

fn eq(word: &[u8], keyword: &str) -> bool {
    word.eq_ignore_ascii_case(keyword.as_bytes())
}

impl<'a> Words<'a> {
    fn push(&mut self, tok: Tok, text: &'a [u8]) {
        let first = !self.any_token;
        self.any_token = true;
        let Tok::Word { start, end } = tok else {
            if first {
                self.first_is_word = false;
            }
            return;
        };
        let w = &text[start..end];
        if first {
            self.first_is_word = true;
        }
        if self.first_is_word && self.words < LEADING_WORDS {
            self.leading[self.words] = w;
            self.words += 1;
        }
        self.index |= eq(w, "index");
        self.concurrently |= eq(w, "concurrently");
        self.stdin |= eq(w, "stdin");
        self.from |= eq(w, "from");
        self.tablespace |= eq(w, "tablespace");
    }

    fn kind(&self) -> Kind {
        if !self.any_token {
            return Kind::Inert;
        }
        if !self.first_is_word {
            return Kind::Data;
        }
        let w = |i: usize| self.leading.get(i).copied().unwrap_or_default();
        let first = w(0);
        let is = |k: &str| eq(first, k);
        // After COMMIT / END / ABORT / ROLLBACK: [WORK | TRANSACTION], then what follows.
        let after_noise = if eq(w(1), "work") || eq(w(1), "transaction") {
            2
        } else {
            1
        };
        let chain = eq(w(after_noise), "and")
            && (eq(w(after_noise + 1), "chain")
                || (!eq(w(after_noise + 1), "no") && eq(w(after_noise + 2), "chain")));
        let create_or_drop = is("create") || is("drop");
        match () {
            _ if is("begin") => Kind::Begin,
            _ if is("start") && eq(w(1), "transaction") => Kind::Begin,
            _ if (is("commit") || is("rollback")) && eq(w(1), "prepared") => Kind::Standalone,
            _ if is("commit") || is("end") => Kind::Commit { chain },
            _ if is("prepare") && eq(w(1), "transaction") => Kind::Commit { chain: false },
            _ if is("rollback") && eq(w(after_noise), "to") => Kind::RollbackTo,
            _ if is("rollback") || is("abort") => Kind::Rollback { chain },
            _ if is("savepoint") || is("release") => Kind::Savepoint,
            _ if is("set") && eq(w(1), "constraints") => Kind::Data,
            _ if is("set") || is("reset") || is("discard") => Kind::Settings,
            _ if [
                "show",
                "listen",
                "unlisten",
                "notify",
                "deallocate",
                "close",
                "checkpoint",
            ]
            .iter()
            .any(|k| is(k)) =>
            {
                Kind::Inert
            }
            _ if is("prepare") => Kind::Inert,
            _ if is("vacuum") => Kind::Standalone,
            // Whole-database forms and CONCURRENTLY cannot run in a transaction block.
            _ if is("cluster") && (w(1).is_empty() || eq(w(1), "verbose") && w(2).is_empty()) => {
                Kind::Standalone
            }
            _ if is("reindex")
                && (self.concurrently
                    || (1..4)
                        .any(|i| ["database", "system", "schema"].iter().any(|k| eq(w(i), k)))) =>
            {
                Kind::Standalone
            }
            _ if create_or_drop && (eq(w(1), "database") || eq(w(1), "tablespace")) => {
                Kind::Standalone
            }
            _ if create_or_drop && self.index && self.concurrently => Kind::Standalone,
            _ if (create_or_drop || is("alter")) && eq(w(1), "subscription") => Kind::Standalone,
            _ if is("alter") && eq(w(1), "system") => Kind::Standalone,
            _ if is("alter") && eq(w(1), "database") && self.tablespace => Kind::Standalone,
            _ if is("copy") && self.from && self.stdin => Kind::CopyIn,
            _ => Kind::Data,
        }
    }
}

fn class_of(text: &[u8], words: &Words<'_>) -> Class {
    // One pass over the text for all five words (a statement can be long: one INSERT of many
    // rows).
    let mut found = [false; 5];
    const NEEDLES: [&[u8]; 5] = [
        b"fencing",
        b"set_config",
        b"deallocate",
        b"discard",
        b"__fence_proxy",
    ];
    for i in 0..text.len() {
        let c = text[i].to_ascii_lowercase();
        if !matches!(c, b'f' | b's' | b'd' | b'_') {
            continue;
        }
        for (n, needle) in NEEDLES.iter().enumerate() {
            if !found[n]
                && text[i..].len() >= needle.len()
                && text[i..i + needle.len()].eq_ignore_ascii_case(needle)
            {
                found[n] = true;
            }
        }
    }
    Class {
        kind: words.kind(),
        mentions_settings: found[0] || found[1],
        drops_statements: found[2] || found[3] || found[4],
    }
}

/// Classifies the text of one statement (a Parse's).
pub fn classify(text: &[u8]) -> Class {
    let mut scanner = Scanner {
        t: text,
        i: 0,
        lexing: Lexing::default(),
    };
    let mut words = Words::default();
    while let Some((_, tok)) = scanner.next() {
        if tok == Tok::Semi && !words.any_token {
            continue;
        }
        words.push(tok, text);
    }
    class_of(text, &words)
}

/// Whether `text` mentions the fencing settings at all.
pub fn mentions_fencing(text: &[u8]) -> bool {
    contains_ignore_case(text, b"fencing")
}

fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Splits a query string into its statements (empty ones left out), read as `lexing` says.
pub fn split(text: &[u8], lexing: Lexing) -> Vec<Statement> {
    let mut scanner = Scanner {
        t: text,
        i: 0,
        lexing,
    };
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut words = Words::default();
    // Inside a `BEGIN ATOMIC` body: how many `END`s are still to come.
    let mut depth = 0usize;
    let mut previous_word: &[u8] = &[];
    let finish = |start: usize, end: usize, words: &mut Words<'_>, out: &mut Vec<Statement>| {
        let body = &text[start..end];
        out.push(Statement {
            start,
            end,
            class: class_of(body, words),
        });
        *words = Words::default();
    };
    while let Some((at, tok)) = scanner.next() {
        if tok == Tok::Semi && depth == 0 {
            if let Some(s) = start.take() {
                finish(s, scanner.i, &mut words, &mut out);
            }
            previous_word = &[];
            continue;
        }
        start.get_or_insert(at);
        words.push(tok, text);
        if let Tok::Word { start: ws, end: we } = tok {
            let w = &text[ws..we];
            if depth > 0 {
                if eq(w, "case") {
                    depth += 1;
                } else if eq(w, "end") {
                    depth -= 1;
                }
            } else if eq(w, "atomic")
                && eq(previous_word, "begin")
                && eq(words.leading[0], "create")
            {
                depth = 1;
            }
            previous_word = w;
        }
    }
    if let Some(s) = start {
        finish(s, text.len(), &mut words, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        split(text.as_bytes(), Lexing::default())
            .iter()
            .map(|s| &text[s.start..s.end])
            .collect()
    }

    #[test]
    fn statements_end_at_semicolons_outside_quotes_and_comments() {
        assert_eq!(pieces("SELECT 1; SELECT 2"), ["SELECT 1;", "SELECT 2"]);
        assert_eq!(pieces(" ;; -- only a comment\n ; "), Vec::<&str>::new());
        assert_eq!(
            pieces("SELECT ';', \";\" /* ; /* nested ; */ ; */; SELECT 2;"),
            ["SELECT ';', \";\" /* ; /* nested ; */ ; */;", "SELECT 2;"]
        );
        assert_eq!(
            pieces("SELECT 'it''s;'; SELECT E'\\';'; SELECT 3"),
            ["SELECT 'it''s;';", "SELECT E'\\';';", "SELECT 3"]
        );
        assert_eq!(
            pieces("DO $x$ BEGIN PERFORM 1; END $x$; SELECT $$;$$; SELECT $1"),
            [
                "DO $x$ BEGIN PERFORM 1; END $x$;",
                "SELECT $$;$$;",
                "SELECT $1"
            ]
        );
        assert_eq!(pieces("SELECT a$b; SELECT 2"), ["SELECT a$b;", "SELECT 2"]);
        assert_eq!(
            pieces("SELECT U&'\\'; SELECT 2"),
            ["SELECT U&'\\';", "SELECT 2"]
        );
        assert_eq!(pieces("SELECT $1;$2"), ["SELECT $1;", "$2"]);
        // Unterminated: runs to the end.
        assert_eq!(pieces("SELECT 'abc; SELECT 2"), ["SELECT 'abc; SELECT 2"]);
        assert_eq!(pieces("SELECT 1 -- x; COMMIT"), ["SELECT 1 -- x; COMMIT"]);
        assert_eq!(
            pieces("SELECT 1 -- x\r; COMMIT"),
            ["SELECT 1 -- x\r;", "COMMIT"]
        );
    }

    #[test]
    fn sql_standard_function_bodies_keep_their_semicolons() {
        let text = "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; SELECT 2; END; COMMIT; UPDATE t SET v = 1";
        assert_eq!(
            pieces(text),
            [
                "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; SELECT 2; END;",
                "COMMIT;",
                "UPDATE t SET v = 1"
            ]
        );
        // ATOMIC elsewhere is a word like any other.
        assert_eq!(
            pieces("SELECT atomic FROM t; COMMIT"),
            ["SELECT atomic FROM t;", "COMMIT"]
        );
        assert_eq!(
            pieces("BEGIN; SELECT 1; END"),
            ["BEGIN;", "SELECT 1;", "END"]
        );
    }

    #[test]
    fn backslashes_escape_as_the_session_says() {
        let text = "SELECT 'a\\'; COMMIT; --'; UPDATE t SET v = 1";
        // standard_conforming_strings = on (the default): the string ends at the second quote,
        // and the rest of the line is a comment.
        assert_eq!(pieces(text), ["SELECT 'a\\';", "COMMIT;"]);
        let off = Lexing {
            standard_strings: false,
            ..Lexing::default()
        };
        let split_off: Vec<&str> = split(text.as_bytes(), off)
            .iter()
            .map(|s| &text[s.start..s.end])
            .collect();
        assert_eq!(
            split_off,
            ["SELECT 'a\\'; COMMIT; --';", "UPDATE t SET v = 1"]
        );
        // In SJIS, 0x95 0x5C is one character: its second byte escapes nothing.
        let sjis = Lexing {
            encoding: Encoding::from_name(b"SJIS"),
            ..Lexing::default()
        };
        let text = b"SELECT E'\x95\\'; COMMIT";
        assert_eq!(split(text, sjis).len(), 2);
        assert_eq!(split(text, Lexing::default()).len(), 1);
    }

    #[test]
    fn a_vertical_tab_hides_no_keyword() {
        let s = split(b"SELECT 1;\x0bCOMMIT", Lexing::default());
        assert_eq!(s[1].class.kind, Kind::Commit { chain: false });
    }

    #[test]
    fn kinds() {
        let k = |t: &str| classify(t.as_bytes()).kind;
        for t in [
            "UPDATE t SET v = 1",
            "  /* x */ (SELECT 1)",
            "with x as (select 1) delete from t",
            "SELECT set_config('fencing.token', '7', false)",
            "CALL p()",
            "DO $$ BEGIN END $$",
            "EXPLAIN ANALYZE UPDATE t SET v = 1",
            "SET CONSTRAINTS ALL IMMEDIATE",
            "\"weird\"",
            "= 1",
            "COPY t FROM '/tmp/x'",
            "COPY t TO STDOUT",
            "LOAD 'x'",
            "EXECUTE s",
            "FETCH c",
            "START",
            "REFRESH MATERIALIZED VIEW CONCURRENTLY v",
        ] {
            assert_eq!(k(t), Kind::Data, "{t}");
        }
        let cases = [
            ("BEGIN", Kind::Begin),
            ("begin isolation level serializable", Kind::Begin),
            ("START TRANSACTION READ ONLY", Kind::Begin),
            ("COMMIT", Kind::Commit { chain: false }),
            ("end work", Kind::Commit { chain: false }),
            ("COMMIT AND CHAIN", Kind::Commit { chain: true }),
            ("COMMIT WORK AND NO CHAIN", Kind::Commit { chain: false }),
            ("PREPARE TRANSACTION 'x'", Kind::Commit { chain: false }),
            ("ROLLBACK", Kind::Rollback { chain: false }),
            ("abort and chain", Kind::Rollback { chain: true }),
            ("ROLLBACK TO SAVEPOINT a", Kind::RollbackTo),
            ("rollback transaction to a", Kind::RollbackTo),
            ("SAVEPOINT a", Kind::Savepoint),
            ("RELEASE a", Kind::Savepoint),
            ("SET fencing.token = '4'", Kind::Settings),
            ("SET LOCAL fencing.token TO 7", Kind::Settings),
            ("reset all", Kind::Settings),
            ("DISCARD ALL", Kind::Settings),
            ("SHOW fencing.token", Kind::Inert),
            ("PREPARE s AS UPDATE t SET v = 1", Kind::Inert),
            ("DEALLOCATE ALL", Kind::Inert),
            ("", Kind::Inert),
            (" -- nothing\n", Kind::Inert),
            ("VACUUM t", Kind::Standalone),
            ("CLUSTER", Kind::Standalone),
            ("REINDEX DATABASE d", Kind::Standalone),
            ("REINDEX TABLE CONCURRENTLY t", Kind::Standalone),
            ("CLUSTER t USING i", Kind::Data),
            ("REINDEX TABLE t", Kind::Data),
            ("CREATE DATABASE x", Kind::Standalone),
            (
                "create unique index concurrently i on t (v)",
                Kind::Standalone,
            ),
            ("DROP INDEX CONCURRENTLY i", Kind::Standalone),
            ("ALTER SYSTEM SET work_mem = '1MB'", Kind::Standalone),
            ("COMMIT PREPARED 'x'", Kind::Standalone),
            ("ROLLBACK PREPARED 'x'", Kind::Standalone),
            ("COPY t (a) FROM STDIN WITH (FORMAT csv)", Kind::CopyIn),
        ];
        for (t, kind) in cases {
            assert_eq!(k(t), kind, "{t}");
        }
        let c = |t: &str| classify(t.as_bytes());
        assert!(c("SELECT set_config($1, $2, false)").mentions_settings);
        assert!(c("select 1 -- FENCING").mentions_settings);
        assert!(!c("UPDATE t SET v = 1").mentions_settings);
        assert!(c("DISCARD ALL").drops_statements && c("deallocate x").drops_statements);
        assert!(c("PREPARE __fence_proxy_any AS SELECT 1").drops_statements);
        assert!(!c("SELECT 1").drops_statements);
    }
}
