//! The timeline: one lane per process, leases as bars, pauses hatched, writes as marks (an
//! accepted write a green dot, a refused one a red cross, an unknown one a grey question mark),
//! expiries as dashed lines; the events of a violation are circled in red. SVG inside a
//! self-contained HTML page.

use std::collections::HashSet;
use std::fmt::Write;

use crate::check::{Report, Verdict, leases};
use crate::history::{Event, EventType, Op};

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 140.0;
const LANE: f64 = 46.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders `history` (with `report`'s violations marked) as an HTML page.
pub fn html(history: &[Event], report: &Report) -> String {
    let mut processes: Vec<&str> = Vec::new();
    for e in history {
        if !processes.contains(&e.process.as_str()) {
            processes.push(&e.process);
        }
    }
    let t0 = history.iter().map(|e| e.time).min().unwrap_or(0);
    let t1 = history
        .iter()
        .map(|e| e.time)
        .max()
        .unwrap_or(0)
        .max(t0 + 1);
    let x =
        |t: u64| LEFT + (t.clamp(t0, t1) - t0) as f64 / (t1 - t0) as f64 * (WIDTH - LEFT - 20.0);
    let lane = |p: &str| 40.0 + processes.iter().position(|q| *q == p).unwrap_or(0) as f64 * LANE;
    let bad: HashSet<usize> = report
        .verdicts
        .iter()
        .filter_map(|(_, v)| match v {
            Verdict::Violated(vs) => Some(vs.iter().flat_map(|v| v.lines.iter().copied())),
            _ => None,
        })
        .flatten()
        .collect();
    let height = 40.0 + processes.len() as f64 * LANE + 30.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">
<defs><pattern id="paused" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="#bbb"/></pattern></defs>
"##
    );
    for p in &processes {
        let y = lane(p);
        let _ = writeln!(
            svg,
            r##"<text x="8" y="{}">{}</text><line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/>"##,
            y + 4.0,
            esc(p),
            WIDTH - 20.0
        );
    }
    for l in leases(history) {
        let y = lane(&l.process) - 12.0;
        let (a, b) = (x(l.from), x(l.until));
        let _ = writeln!(
            svg,
            r##"<rect x="{a}" y="{y}" width="{}" height="8" fill="#7aa7e0"><title>lease on {} with token {}</title></rect><text x="{a}" y="{}" fill="#345">{} #{}</text>"##,
            (b - a).max(1.0),
            esc(&l.resource),
            l.token,
            y - 2.0,
            esc(&l.resource),
            l.token
        );
    }
    // Pauses: from a pause to the next resume of the same process.
    for (i, e) in history.iter().enumerate().filter(|(_, e)| e.f == Op::Pause) {
        let end = history[i + 1..]
            .iter()
            .find(|r| r.f == Op::Resume && r.process == e.process)
            .map_or(t1, |r| r.time);
        let y = lane(&e.process) - 3.0;
        let _ = writeln!(
            svg,
            r##"<rect x="{}" y="{y}" width="{}" height="14" fill="url(#paused)" stroke="#888"><title>{} paused</title></rect>"##,
            x(e.time),
            (x(end) - x(e.time)).max(1.0),
            esc(&e.process)
        );
    }
    for e in history.iter().filter(|e| e.kind != EventType::Invoke) {
        let (cx, cy) = (x(e.time), lane(&e.process) + 8.0);
        let token = e.token.map(|t| format!(" token {t}")).unwrap_or_default();
        let note = e
            .note
            .as_deref()
            .map(|n| format!(": {n}"))
            .unwrap_or_default();
        let title = format!(
            "line {}: {:?} {:?} {}{token}{}{note}",
            e.line,
            e.kind,
            e.f,
            esc(&e.resource),
            e.value_name()
                .map(|v| format!(" value {}", esc(&v)))
                .unwrap_or_default()
        );
        let mark = match (e.f, e.kind) {
            (Op::Write, EventType::Ok) => {
                format!(r##"<circle cx="{cx}" cy="{cy}" r="5" fill="#2a2"/>"##)
            }
            (Op::Write, EventType::Fail) => format!(
                r##"<path d="M{} {} l10 10 M{} {} l-10 10" stroke="#d00" stroke-width="3"/><text x="{}" y="{}" fill="#d00" font-weight="bold">refused{}</text>"##,
                cx - 5.0,
                cy - 5.0,
                cx + 5.0,
                cy - 5.0,
                cx + 8.0,
                cy + 18.0,
                esc(&token)
            ),
            (Op::Write, EventType::Info) => format!(
                r##"<text x="{}" y="{}" fill="#888" font-weight="bold">?</text>"##,
                cx - 3.0,
                cy + 4.0
            ),
            (Op::Expire, _) => format!(
                r##"<line x1="{cx}" y1="{}" x2="{cx}" y2="{}" stroke="#a50" stroke-dasharray="3,3"/>"##,
                cy - 24.0,
                cy + 6.0
            ),
            (Op::Read, EventType::Ok) => format!(
                r##"<rect x="{}" y="{}" width="8" height="8" fill="#555"/>"##,
                cx - 4.0,
                cy - 4.0
            ),
            _ => continue,
        };
        let ring = if bad.contains(&e.line) {
            format!(
                r##"<circle cx="{cx}" cy="{cy}" r="11" fill="none" stroke="#f00" stroke-width="2"/>"##
            )
        } else {
            String::new()
        };
        let _ = writeln!(svg, "<g><title>{title}</title>{mark}{ring}</g>");
    }
    svg.push_str("</svg>");
    format!(
        r#"<!doctype html>
<html><head><meta charset="utf-8"><title>verify: timeline</title></head>
<body style="font-family:sans-serif">
<h1>Timeline</h1>
<p>Blue bars: leases (resource #token). Hatched: the process was paused. Green dot: a write the
resource accepted; red cross: a write it refused; grey ?: outcome unknown; dashed: a lease
expired; grey square: the final read. Red rings: events of a violation. Hover for details.</p>
{svg}
<pre>{}</pre>
</body></html>
"#,
        esc(&report.to_string())
    )
}
