//! The timeline: the history as SVG inside a self-contained HTML page.
//!
//! One lane per process: leases as blue bars, pauses hatched, writes as marks (accepted a green
//! dot, refused a red cross, unknown a dashed grey ring), grants as blue dots, expiries dashed,
//! the final read a grey square; every write labelled with its token and outcome. A time axis
//! with ticks runs along the top; long idle stretches are cut out as breaks marked with the
//! time they elide ([`axis`]). Labels are stacked on rows inside their lane so that none
//! overlaps another ([`place`]); when there is no room, labels of accepted writes, grants and
//! expiries are left out (the page says how many). A violation is named in a red banner above
//! the picture and its events are ringed in red.
//!
//! Opened with the hash `#layout-check`, the page measures every label and writes a JSON report
//! into `<pre id="layout-report">` (for the layout tests).

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::check::{Report, Verdict, leases};
use crate::history::{Event, EventType, Op};

mod axis;
mod place;

use axis::Axis;
use place::{Rows, text_width};

/// The SVG's width when the history is small: fits a 1400 px window.
const MIN_SVG_W: f64 = 1360.0;
/// The widest the time axis grows (with many events).
const MAX_AXIS_W: f64 = 12_000.0;
const RIGHT: f64 = 40.0;
/// Break labels' baseline, tick labels' baseline, the axis line, the first lane.
const BREAK_Y: f64 = 16.0;
const TICK_Y: f64 = 34.0;
const AXIS_Y: f64 = 42.0;
const TOP: f64 = 52.0;
const ROW_H: f64 = 16.0;
const BAND: f64 = 28.0;
const LANE_GAP: f64 = 6.0;
/// Rows of labels a lane may grow to: for labels that may be left out, and for the others.
const OPTIONAL_ROWS: usize = 3;
const MUST_ROWS: usize = 16;
/// Process names longer than this are cut (the full name is in the lane's tooltip).
const NAME_CHARS: usize = 20;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What a label belongs to, for the count of those left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    AcceptedWrite,
    Grant,
    Expiry,
    Other,
}

struct Label {
    lane: usize,
    /// The x of its mark.
    anchor: f64,
    text: String,
    /// Lower is placed first.
    priority: u8,
    kind: Kind,
    colour: &'static str,
    bold: bool,
    attrs: String,
}

struct Placed {
    label: usize,
    row: usize,
    x0: f64,
}

/// A short form of a note: up to its first colon, at most 20 characters.
fn short_note(note: &str) -> String {
    let head = note.split(':').next().unwrap_or("").trim();
    if head.chars().count() > 20 {
        format!("{}...", head.chars().take(17).collect::<String>())
    } else {
        head.to_string()
    }
}

fn short_name(s: &str, max: usize) -> String {
    if s.chars().count() > max {
        format!("{}...", s.chars().take(max - 3).collect::<String>())
    } else {
        s.to_string()
    }
}

/// Renders `history` (with `report`'s violations marked) as an HTML page.
pub fn html(history: &[Event], report: &Report) -> String {
    let mut processes: Vec<&str> = Vec::new();
    let mut lane_of: HashMap<&str, usize> = HashMap::new();
    for e in history {
        if !lane_of.contains_key(e.process.as_str()) {
            lane_of.insert(&e.process, processes.len());
            processes.push(&e.process);
        }
    }
    let t0 = history.iter().map(|e| e.time).min().unwrap_or(0);
    let t1 = history.iter().map(|e| e.time).max().unwrap_or(0);
    let bad: HashSet<usize> = report
        .verdicts
        .iter()
        .filter_map(|(_, v)| match v {
            Verdict::Violated(vs) => Some(vs.iter().flat_map(|v| v.lines.iter().copied())),
            _ => None,
        })
        .flatten()
        .collect();
    let leases = leases(history);
    // Pauses: from a pause to the next resume of the same process.
    let pauses: Vec<(usize, u64, Option<u64>)> = history
        .iter()
        .enumerate()
        .filter(|(_, e)| e.f == Op::Pause)
        .map(|(i, e)| {
            let end = history[i + 1..]
                .iter()
                .find(|r| r.f == Op::Resume && r.process == e.process)
                .map(|r| r.time);
            (i, e.time, end)
        })
        .collect();
    let drawn = |e: &Event| {
        e.kind != EventType::Invoke
            && matches!(
                (e.f, e.kind),
                (Op::Write, _)
                    | (Op::Acquire, EventType::Ok)
                    | (Op::Expire, _)
                    | (Op::Read, EventType::Ok)
                    | (Op::Pause, _)
                    | (Op::Resume, _)
            )
    };

    // The axis: a knot wherever something happens or a bar ends.
    let knots = history
        .iter()
        .map(|e| (e.time, drawn(e)))
        .chain(leases.iter().flat_map(|l| {
            [
                (l.from.clamp(t0, t1), false),
                (l.until.clamp(t0, t1), false),
            ]
        }));
    let name_w = processes
        .iter()
        .map(|p| text_width(&short_name(p, NAME_CHARS)))
        .fold(0.0, f64::max);
    let left = (name_w + 24.0).max(70.0);
    let axis = Axis::new(knots, left, MIN_SVG_W - left - RIGHT, MAX_AXIS_W);
    let x = |t: u64| axis.x(t);
    let rel = |t: u64| t.saturating_sub(axis.start());

    // Labels, placed by priority on rows inside their lane.
    let mut labels: Vec<Label> = Vec::new();
    for e in history.iter().filter(|e| drawn(e)) {
        let lane = lane_of[e.process.as_str()];
        let violated = bad.contains(&e.line);
        let token = e.token.map_or("?".to_string(), |t| t.to_string());
        let value = e
            .value_name()
            .filter(|v| v.chars().count() <= 10)
            .map(|v| format!(" {v}"))
            .unwrap_or_default();
        let (text, priority, kind, colour, outcome, event) = match (e.f, e.kind) {
            (Op::Write, EventType::Ok) => (
                format!("write{value} t={token} ok"),
                4,
                Kind::AcceptedWrite,
                "#176117",
                "ok",
                "write",
            ),
            (Op::Write, EventType::Fail) => {
                let note = e
                    .note
                    .as_deref()
                    .map(short_note)
                    .filter(|n| !n.is_empty())
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default();
                (
                    format!("write{value} t={token} refused{note}"),
                    1,
                    Kind::Other,
                    "#c00",
                    "refused",
                    "write",
                )
            }
            (Op::Write, _) => (
                format!("write{value} t={token} unknown"),
                1,
                Kind::Other,
                "#555",
                "unknown",
                "write",
            ),
            (Op::Acquire, _) => (
                format!("{} t={token}", short_name(&e.resource, 40)),
                3,
                Kind::Grant,
                "#234e80",
                "ok",
                "grant",
            ),
            (Op::Expire, _) => (
                format!("expired t={token}"),
                5,
                Kind::Expiry,
                "#a50",
                "ok",
                "expire",
            ),
            (Op::Read, _) => {
                let names: Vec<String> = e
                    .value
                    .as_ref()
                    .and_then(|v| v.as_array())
                    .map(|a| a.iter().map(crate::history::name_of).collect())
                    .unwrap_or_default();
                let list = names.join(", ");
                let text = if names.len() <= 6 && list.chars().count() <= 40 {
                    format!("final read: {list}")
                } else {
                    format!("final read: {} writes", names.len())
                };
                (text, 2, Kind::Other, "#333", "ok", "read")
            }
            (Op::Pause, _) => {
                let end = pauses
                    .iter()
                    .find(|p| history[p.0].line == e.line)
                    .and_then(|p| p.2);
                let text = match end {
                    Some(end) => format!("paused {}", axis::duration(end - e.time)),
                    None => "paused (no resume recorded)".to_string(),
                };
                (text, 2, Kind::Other, "#444", "ok", "pause")
            }
            (Op::Resume, _) => (
                "resumed".to_string(),
                2,
                Kind::Other,
                "#444",
                "ok",
                "resume",
            ),
            _ => continue,
        };
        labels.push(Label {
            lane,
            anchor: x(e.time),
            text,
            priority: if violated { 0 } else { priority },
            kind,
            colour: if violated { "#d00" } else { colour },
            bold: violated || priority == 1,
            attrs: format!(
                r#"data-event="{event}" data-process="{}" data-outcome="{outcome}" data-token="{token}" data-line="{}"{}"#,
                esc(&e.process),
                e.line,
                if violated { r#" data-violation="""# } else { "" }
            ),
        });
    }
    let mut order: Vec<usize> = (0..labels.len()).collect();
    order.sort_by(|&a, &b| {
        (labels[a].priority, labels[a].anchor)
            .partial_cmp(&(labels[b].priority, labels[b].anchor))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut rows: Vec<Rows> = processes.iter().map(|_| Rows::default()).collect();
    let mut placed: Vec<Placed> = Vec::new();
    let mut dropped: HashMap<Kind, usize> = HashMap::new();
    for i in order {
        let l = &labels[i];
        let w = text_width(&l.text);
        let mut x0 = l.anchor - 4.0;
        // Near the right end, the label ends at its mark instead.
        if x0 + w > axis.right + RIGHT && l.anchor + 4.0 - w >= left {
            x0 = l.anchor + 4.0 - w;
        }
        let max_rows = if l.priority <= 2 {
            MUST_ROWS
        } else {
            OPTIONAL_ROWS
        };
        match rows[l.lane].place(x0, x0 + w, max_rows) {
            Some(row) => placed.push(Placed { label: i, row, x0 }),
            None => *dropped.entry(l.kind).or_default() += 1,
        }
    }

    // Lanes, top to bottom.
    let mut lane_top = Vec::new();
    let mut y = TOP;
    for r in &rows {
        lane_top.push(y);
        y += 4.0 + r.used() as f64 * ROW_H + BAND + LANE_GAP;
    }
    let bottom = y;
    let band_top = |lane: usize| lane_top[lane] + 4.0 + rows[lane].used() as f64 * ROW_H;
    let line_y = |lane: usize| band_top(lane) + 17.0;

    // Above the axis: a row of break labels, and a row of ticks where there is room.
    let mut break_row = Rows::default();
    let mut axis_row = Rows::default();
    let mut axis_texts = String::new();
    let mut right_edge = axis.right + RIGHT;
    for b in &axis.breaks {
        let text = format!("⋯ {} ⋯", axis::duration(b.to - b.from));
        let w = text_width(&text);
        let cx = (b.x0 + b.x1) / 2.0;
        if break_row.place(cx - w / 2.0, cx + w / 2.0, 1).is_some() {
            right_edge = right_edge.max(cx + w / 2.0 + 8.0);
            let _ = writeln!(
                axis_texts,
                r##"<text x="{cx:.1}" y="{BREAK_Y}" text-anchor="middle" fill="#666" data-break-label="">{text}</text>"##
            );
        }
    }
    let ticks = axis.ticks();
    let mut grid = String::new();
    for t in &ticks {
        let w = text_width(&t.label);
        let _ = writeln!(
            grid,
            r##"<line x1="{0:.1}" y1="{AXIS_Y}" x2="{0:.1}" y2="{bottom}" stroke="#eee"/><line x1="{0:.1}" y1="{AXIS_Y}" x2="{0:.1}" y2="{1}" stroke="#666"/>"##,
            t.x,
            AXIS_Y + 5.0
        );
        if axis_row.place(t.x - w / 2.0, t.x + w / 2.0, 1).is_some() {
            right_edge = right_edge.max(t.x + w / 2.0 + 8.0);
            let _ = writeln!(
                axis_texts,
                r##"<text x="{:.1}" y="{TICK_Y}" text-anchor="middle" fill="#333" data-tick="{}">{}</text>"##,
                t.x,
                rel(t.time),
                t.label
            );
        }
    }
    for p in &placed {
        right_edge = right_edge.max(p.x0 + text_width(&labels[p.label].text) + 8.0);
    }
    let width = right_edge.max(MIN_SVG_W).ceil();
    let height = (bottom + 4.0).ceil();

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="DejaVu Sans Mono, monospace" font-size="12" style="display:block">
<defs><pattern id="paused" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="#bbb"/></pattern></defs>"##
    );
    for (i, p) in processes.iter().enumerate() {
        let h = if i + 1 < lane_top.len() {
            lane_top[i + 1] - lane_top[i]
        } else {
            bottom - lane_top[i]
        };
        let _ = writeln!(
            svg,
            r##"<rect x="0" y="{}" width="{width}" height="{h}" fill="{}"/>"##,
            lane_top[i],
            if i % 2 == 0 { "#fafafa" } else { "#f3f5f8" }
        );
        let _ = writeln!(
            svg,
            r##"<g><title>{}</title><text x="8" y="{}" font-weight="bold" data-lane="">{}</text></g><line x1="{left}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="#ccc"/>"##,
            esc(p),
            line_y(i) + 4.0,
            esc(&short_name(p, NAME_CHARS)),
            axis.right,
            ly = line_y(i)
        );
    }
    svg.push_str(&grid);
    let _ = writeln!(
        svg,
        r##"<line x1="{left}" y1="{AXIS_Y}" x2="{:.1}" y2="{AXIS_Y}" stroke="#666"/>"##,
        axis.right
    );
    for l in &leases {
        let lane = lane_of[l.process.as_str()];
        let (a, b) = (x(l.from), x(l.until));
        let y = band_top(lane) + 2.0;
        let more = if l.until > t1 {
            // The lease outlives the history: an arrow at the end.
            format!(
                r##"<path d="M{b:.1} {} l8 6.5 l-8 6.5 z" fill="#7aa7e0"/>"##,
                y - 3.0
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            svg,
            r##"<g data-lease="" data-process="{}" data-token="{}"><title>lease on {} with token {} (from {} to {})</title><rect x="{a:.1}" y="{y}" width="{:.1}" height="7" fill="#7aa7e0"/>{more}</g>"##,
            esc(&l.process),
            l.token,
            esc(&l.resource),
            l.token,
            axis::duration(rel(l.from)),
            axis::duration(rel(l.until)),
            (b - a).max(1.0)
        );
    }
    for &(i, from, to) in &pauses {
        let e = &history[i];
        let lane = lane_of[e.process.as_str()];
        let end = to.unwrap_or(t1);
        let _ = writeln!(
            svg,
            r##"<rect x="{:.1}" y="{}" width="{:.1}" height="12" fill="url(#paused)" stroke="#888" data-pause="" data-process="{}" data-from="{}" data-to="{}"><title>{} paused for {}</title></rect>"##,
            x(from),
            band_top(lane) + 11.0,
            (x(end) - x(from)).max(1.0),
            esc(&e.process),
            rel(from),
            rel(end),
            esc(&e.process),
            axis::duration(end - from)
        );
    }
    // Breaks: a pale band with zig-zag edges across every lane.
    for b in &axis.breaks {
        let (x0, x1) = (b.x0 + 7.0, b.x1 - 7.0);
        if x1 <= x0 {
            continue;
        }
        let zig = |x: f64| {
            let mut d = format!("M{x:.1} {}", AXIS_Y - 4.0);
            let mut y = AXIS_Y - 4.0;
            let mut k = 0;
            while y < bottom {
                y += 6.0;
                k += 1;
                let _ = write!(
                    d,
                    " L{:.1} {y:.1}",
                    if k % 2 == 1 { x + 3.0 } else { x - 3.0 }
                );
            }
            d
        };
        let _ = writeln!(
            svg,
            r##"<g data-break="" data-from="{}" data-to="{}"><title>{} with nothing recorded, cut out</title><rect x="{x0:.1}" y="{}" width="{:.1}" height="{:.1}" fill="#fff" fill-opacity="0.8"/><path d="{}" stroke="#999" fill="none"/><path d="{}" stroke="#999" fill="none"/></g>"##,
            rel(b.from),
            rel(b.to),
            axis::duration(b.to - b.from),
            AXIS_Y - 4.0,
            x1 - x0,
            bottom - AXIS_Y + 4.0,
            zig(x0),
            zig(x1)
        );
    }
    for e in history.iter().filter(|e| drawn(e)) {
        let lane = lane_of[e.process.as_str()];
        let (cx, cy) = (x(e.time), line_y(lane));
        let token = e.token.map_or("?".to_string(), |t| t.to_string());
        let value = e.value_name().map(|v| esc(&v)).unwrap_or_default();
        let note = e
            .note
            .as_deref()
            .map(|n| format!(" ({})", esc(n)))
            .unwrap_or_default();
        let at = axis::duration(rel(e.time));
        let who = esc(&e.process);
        let res = esc(&e.resource);
        let line = e.line;
        let (event, outcome, title, mark) = match (e.f, e.kind) {
            (Op::Write, EventType::Ok) => (
                "write",
                "ok",
                format!(
                    "line {line}, {at}: {who} wrote {value} to {res}, accepted with token {token}{note}"
                ),
                format!(r##"<circle cx="{cx:.1}" cy="{cy}" r="5" fill="#2a2"/>"##),
            ),
            (Op::Write, EventType::Fail) => (
                "write",
                "refused",
                format!(
                    "line {line}, {at}: {who}'s write {value} to {res} refused token {token}{note}"
                ),
                format!(
                    r##"<path d="M{:.1} {} l10 10 M{:.1} {} l-10 10" stroke="#d00" stroke-width="3"/>"##,
                    cx - 5.0,
                    cy - 5.0,
                    cx + 5.0,
                    cy - 5.0
                ),
            ),
            (Op::Write, _) => (
                "write",
                "unknown",
                format!(
                    "line {line}, {at}: {who}'s write {value} to {res} with token {token}: outcome unknown{note}"
                ),
                format!(
                    r##"<circle cx="{cx:.1}" cy="{cy}" r="5" fill="#fff" stroke="#777" stroke-width="2" stroke-dasharray="2,2"/>"##
                ),
            ),
            (Op::Acquire, _) => (
                "grant",
                "ok",
                format!("line {line}, {at}: {who} was granted {res} with token {token}"),
                format!(r##"<circle cx="{cx:.1}" cy="{cy}" r="3.5" fill="#2b6cb0"/>"##),
            ),
            (Op::Expire, _) => (
                "expire",
                "ok",
                format!("line {line}, {at}: {who}'s lease on {res} (token {token}) expired"),
                format!(
                    r##"<line x1="{cx:.1}" y1="{}" x2="{cx:.1}" y2="{}" stroke="#a50" stroke-width="2" stroke-dasharray="3,3"/>"##,
                    cy - 16.0,
                    cy + 8.0
                ),
            ),
            (Op::Read, _) => (
                "read",
                "ok",
                format!("line {line}, {at}: {who} read {res}: {value}"),
                format!(
                    r##"<rect x="{:.1}" y="{}" width="8" height="8" fill="#555"/>"##,
                    cx - 4.0,
                    cy - 4.0
                ),
            ),
            (Op::Pause, _) => (
                "pause",
                "ok",
                format!("line {line}, {at}: {who} paused{note}"),
                format!(
                    r##"<path d="M{:.1} {} v12 M{:.1} {} v12" stroke="#333" stroke-width="2.5"/>"##,
                    cx - 2.5,
                    cy - 6.0,
                    cx + 2.5,
                    cy - 6.0
                ),
            ),
            (Op::Resume, _) => (
                "resume",
                "ok",
                format!("line {line}, {at}: {who} resumed{note}"),
                format!(
                    r##"<path d="M{:.1} {} l9 6 l-9 6 z" fill="#333"/>"##,
                    cx - 4.0,
                    cy - 6.0
                ),
            ),
            _ => continue,
        };
        let ring = if bad.contains(&e.line) {
            format!(
                r##"<circle cx="{cx:.1}" cy="{cy}" r="11" fill="none" stroke="#f00" stroke-width="3"/>"##
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            svg,
            r##"<g data-mark="" data-event="{event}" data-process="{who}" data-outcome="{outcome}" data-token="{token}" data-line="{line}"{flag}><title>{title}</title>{mark}{ring}</g>"##,
            flag = if ring.is_empty() {
                ""
            } else {
                r#" data-violation="""#
            }
        );
    }
    for p in &placed {
        let l = &labels[p.label];
        let y = band_top(l.lane) - 4.0 - p.row as f64 * ROW_H;
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{y}" fill="{}"{} data-label="" {}>{}</text>"##,
            p.x0,
            l.colour,
            if l.bold { r#" font-weight="bold""# } else { "" },
            l.attrs,
            esc(&l.text)
        );
    }
    svg.push_str(&axis_texts);
    svg.push_str("</svg>");

    let verdict = banner(report);
    let mut left_out: Vec<(Kind, usize)> = dropped.into_iter().collect();
    left_out.sort();
    let left_out = if left_out.is_empty() {
        String::new()
    } else {
        let what: Vec<String> = left_out
            .iter()
            .map(|(k, n)| {
                let name = match k {
                    Kind::AcceptedWrite => "accepted writes",
                    Kind::Grant => "grants",
                    Kind::Expiry => "expiries",
                    Kind::Other => "other events",
                };
                format!("{n} of {name}")
            })
            .collect();
        format!(
            "<p id=\"labels-dropped\"><b>Labels left out for lack of room:</b> {}. Their marks are drawn; hover one for its details.</p>\n",
            what.join(", ")
        )
    };
    format!(
        r##"<!doctype html>
<html><head><meta charset="utf-8"><title>verify: timeline</title></head>
<body style="font-family:sans-serif;margin:8px">
{verdict}<h1 style="margin:10px 0 4px">Timeline</h1>
<p style="margin:4px 0">One lane per process; time runs right, in ms or s from the first event (the axis on top). <span style="color:#666">⋯ N ⋯</span>: a stretch where nothing happened, cut out. Events close in time are spread a little apart. Blue bars: leases (resource t=token; an arrow: still held at the end). Hatched: the process was paused. Blue dot: a grant; green dot: a write the resource accepted; red cross: a write it refused; dashed ring: outcome unknown; dashed orange: a lease expired; grey square: the final read. Red rings: events of a violation. Hover for details.</p>
{left_out}{svg}
<pre id="report">{report}</pre>
<pre id="layout-report"></pre>
<script>{SCRIPT}</script>
</body></html>
"##,
        report = esc(&report.to_string())
    )
}

/// The verdict at the top: a red banner naming each violation, or a quiet line.
fn banner(report: &Report) -> String {
    let mut items = String::new();
    for (p, v) in &report.verdicts {
        if let Verdict::Violated(vs) = v {
            let _ = write!(
                items,
                "<li><b>{}</b> violated ({} time{})",
                p.name(),
                vs.len(),
                if vs.len() == 1 { "" } else { "s" }
            );
            for v in vs.iter().take(3) {
                let lines: Vec<String> = v.lines.iter().map(|l| l.to_string()).collect();
                let _ = write!(
                    items,
                    "<br>{} [lines {}]",
                    esc(&v.message),
                    lines.join(", ")
                );
            }
            if vs.len() > 3 {
                let _ = write!(
                    items,
                    "<br>... and {} more (see the report below)",
                    vs.len() - 3
                );
            }
            items.push_str("</li>");
        }
    }
    if items.is_empty() {
        return format!(
            "<div id=\"verdict\" style=\"background:#e8f5e8;color:#174d17;padding:6px 12px;border-radius:4px\">No violation ({} events).</div>\n",
            report.events
        );
    }
    format!(
        "<div id=\"violation-banner\" role=\"alert\" style=\"background:#c00;color:#fff;padding:10px 16px;border-radius:4px;font-size:16px\"><div style=\"font-size:22px;font-weight:bold\">VIOLATION</div><ul style=\"margin:6px 0\">{items}</ul>Its events are ringed in red below.</div>\n"
    )
}

/// With `#layout-check` in the URL: every label's box (relative to the SVG's), the marks',
/// breaks' and pauses' boxes and data, and the banner's box, as JSON in `#layout-report`.
const SCRIPT: &str = r#"
(function () {
  if (location.hash !== '#layout-check') return;
  var svg = document.getElementById('timeline');
  var s = svg.getBoundingClientRect();
  function box(el) {
    var r = el.getBoundingClientRect();
    var o = { x: r.left - s.left, y: r.top - s.top, w: r.width, h: r.height, data: {} };
    for (var k in el.dataset) o.data[k] = el.dataset[k];
    return o;
  }
  function all(sel) { return Array.prototype.map.call(svg.querySelectorAll(sel), box); }
  var labels = Array.prototype.map.call(svg.querySelectorAll('text'), function (t) {
    var o = box(t); o.text = t.textContent; return o;
  });
  var banner = document.getElementById('violation-banner');
  var b = null;
  if (banner) {
    var r = banner.getBoundingClientRect(), st = getComputedStyle(banner);
    b = { x: r.left, y: r.top, w: r.width, h: r.height, text: banner.textContent,
          visible: st.display !== 'none' && st.visibility !== 'hidden' && r.top < s.top };
  }
  var dropped = document.getElementById('labels-dropped');
  document.getElementById('layout-report').textContent = JSON.stringify({
    svg: { w: s.width, h: s.height }, labels: labels, marks: all('[data-mark]'),
    breaks: all('[data-break]'), pauses: all('[data-pause]'), banner: b,
    dropped: dropped ? dropped.textContent : null
  });
})();
"#;
