//! The rows a run produces and their markdown tables.

use crate::stats::Summary;
use std::fmt::Write as _;
use std::time::Duration;

/// One side's figure: a latency distribution or a single amount.
#[derive(Clone, Debug)]
pub enum Measure {
    Latency(Summary),
    Amount { value: f64, unit: &'static str },
}

/// What one side measured, and what it was.
#[derive(Clone, Debug)]
pub struct Side {
    pub label: String,
    pub measure: Measure,
}

impl Side {
    pub fn latency(label: impl Into<String>, samples: &[Duration]) -> Option<Side> {
        Some(Side {
            label: label.into(),
            measure: Measure::Latency(Summary::of(samples)?),
        })
    }

    pub fn amount(label: impl Into<String>, value: f64, unit: &'static str) -> Side {
        Side {
            label: label.into(),
            measure: Measure::Amount { value, unit },
        }
    }

    /// The number a ratio compares: p50 for latencies.
    fn headline(&self) -> f64 {
        match &self.measure {
            Measure::Latency(s) => s.p50.as_secs_f64(),
            Measure::Amount { value, .. } => *value,
        }
    }
}

/// A figure: fleetcoord's side, and the raw anchor measured in the same
/// run where there is one.
#[derive(Clone, Debug)]
pub struct Row {
    pub figure: String,
    pub ours: Side,
    pub anchor: Option<Side>,
}

impl Row {
    pub fn new(figure: impl Into<String>, ours: Side, anchor: Option<Side>) -> Row {
        Row {
            figure: figure.into(),
            ours,
            anchor,
        }
    }

    fn ratio(&self) -> String {
        match &self.anchor {
            Some(a) if a.headline() > 0.0 => format!("{:.2}×", self.ours.headline() / a.headline()),
            _ => "—".into(),
        }
    }

    /// One line for the progress log on stderr.
    pub fn progress_line(&self) -> String {
        let anchor = match &self.anchor {
            Some(a) => format!(" | {}: {}", a.label, cell(&a.measure)),
            None => String::new(),
        };
        format!(
            "{}: {}: {}{} | ratio {}",
            self.figure,
            self.ours.label,
            cell(&self.ours.measure),
            anchor,
            self.ratio()
        )
    }
}

/// Milliseconds with three significant digits or so.
fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 0.1 {
        format!("{ms:.4}")
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 100.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

fn cell(m: &Measure) -> String {
    match m {
        Measure::Latency(s) => format!(
            "{} / {} / {} / {} ms (n={})",
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            ms(s.max),
            s.n
        ),
        Measure::Amount { value, unit } => {
            if value.abs() >= 100.0 || *value == 0.0 {
                format!("{value:.0} {unit}")
            } else if value.abs() >= 10.0 {
                format!("{value:.1} {unit}")
            } else {
                format!("{value:.2} {unit}")
            }
        }
    }
}

/// Markdown: latencies first, then amounts (CPU, memory, leases, counts).
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::new();
    let latency: Vec<&Row> = rows
        .iter()
        .filter(|r| matches!(r.ours.measure, Measure::Latency(_)))
        .collect();
    let amounts: Vec<&Row> = rows
        .iter()
        .filter(|r| matches!(r.ours.measure, Measure::Amount { .. }))
        .collect();
    if !latency.is_empty() {
        out.push_str("| Figure | fleetcoord | p50 / p90 / p99 / max | Anchor | p50 / p90 / p99 / max | p50 ratio |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        for r in latency {
            push_row(&mut out, r);
        }
    }
    if !amounts.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str("| Figure | fleetcoord | value | Anchor | value | ratio |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        for r in amounts {
            push_row(&mut out, r);
        }
    }
    out
}

fn push_row(out: &mut String, r: &Row) {
    let (alabel, avalue) = match &r.anchor {
        Some(a) => (a.label.clone(), cell(&a.measure)),
        None => ("—".into(), "—".into()),
    };
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} |",
        r.figure,
        r.ours.label,
        cell(&r.ours.measure),
        alabel,
        avalue,
        r.ratio()
    );
}

/// A latency row from two sides' samples; an error if either has none.
pub fn latency_row(
    figure: &str,
    ours: &str,
    ours_samples: &[Duration],
    anchor: &str,
    anchor_samples: &[Duration],
) -> crate::Res<Row> {
    let ours = Side::latency(ours, ours_samples).ok_or_else(|| format!("{figure}: no samples"))?;
    let anchor = Side::latency(anchor, anchor_samples)
        .ok_or_else(|| format!("{figure}: no anchor samples"))?;
    Ok(Row::new(figure, ours, Some(anchor)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_of_p50s() {
        let ours = Side::latency("a", &[Duration::from_millis(2)]).unwrap();
        let anchor = Side::latency("b", &[Duration::from_millis(1)]).unwrap();
        let row = Row::new("x", ours, Some(anchor));
        assert_eq!(row.ratio(), "2.00×");
        let md = markdown(&[row]);
        assert!(md.contains("| x | a | 2.00 / 2.00 / 2.00 / 2.00 ms (n=1) | b |"));
    }
}
