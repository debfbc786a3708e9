//! The time axis: times map piecewise-linearly onto x. Every time something happens is a knot;
//! between two knots time is linear. A gap where nothing happens that is long (over a tenth of
//! the span, or over a quarter of the time left once those are cut, and over four times the
//! median gap) is drawn as a break of a fixed width instead. Each drawn event also gets a small
//! fixed step, so that events microseconds apart are not drawn on top of each other; the ticks
//! show the true time at their place.

/// The width of a break, in px.
pub const BREAK_W: f64 = 96.0;
/// At most this many breaks (the longest gaps).
const MAX_BREAKS: usize = 40;
/// The largest step given to each drawn event, in px.
const MAX_STEP: f64 = 36.0;
/// Aim for a tick label every this many px.
const TICK_PX: f64 = 110.0;

/// A gap drawn as a break.
#[derive(Debug, Clone, PartialEq)]
pub struct Break {
    pub from: u64,
    pub to: u64,
    pub x0: f64,
    pub x1: f64,
}

/// A tick of the axis, with the time relative to the start.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    pub time: u64,
    pub x: f64,
    pub label: String,
}

#[derive(Debug)]
pub struct Axis {
    t0: u64,
    /// (time, x), times strictly increasing.
    knots: Vec<(u64, f64)>,
    /// Whether the gap before knot i+1 is a break.
    broken: Vec<bool>,
    pub breaks: Vec<Break>,
    pub right: f64,
}

impl Axis {
    /// An axis through `knots` (times, each with whether something is drawn there) from x =
    /// `left`, `min_width` to `max_width` px wide (wider with more drawn events).
    pub fn new(
        knots: impl IntoIterator<Item = (u64, bool)>,
        left: f64,
        min_width: f64,
        max_width: f64,
    ) -> Axis {
        let mut ks: Vec<(u64, bool)> = knots.into_iter().collect();
        ks.sort_unstable();
        ks.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.1 |= b.1;
                true
            } else {
                false
            }
        });
        if ks.is_empty() {
            ks.push((0, false));
        }
        let t0 = ks[0].0;
        let gaps: Vec<u64> = ks.windows(2).map(|w| w[1].0 - w[0].0).collect();
        let span = ks[ks.len() - 1].0 - t0;
        // A break is also far longer than the typical (median) gap: events at an even pace
        // have none.
        let mut sorted = gaps.clone();
        sorted.sort_unstable();
        let typical = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
        let mut broken: Vec<bool> = gaps
            .iter()
            .map(|&g| span > 0 && g > span / 10 && g / 4 > typical)
            .collect();
        let linear: u64 = gaps
            .iter()
            .zip(&broken)
            .filter(|(_, b)| !**b)
            .map(|(g, _)| *g)
            .sum();
        for (b, &g) in broken.iter_mut().zip(&gaps) {
            *b |= linear > 0 && g > linear / 4 && g / 4 > typical;
        }
        // Only the longest gaps, if there are too many.
        let mut long: Vec<usize> = (0..gaps.len()).filter(|&i| broken[i]).collect();
        if long.len() > MAX_BREAKS {
            long.sort_by_key(|&i| std::cmp::Reverse(gaps[i]));
            for &i in &long[MAX_BREAKS..] {
                broken[i] = false;
            }
        }
        let n_breaks = broken.iter().filter(|b| **b).count();
        let marks = (1..ks.len()).filter(|&i| ks[i].1 && !broken[i - 1]).count();
        let width = (marks as f64 * 12.0).clamp(min_width, max_width.max(min_width));
        let break_w = if n_breaks == 0 {
            BREAK_W
        } else {
            BREAK_W.min(width * 0.4 / n_breaks as f64)
        };
        let avail = width - break_w * n_breaks as f64;
        let step = if marks == 0 {
            0.0
        } else {
            MAX_STEP.min(avail * 0.4 / marks as f64)
        };
        let linear: u64 = gaps
            .iter()
            .zip(&broken)
            .filter(|(_, b)| !**b)
            .map(|(g, _)| *g)
            .sum();
        let scale = if linear == 0 {
            0.0
        } else {
            (avail - step * marks as f64) / linear as f64
        };
        let mut x = left;
        let mut knots = vec![(t0, x)];
        let mut breaks = Vec::new();
        for i in 1..ks.len() {
            let x0 = x;
            if broken[i - 1] {
                x += break_w;
                breaks.push(Break {
                    from: ks[i - 1].0,
                    to: ks[i].0,
                    x0,
                    x1: x,
                });
            } else {
                x += gaps[i - 1] as f64 * scale + if ks[i].1 { step } else { 0.0 };
            }
            knots.push((ks[i].0, x));
        }
        Axis {
            t0,
            knots,
            broken,
            breaks,
            right: x.max(left + 1.0),
        }
    }

    /// Where `t` is drawn.
    pub fn x(&self, t: u64) -> f64 {
        let i = self.knots.partition_point(|k| k.0 <= t);
        if i == 0 {
            return self.knots[0].1;
        }
        if i == self.knots.len() {
            return self.knots[i - 1].1;
        }
        let (a, b) = (self.knots[i - 1], self.knots[i]);
        a.1 + (t - a.0) as f64 / (b.0 - a.0) as f64 * (b.1 - a.1)
    }

    /// The first time on the axis.
    pub fn start(&self) -> u64 {
        self.t0
    }

    /// Ticks at round times (relative to the start) in each stretch between breaks.
    pub fn ticks(&self) -> Vec<Tick> {
        let end = self.knots[self.knots.len() - 1].0 - self.t0;
        let unit = Unit::for_span(end);
        let mut out = vec![Tick {
            time: self.t0,
            x: self.knots[0].1,
            label: "0".into(),
        }];
        let mut a = 0;
        while a < self.knots.len() {
            let mut b = a;
            while b + 1 < self.knots.len() && !self.broken[b] {
                b += 1;
            }
            let ((ta, xa), (tb, xb)) = (self.knots[a], self.knots[b]);
            if tb > ta {
                let raw = (tb - ta) as f64 * TICK_PX / (xb - xa).max(1.0);
                let step = nice(raw);
                let mut t = (ta - self.t0).div_ceil(step) * step;
                while t <= tb - self.t0 {
                    if t > 0 {
                        out.push(Tick {
                            time: self.t0 + t,
                            x: self.x(self.t0 + t),
                            label: unit.format(t, step),
                        });
                    }
                    t += step;
                }
            }
            a = b + 1;
        }
        out
    }
}

/// The smallest of 1, 2, 5 times a power of ten that is at least `raw` (at least 1).
fn nice(raw: f64) -> u64 {
    let mut p: u64 = 1;
    loop {
        for m in [1, 2, 5] {
            if (p * m) as f64 >= raw {
                return p * m;
            }
        }
        match p.checked_mul(10) {
            Some(q) => p = q,
            None => return u64::MAX / 2,
        }
    }
}

#[derive(Clone, Copy)]
struct Unit {
    ns: f64,
    name: &'static str,
}

impl Unit {
    fn for_span(span: u64) -> Unit {
        if span < 10_000_000 {
            Unit {
                ns: 1e3,
                name: "µs",
            }
        } else if span < 10_000_000_000 {
            Unit {
                ns: 1e6,
                name: "ms",
            }
        } else {
            Unit { ns: 1e9, name: "s" }
        }
    }

    /// `t` in this unit, with the decimals `step` needs.
    fn format(self, t: u64, step: u64) -> String {
        let step = step as f64 / self.ns;
        let decimals = if step >= 1.0 {
            0
        } else {
            ((-step.log10() - 1e-9).ceil() as usize).min(9)
        };
        format!("{:.*} {}", decimals, t as f64 / self.ns, self.name)
    }
}

/// A duration, to two or three significant digits ("4.8 s", "990 ms").
pub fn duration(ns: u64) -> String {
    let (v, unit) = match ns {
        0..1_000 => return format!("{ns} ns"),
        1_000..1_000_000 => (ns as f64 / 1e3, "µs"),
        1_000_000..1_000_000_000 => (ns as f64 / 1e6, "ms"),
        _ => (ns as f64 / 1e9, "s"),
    };
    if v < 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_long_idle_gap_becomes_a_break_and_events_keep_apart() {
        // Something at 0-10 ms, nothing for a second, then three events 0.2 ms apart.
        let knots = [
            (0, true),
            (10 * MS, true),
            (1010 * MS, true),
            (1010 * MS + MS / 5, true),
            (1010 * MS + 2 * MS / 5, true),
        ];
        let a = Axis::new(knots, 100.0, 1200.0, 1200.0);
        assert_eq!(a.breaks.len(), 1);
        assert_eq!((a.breaks[0].from, a.breaks[0].to), (10 * MS, 1010 * MS));
        assert!((a.breaks[0].x1 - a.breaks[0].x0 - BREAK_W).abs() < 1e-9);
        let xs: Vec<f64> = knots.iter().map(|k| a.x(k.0)).collect();
        assert!(xs.windows(2).all(|w| w[1] - w[0] >= 30.0), "{xs:?}");
        assert!((a.right - 1300.0).abs() < 1e-6, "{}", a.right);
        // Linear between knots.
        assert!((a.x(5 * MS) - (xs[0] + xs[1]) / 2.0).abs() < 1e-6);
    }

    #[test]
    fn events_at_an_even_pace_have_no_break() {
        let a = Axis::new((0..5).map(|i| (i * MS, true)), 0.0, 1000.0, 1000.0);
        assert!(a.breaks.is_empty(), "{:?}", a.breaks);
    }

    #[test]
    fn ticks_are_round_and_labelled_from_the_start() {
        let a = Axis::new((0..=10).map(|i| (i * 100 * MS, true)), 0.0, 1000.0, 1000.0);
        assert!(a.breaks.is_empty());
        let labels: Vec<String> = a.ticks().into_iter().map(|t| t.label).collect();
        assert_eq!(labels.first().map(String::as_str), Some("0"));
        assert!(labels.contains(&"400 ms".to_string()), "{labels:?}");
        assert!(labels.len() >= 5, "{labels:?}");
    }

    #[test]
    fn durations_read_short() {
        assert_eq!(duration(4_800 * MS), "4.8 s");
        assert_eq!(duration(990 * MS), "990 ms");
        assert_eq!(duration(1500), "1.5 µs");
        assert_eq!(nice(0.3), 1);
        assert_eq!(nice(130.0), 200);
        assert_eq!(
            Unit::for_span(2000 * MS).format(1009 * MS + MS / 2, MS / 2),
            "1009.5 ms"
        );
    }
}
