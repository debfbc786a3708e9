//! Labels placed on rows without overlapping: each row keeps the horizontal intervals taken.

use std::collections::BTreeMap;

/// The advance of one character of the labels' font (12 px monospace: 0.6 em, rounded up).
pub const CHAR_W: f64 = 7.4;
/// Space kept free on each side of a label.
const PAD: f64 = 3.0;

/// The width a label's text takes.
pub fn text_width(text: &str) -> f64 {
    // Characters outside ASCII may come from a wider fallback font: counted double.
    text.chars()
        .map(|c| if c.is_ascii() { CHAR_W } else { 2.0 * CHAR_W })
        .sum()
}

/// Rows of taken intervals.
#[derive(Debug, Default)]
pub struct Rows {
    rows: Vec<BTreeMap<i64, i64>>,
}

impl Rows {
    /// Takes [x0, x1] on the lowest row (below `max_rows`) where it is free; None when none is.
    pub fn place(&mut self, x0: f64, x1: f64, max_rows: usize) -> Option<usize> {
        let (a, b) = ((x0 - PAD).floor() as i64, (x1 + PAD).ceil() as i64);
        for r in 0..max_rows {
            if r == self.rows.len() {
                self.rows.push(BTreeMap::new());
            }
            let row = &mut self.rows[r];
            // Intervals on a row are disjoint: only the last one starting before `b` can reach
            // past `a`.
            let taken = row.range(..b).next_back().is_some_and(|(_, &end)| end > a);
            if !taken {
                row.insert(a, b);
                return Some(r);
            }
        }
        None
    }

    /// How many rows hold something.
    pub fn used(&self) -> usize {
        self.rows
            .iter()
            .rposition(|r| !r.is_empty())
            .map_or(0, |i| i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_labels_go_up_a_row_and_are_refused_past_the_last() {
        let mut rows = Rows::default();
        assert_eq!(rows.place(0.0, 100.0, 2), Some(0));
        assert_eq!(rows.place(200.0, 300.0, 2), Some(0));
        assert_eq!(rows.place(50.0, 150.0, 2), Some(1));
        assert_eq!(rows.place(120.0, 180.0, 2), Some(0));
        assert_eq!(rows.place(60.0, 140.0, 2), None);
        assert_eq!(rows.place(60.0, 140.0, 3), Some(2));
        assert_eq!(rows.place(400.0, 450.0, 2), Some(0));
        assert_eq!(rows.used(), 3);
        assert!(text_width("write t=1 ok") > 80.0);
    }
}
