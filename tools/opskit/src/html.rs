//! The status pages' HTML: server-rendered, one self-contained document (the style and the one
//! script inline, no external assets), legible on a phone (a viewport, tables that scroll
//! sideways, large type), sortable (a click on a column's header sorts by it; the choice
//! survives the page's automatic refresh), and refreshed every 15 seconds unless the URL says
//! `refresh=0`.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

/// Seconds between automatic refreshes.
const REFRESH_S: u32 = 15;

const STYLE: &str = r#"
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--mute:#59636e;--line:#d1d9e0;--bad:#b3261e;--badbg:#fde7e6;--warn:#7a5200;--warnbg:#fff4d6;--ok:#1a7f37;--okbg:#e6f4ea;--head:#f2f4f7}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--mute:#9198a1;--line:#3d444d;--bad:#ff8a80;--badbg:#3b1214;--warn:#e3b341;--warnbg:#2f2405;--ok:#56d364;--okbg:#0f2a17;--head:#161b22}}
*{box-sizing:border-box}
body{margin:0;padding:12px;font:16px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;background:var(--bg);color:var(--fg)}
h1{font-size:1.4rem;margin:.2rem 0 .6rem}
h2{font-size:1.15rem;margin:1.4rem 0 .3rem}
p.note{color:var(--mute);margin:.2rem 0 .5rem;font-size:.9rem}
.banner{padding:.7rem 1rem;border-radius:6px;margin:.5rem 0;font-weight:600}
.banner.bad{background:var(--badbg);color:var(--bad);border:2px solid var(--bad)}
.banner.warn{background:var(--warnbg);color:var(--warn);border:1px solid var(--warn)}
.banner.ok{background:var(--okbg);color:var(--ok);border:1px solid var(--ok)}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(10rem,1fr));gap:.5rem;margin:.5rem 0}
dl.facts div{border:1px solid var(--line);border-radius:6px;padding:.4rem .6rem}
dl.facts dt{color:var(--mute);font-size:.8rem}
dl.facts dd{margin:0;font-size:1.2rem;font-weight:600;overflow-wrap:anywhere}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;border:1px solid var(--line);border-radius:6px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:.45rem .6rem;text-align:left;border-bottom:1px solid var(--line);white-space:nowrap}
td.wrap{white-space:normal;overflow-wrap:anywhere;min-width:7rem;max-width:24rem}
@media (max-width:600px){body{padding:8px}th,td{padding:.35rem .4rem}dl.facts{grid-template-columns:repeat(2,1fr)}dl.facts dd{font-size:1.05rem}}
th{background:var(--head);position:sticky;top:0;cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \25B2"}
th[aria-sort=descending]::after{content:" \25BC"}
td.bad{color:var(--bad);font-weight:600}
td.num,th.num{text-align:right}
footer{color:var(--mute);font-size:.85rem;margin-top:1.5rem}
a{color:inherit}
"#;

/// Sorting: a header's click sorts its table by the column (numbers by `data-key` when a
/// cell has one), remembered per table in sessionStorage and applied again after a refresh; a
/// URL's `#sort=TABLE:COLUMN:descending` (or `ascending`) sorts on load, so a sorted view can
/// be linked. `#layout-check` appends a hidden `<pre id="layout-report">` with the page's and
/// the viewport's widths, the body's font size and each table's first column (the page tests
/// read it from Chromium's DOM).
const SCRIPT: &str = r#"
(function(){
function key(td){var k=td.getAttribute('data-key');return k===null?td.textContent.trim().toLowerCase():parseFloat(k);}
function sort(table,col,dir){var body=table.tBodies[0];if(!body)return;var rows=Array.prototype.slice.call(body.rows);
rows.sort(function(a,b){var x=key(a.cells[col]),y=key(b.cells[col]);var c=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y));return dir==='ascending'?c:-c;});
rows.forEach(function(r){body.appendChild(r);});
Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){if(i===col)th.setAttribute('aria-sort',dir);else th.removeAttribute('aria-sort');});}
document.querySelectorAll('table[data-sortable]').forEach(function(table){
var id='sort:'+location.pathname+':'+table.id;
Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){th.addEventListener('click',function(){
var dir=th.getAttribute('aria-sort')==='descending'?'ascending':'descending';sort(table,i,dir);
try{sessionStorage.setItem(id,JSON.stringify([i,dir]));}catch(e){}});});
try{var s=JSON.parse(sessionStorage.getItem(id));if(s)sort(table,s[0],s[1]);}catch(e){}});
var h=location.hash.slice(1).split('&');
h.forEach(function(p){var m=/^sort=([\w-]+):(\d+):(ascending|descending)$/.exec(p);if(m){var t=document.getElementById(m[1]);if(t&&t.tHead)sort(t,+m[2],m[3]);}});
if(h.indexOf('layout-check')>=0){var r={viewport:window.innerWidth,page:document.documentElement.scrollWidth,
font:parseFloat(getComputedStyle(document.body).fontSize),tables:{}};
document.querySelectorAll('table[data-sortable]').forEach(function(t){r.tables[t.id]={rows:t.tBodies[0].rows.length,
first:Array.prototype.map.call(t.tBodies[0].rows,function(row){return row.cells[0].textContent;})};});
var pre=document.createElement('pre');pre.id='layout-report';pre.hidden=true;pre.textContent=JSON.stringify(r);document.body.appendChild(pre);}
})();
"#;

/// The Content-Security-Policy source that allows the pages' one script and nothing else:
/// its SHA-256, `'sha256-BASE64'`.
pub fn script_source() -> &'static str {
    use sha2::{Digest, Sha256};
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| format!("'sha256-{}'", base64(&Sha256::digest(SCRIPT.as_bytes()))))
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How bad a banner's news is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Bad,
    Warn,
    Ok,
}

/// One table cell: its text, and optionally a number it sorts by.
#[derive(Clone, Debug)]
pub struct Cell {
    text: String,
    key: Option<f64>,
    class: &'static str,
}

impl Cell {
    pub fn text(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            key: None,
            class: "",
        }
    }

    /// A number, right-aligned, sorted as a number.
    pub fn num(n: impl Into<f64> + std::fmt::Display + Copy) -> Cell {
        Cell {
            text: n.to_string(),
            key: Some(n.into()),
            class: "num",
        }
    }

    /// `text`, sorted by `key`.
    pub fn keyed(text: impl Into<String>, key: f64) -> Cell {
        Cell {
            text: text.into(),
            key: Some(key),
            class: "",
        }
    }

    /// Text that may be long (a resource name, a reason): wraps rather than widening the
    /// table.
    pub fn long(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            key: None,
            class: "wrap",
        }
    }

    /// A time: how long before `now` it was, sorted by the time itself.
    pub fn when(at: SystemTime, now: SystemTime) -> Cell {
        let unix = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        Cell::keyed(ago(at, now), unix)
    }

    /// Shown as bad news.
    pub fn bad(mut self) -> Cell {
        self.class = if self.class == "num" {
            "num bad"
        } else {
            "bad"
        };
        self
    }
}

/// A page under construction.
pub struct Page {
    out: String,
}

/// `s` safe inside HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A duration the way an operator reads it: `850 ms`, `42 s`, `3 min 05 s`, `2 h 10 min`,
/// `3 d 4 h`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        0 => format!("{ms} ms"),
        1..60 => format!("{s} s"),
        60..3600 => format!("{} min {:02} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// How long before `now` `then` was: `12 s ago`.
pub fn ago(then: SystemTime, now: SystemTime) -> String {
    format!(
        "{} ago",
        duration(now.duration_since(then).unwrap_or_default())
    )
}

/// A wall-clock time, UTC, to the second.
pub fn clock(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl Page {
    /// A page titled `title`; refreshed automatically unless `query` says `refresh=0`.
    pub fn new(title: &str, query: &str) -> Page {
        let refresh = crate::admin::query_param(query, "refresh") != Some("0");
        let mut out = String::with_capacity(16 * 1024);
        let _ = write!(
            out,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
             {}<title>{}</title><style>{STYLE}</style></head><body><h1>{}</h1>",
            if refresh {
                format!("<meta http-equiv=\"refresh\" content=\"{REFRESH_S}\">")
            } else {
                String::new()
            },
            esc(title),
            esc(title),
        );
        let _ = write!(
            out,
            "<p class=\"note\">{} · {}</p>",
            esc(&clock(SystemTime::now())),
            if refresh {
                format!(
                    "refreshed every {REFRESH_S} s · <a href=\"?refresh=0\">stop refreshing</a>"
                )
            } else {
                "not refreshing · <a href=\"?\">refresh every 15 s</a>".to_string()
            }
        );
        Page { out }
    }

    /// A line of news at the top, coloured by `level`.
    pub fn banner(&mut self, level: Level, text: &str) {
        let class = match level {
            Level::Bad => "bad",
            Level::Warn => "warn",
            Level::Ok => "ok",
        };
        let _ = write!(
            self.out,
            "<div class=\"banner {class}\" role=\"{}\">{}</div>",
            if level == Level::Bad {
                "alert"
            } else {
                "status"
            },
            esc(text)
        );
    }

    /// Figures at a glance: name and value.
    pub fn facts(&mut self, facts: &[(&str, String)]) {
        self.out.push_str("<dl class=\"facts\">");
        for (name, value) in facts {
            let _ = write!(
                self.out,
                "<div><dt>{}</dt><dd>{}</dd></div>",
                esc(name),
                esc(value)
            );
        }
        self.out.push_str("</dl>");
    }

    /// A section's heading and a line saying what it shows.
    pub fn section(&mut self, title: &str, note: &str) {
        let _ = write!(self.out, "<h2>{}</h2>", esc(title));
        if !note.is_empty() {
            let _ = write!(self.out, "<p class=\"note\">{}</p>", esc(note));
        }
    }

    /// A sortable table `id` of `rows` under `columns`; `empty` is said when there are none.
    pub fn table(&mut self, id: &str, columns: &[&str], rows: &[Vec<Cell>], empty: &str) {
        if rows.is_empty() {
            let _ = write!(
                self.out,
                "<p class=\"note\" id=\"{}\">{}</p>",
                esc(id),
                esc(empty)
            );
            return;
        }
        let _ = write!(
            self.out,
            "<div class=\"scroll\"><table id=\"{}\" data-sortable><thead><tr>",
            esc(id)
        );
        let numeric: Vec<bool> = (0..columns.len())
            .map(|i| {
                rows.iter()
                    .all(|r| r.get(i).is_some_and(|c| c.class.starts_with("num")))
            })
            .collect();
        for (i, c) in columns.iter().enumerate() {
            let class = if numeric[i] { " class=\"num\"" } else { "" };
            let _ = write!(self.out, "<th scope=\"col\"{class}>{}</th>", esc(c));
        }
        self.out.push_str("</tr></thead><tbody>");
        for row in rows {
            self.out.push_str("<tr>");
            for cell in row {
                self.out.push_str("<td");
                if !cell.class.is_empty() {
                    let _ = write!(self.out, " class=\"{}\"", cell.class);
                }
                if let Some(k) = cell.key {
                    let _ = write!(self.out, " data-key=\"{k}\"");
                }
                let _ = write!(self.out, ">{}</td>", esc(&cell.text));
            }
            self.out.push_str("</tr>");
        }
        self.out.push_str("</tbody></table></div>");
    }

    /// The page, with its footer `footer`.
    pub fn finish(mut self, footer: &str) -> String {
        let _ = write!(
            self.out,
            "<footer>{}</footer><script>{SCRIPT}</script></body></html>",
            esc(footer)
        );
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_everywhere_it_goes() {
        let mut p = Page::new("<t>", "refresh=0");
        p.banner(Level::Bad, "a<b");
        p.facts(&[("k&", "\"v\"".into())]);
        p.table(
            "t'1",
            &["<c>"],
            &[vec![Cell::text("<script>alert(1)</script>")]],
            "",
        );
        let html = p.finish("</footer>");
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(!html.contains("<t>") && !html.contains("<c>") && !html.contains("a<b"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("http-equiv=\"refresh\""), "refresh=0");
        assert!(
            Page::new("x", "")
                .finish("")
                .contains("http-equiv=\"refresh\"")
        );
    }

    #[test]
    fn base64_is_the_standard_one() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert!(script_source().starts_with("'sha256-") && script_source().len() == 53);
    }

    #[test]
    fn durations_read_as_an_operator_says_them() {
        assert_eq!(duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(duration(Duration::from_secs(42)), "42 s");
        assert_eq!(duration(Duration::from_secs(185)), "3 min 05 s");
        assert_eq!(duration(Duration::from_secs(7800)), "2 h 10 min");
        assert_eq!(
            duration(Duration::from_secs(3 * 86_400 + 4 * 3600)),
            "3 d 4 h"
        );
    }
}
