//! Just enough SQL lexing to find where statements begin and end in a simple Query, and what
//! kind of statement each is, so that the fence check can be placed before the first statement
//! that needs it and again after a statement that may change the session's token or end its
//! transaction.
//!
//! The scanner knows the places where a `;` does not end a statement: quoted strings (with
//! `''`, and backslash escapes in `E'...'`), quoted identifiers, dollar-quoted strings,
//! `--` and nested `/* */` comments. A SQL-standard function body (`BEGIN ATOMIC ... END`) holds
//! semicolons that do end nothing; such text is reported as not splittable ([`split`] returns
//! `None`) and the relay then treats it as one statement.

/// How the relay treats a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Class {
    /// It may read or write data, so the fence check must have run in its transaction before
    /// it. Transaction control, settings and the like do not (and must not be blocked by a
    /// failing check: a session with a stale token must still be able to `ROLLBACK` or `RESET`).
    pub needs_check: bool,
    /// After it, the check must run again before the next statement that needs one: it may end
    /// the transaction (`COMMIT`, `ROLLBACK`...) or change the session's fencing settings
    /// (it mentions `fencing`, `reset` or `discard`).
    pub recheck_after: bool,
    /// It may drop prepared statements (`DISCARD`, `DEALLOCATE`).
    pub drops_statements: bool,
    /// It may change the session's fencing settings: it mentions `fencing`, `reset` or
    /// `discard`, or it is a `ROLLBACK` (which undoes a `SET` made in the transaction).
    pub settings: bool,
    /// It mentions `fencing`: the session may have a token from now on.
    pub fencing: bool,
    /// It is a plain query or data change (`SELECT`, `INSERT`, `UPDATE`, `DELETE`, `MERGE`,
    /// `WITH`, `VALUES`, `TABLE`): it may follow extended-protocol messages in one
    /// transaction, reads no COPY data and is no transaction-block-only command.
    pub pipelinable: bool,
}

/// One statement of a query string: `text[start..end]`, the trailing `;` included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statement {
    pub start: usize,
    pub end: usize,
    pub class: Class,
}

const NO_CHECK: &[&str] = &[
    "abort",
    "begin",
    "commit",
    "deallocate",
    "discard",
    "end",
    "listen",
    "prepare",
    "release",
    "reset",
    "rollback",
    "savepoint",
    "set",
    "show",
    "start",
    "unlisten",
];
const ENDS_TRANSACTION: &[&str] = &["abort", "commit", "end", "prepare", "rollback"];
const PIPELINABLE: &[&str] = &[
    "delete", "insert", "merge", "select", "table", "update", "values", "with",
];

/// Classifies one statement's text.
pub fn classify(text: &[u8]) -> Class {
    let word = first_word(text);
    let is = |list: &[&str]| list.iter().any(|w| word.eq_ignore_ascii_case(w.as_bytes()));
    let fencing = mentions_fencing(text);
    let discard = contains_ignore_case(text, b"discard");
    let mentions = fencing || discard || contains_ignore_case(text, b"reset");
    Class {
        needs_check: !word.is_empty() && !is(NO_CHECK),
        recheck_after: mentions || is(ENDS_TRANSACTION),
        drops_statements: discard || contains_ignore_case(text, b"deallocate"),
        settings: mentions || is(&["rollback", "abort"]),
        fencing,
        pipelinable: is(PIPELINABLE),
    }
}

/// Whether `text` mentions the fencing settings at all (start-up options, or any statement).
pub fn mentions_fencing(text: &[u8]) -> bool {
    contains_ignore_case(text, b"fencing")
}

fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// The first keyword, after white space, comments and opening parentheses.
fn first_word(text: &[u8]) -> &[u8] {
    let mut i = 0;
    loop {
        i = skip_space_and_comments(text, i);
        if text.get(i) == Some(&b'(') {
            i += 1;
        } else {
            break;
        }
    }
    let start = i;
    while i < text.len() && (text[i].is_ascii_alphanumeric() || text[i] == b'_') {
        i += 1;
    }
    &text[start..i]
}

fn skip_space_and_comments(text: &[u8], mut i: usize) -> usize {
    loop {
        match (text.get(i), text.get(i + 1)) {
            (Some(c), _) if c.is_ascii_whitespace() => i += 1,
            (Some(b'-'), Some(b'-')) => {
                while i < text.len() && text[i] != b'\n' {
                    i += 1;
                }
            }
            (Some(b'/'), Some(b'*')) => i = skip_block_comment(text, i),
            _ => return i,
        }
    }
}

fn skip_block_comment(text: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < text.len() {
        if text[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if text[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// Splits a query string into its statements (empty ones left out), or `None` when the text
/// holds `BEGIN ATOMIC`. Unterminated quotes or comments run to the end of the text, as they do
/// for PostgreSQL (which then reports the syntax error itself).
pub fn split(text: &[u8]) -> Option<Vec<Statement>> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut stmt_start: Option<usize> = None;
    let n = text.len();
    while i < n {
        let c = text[i];
        let word_before = i > 0 && (is_ident(text[i - 1]) || text[i - 1] == b'$');
        match c {
            _ if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            b'-' if text.get(i + 1) == Some(&b'-') => {
                while i < n && text[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if text.get(i + 1) == Some(&b'*') => {
                i = skip_block_comment(text, i);
                continue;
            }
            b';' => {
                if let Some(start) = stmt_start.take() {
                    out.push(Statement {
                        start,
                        end: i + 1,
                        class: classify(&text[start..i]),
                    });
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        stmt_start.get_or_insert(i);
        match c {
            b'\'' => {
                let escapes = i > 0
                    && text[i - 1].eq_ignore_ascii_case(&b'e')
                    && (i < 2 || !is_ident(text[i - 2]));
                i = skip_quoted(text, i, b'\'', escapes);
            }
            b'"' => i = skip_quoted(text, i, b'"', false),
            b'$' if !word_before => {
                // $tag$ ... $tag$, or a parameter like $1.
                let mut j = i + 1;
                while j < n && is_ident(text[j]) && !(j == i + 1 && text[j].is_ascii_digit()) {
                    j += 1;
                }
                if j < n && text[j] == b'$' {
                    let tag = &text[i..=j];
                    let body = j + 1;
                    i = text[body..]
                        .windows(tag.len())
                        .position(|w| w == tag)
                        .map_or(n, |p| body + p + tag.len());
                } else {
                    i = j.max(i + 1);
                }
            }
            _ if is_ident(c) => {
                let start = i;
                while i < n && (is_ident(text[i]) || text[i] == b'$') {
                    i += 1;
                }
                if text[start..i].eq_ignore_ascii_case(b"atomic") {
                    return None;
                }
            }
            _ => i += 1,
        }
    }
    if let Some(start) = stmt_start {
        out.push(Statement {
            start,
            end: n,
            class: classify(&text[start..n]),
        });
    }
    Some(out)
}

fn skip_quoted(text: &[u8], mut i: usize, quote: u8, escapes: bool) -> usize {
    i += 1;
    while i < text.len() {
        let c = text[i];
        if escapes && c == b'\\' {
            i += 2;
        } else if c == quote {
            if text.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return i + 1;
            }
        } else {
            i += 1;
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        split(text.as_bytes())
            .unwrap()
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
        // Unterminated: runs to the end.
        assert_eq!(pieces("SELECT 'abc; SELECT 2"), ["SELECT 'abc; SELECT 2"]);
        assert_eq!(
            split(b"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END"),
            None
        );
    }

    #[test]
    fn classes() {
        let c = |t: &str| classify(t.as_bytes());
        assert!(c("UPDATE t SET v = 1").needs_check);
        assert!(c("  /* x */ (SELECT 1)").needs_check);
        assert!(c("with x as (select 1) delete from t").needs_check);
        for t in [
            "BEGIN",
            "commit",
            "ROLLBACK TO SAVEPOINT a",
            "SET fencing.token = '4'",
            "reset all",
            "SHOW fencing.token",
            "",
        ] {
            assert!(!c(t).needs_check, "{t}");
        }
        assert!(c("COMMIT").recheck_after);
        assert!(c("SET LOCAL fencing.token TO 7").recheck_after);
        assert!(c("SELECT set_config('fencing.token', '7', false)").recheck_after);
        assert!(c("SELECT set_config('fencing.token', '7', false)").needs_check);
        assert!(c("DISCARD ALL").recheck_after && c("DISCARD ALL").drops_statements);
        assert!(c("deallocate all").drops_statements);
        assert!(!c("UPDATE t SET v = 1").recheck_after);
        assert!(!c("BEGIN").recheck_after);
        assert!(c("RESET ALL").settings && c("set fencing.resource = 'x'").settings);
        assert!(!c("COMMIT").settings && !c("UPDATE t SET v = 1").settings);
        assert!(c("ROLLBACK TO SAVEPOINT a").settings);
        assert!(c("select set_config('FENCING.token', '1', false)").fencing);
        assert!(!c("RESET ALL").fencing && c("RESET ALL").settings);
        for t in [
            "UPDATE t SET v = 1",
            "(select 1)",
            "with x as (select 1) delete from t",
        ] {
            assert!(c(t).pipelinable, "{t}");
        }
        for t in [
            "COPY t FROM STDIN",
            "VACUUM",
            "CALL p()",
            "BEGIN",
            "DO $$ BEGIN END $$",
        ] {
            assert!(!c(t).pipelinable, "{t}");
        }
    }
}
