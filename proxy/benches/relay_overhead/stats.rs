//! Medians and spread across repetitions: every figure the report quotes is the median of
//! its repetitions, shown with the lowest and highest so one noisy run is visible.

use std::fmt;

/// One figure over its repetitions.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Spread { median: f64::NAN, min: f64::NAN, max: f64::NAN };
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
        Spread { median, min: v[0], max: v[v.len() - 1] }
    }

    /// Formats as `median (min–max)` with `decimals` digits.
    pub fn show(&self, decimals: usize) -> String {
        format!("{:.d$} ({:.d$}–{:.d$})", self.median, self.min, self.max, d = decimals)
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.show(3))
    }
}

/// Collects one figure per repetition, keyed by name, in the order first seen.
#[derive(Default)]
pub struct Reps {
    figures: Vec<(String, Vec<f64>)>,
}

impl Reps {
    pub fn push(&mut self, name: &str, value: f64) {
        match self.figures.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push(value),
            None => self.figures.push((name.to_owned(), vec![value])),
        }
    }

    pub fn get(&self, name: &str) -> Spread {
        self.figures.iter().find(|(n, _)| n == name).map_or_else(|| Spread::of(&[]), |(_, v)| Spread::of(v))
    }
}

impl Reps {
    /// The repetitions of one figure, in the order measured.
    pub fn values(&self, name: &str) -> &[f64] {
        self.figures.iter().find(|(n, _)| n == name).map_or(&[], |(_, v)| v)
    }
}
