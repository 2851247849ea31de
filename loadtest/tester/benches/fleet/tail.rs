//! What sets the TTOT tail, and the same comparison by figures that more requests set.
//!
//! A run's TTOT p99 is its tenth slowest of about a thousand. Most TTOTs take a step or two
//! of the engine; the few that take much longer are requests whose answer began on an
//! engine holding all its places, and a run holds only a handful of them, so its p99 falls
//! where one such request more or fewer moves it by a quarter, and the per-round ratio
//! swings with it. The section shows that from the records, then compares the replicas
//! with one by the share of requests past twice one replica's median TTOT (a rate, which
//! every slow request sets) and by the p99 pooled over every round's requests, both paired
//! as the tails above.

use std::fmt::Write as _;

use meridian_loadtest::record::RequestRecord;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::report::{ALONE, RoundPair, configured, paired_runs, ratio_text, run_of};
use crate::stats::{BOOTSTRAP, Effect, TARGET_RATIO, interval, pct, resample, value, verdict};
use crate::{ROUTINGS, Run, SETUPS, Sharing};

/// A TTOT this many times one replica's median is slow.
const SLOW_OVER_MEDIAN: f64 = 2.0;

fn ttot(r: &RequestRecord) -> f64 {
    value(r, |r| r.think_to_output)
}

/// When a request's first answer token came, from its start (its answer's gaps taken back
/// from its end); none for a failed request.
fn first_answer_at(r: &RequestRecord) -> Option<f64> {
    let e2e = r.e2e.filter(|_| r.ok)?;
    Some(r.sent_at + e2e - r.output_itl.iter().sum::<f64>())
}

/// How many of the run's requests were open at `t` (sent, not yet ended).
fn open_at(starts: &[f64], ends: &[f64], t: f64) -> usize {
    starts.partition_point(|&s| s <= t) - ends.partition_point(|&e| e <= t)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() { f64::NAN } else { pct(&mut v, 50.0) }
}

/// The slow TTOTs of a routing's one-replica runs beside the others: how many requests
/// were open when their answer began, and how late they started.
struct Anatomy {
    median_ttot: f64,
    /// A TTOT over this is slow (`SLOW_OVER_MEDIAN` times the median).
    slow: f64,
    /// Fewest and most slow TTOTs in one run, any condition of the routing.
    per_run: (usize, usize),
    requests_per_run: usize,
    open_slow: f64,
    open_rest: f64,
    ttft_slow: f64,
    ttft_rest: f64,
}

fn anatomy(rounds: &[Vec<Run>], routing: &str) -> Option<Anatomy> {
    let alone: Vec<&Run> = rounds.iter().filter_map(|runs| run_of(runs, routing, ALONE)).collect();
    let median_ttot =
        median(alone.iter().flat_map(|r| r.records.iter().map(ttot)).filter(|x| x.is_finite()).collect());
    if !median_ttot.is_finite() {
        return None;
    }
    let slow = SLOW_OVER_MEDIAN * median_ttot;
    let counts: Vec<usize> = rounds
        .iter()
        .flatten()
        .filter(|r| r.routing == routing)
        .map(|r| r.records.iter().filter(|x| ttot(x) > slow).count())
        .collect();
    let (mut open_slow, mut open_rest, mut ttft_slow, mut ttft_rest) = (vec![], vec![], vec![], vec![]);
    for run in &alone {
        let mut starts: Vec<f64> = run.records.iter().map(|r| r.sent_at).collect();
        let mut ends: Vec<f64> = run.records.iter().filter_map(|r| Some(r.sent_at + r.e2e?)).collect();
        starts.sort_by(f64::total_cmp);
        ends.sort_by(f64::total_cmp);
        for r in &run.records {
            let (Some(at), Some(ttft)) = (first_answer_at(r), r.ttft) else { continue };
            let open = open_at(&starts, &ends, at) as f64;
            if ttot(r) > slow {
                open_slow.push(open);
                ttft_slow.push(ttft);
            } else {
                open_rest.push(open);
                ttft_rest.push(ttft);
            }
        }
    }
    Some(Anatomy {
        median_ttot,
        slow,
        per_run: (counts.iter().copied().min()?, counts.iter().copied().max()?),
        requests_per_run: median(alone.iter().map(|r| r.records.len() as f64).collect()) as usize,
        open_slow: median(open_slow),
        open_rest: median(open_rest),
        ttft_slow: median(ttft_slow),
        ttft_rest: median(ttft_rest),
    })
}

/// Paired effects of `cond` over `base` pooled over the rounds (each draw resamples the
/// rounds and, within each, the requests, the same ones on both sides): the share of
/// requests with a TTOT over `slow`, and the pooled TTOT p99; and the two sides' shares
/// over every paired request.
fn pooled_effects(pairs: &[RoundPair], slow: f64) -> (Effect, Effect, f64, f64) {
    let values: Vec<(Vec<f64>, Vec<f64>)> =
        pairs.iter().map(|(a, b)| (a.iter().map(ttot).collect(), b.iter().map(ttot).collect())).collect();
    // (share over, pooled p99) of each side over the drawn (round, requests).
    let figures = |draw: &[(usize, Vec<usize>)]| {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (r, idx) in draw {
            a.extend(idx.iter().map(|&i| values[*r].0[i]));
            b.extend(idx.iter().map(|&i| values[*r].1[i]));
        }
        let share = |v: &[f64]| v.iter().filter(|&&x| x > slow).count() as f64 / v.len().max(1) as f64;
        let (sa, sb) = (share(&a), share(&b));
        (sa, sb, sb / sa, pct(&mut b, 99.0) / pct(&mut a, 99.0))
    };
    let all: Vec<(usize, Vec<usize>)> =
        (0..pairs.len()).map(|r| (r, (0..values[r].0.len()).collect())).collect();
    let (share_base, share_cond, share_point, p99_point) = figures(&all);
    let sizes: Vec<usize> = values.iter().map(|(base, _)| base.len()).collect();
    let mut rng = StdRng::seed_from_u64(7);
    let (mut shares, mut p99s): (Vec<f64>, Vec<f64>) = (0..BOOTSTRAP)
        .map(|_| {
            let (_, _, share, p99) = figures(&resample(&mut rng, &sizes));
            (share, p99)
        })
        .unzip();
    (interval(&mut shares, share_point), interval(&mut p99s, p99_point), share_base, share_cond)
}

/// A routing's slow TTOTs in words, each claim as far as its figures bear it out.
fn anatomy_text(routing: &str, a: &Anatomy, places: usize) -> String {
    let mut text = format!(
        "`{routing}`: a run's TTOT p99 is about its {}th slowest of {} requests. With 1 replica the \
         median TTOT is {:.1} ms, and a run held from {} to {} TTOTs over twice that ({:.1} ms; any \
         condition of this routing), so the p99 falls among a handful of slow requests, and one more \
         or fewer moves it.",
        (a.requests_per_run as f64 / 100.0).round() as usize,
        a.requests_per_run,
        1000.0 * a.median_ttot,
        a.per_run.0,
        a.per_run.1,
        1000.0 * a.slow,
    );
    let (open, ttft) = (
        format!(
            "{:.0} requests open across the engines at the median when their first answer token came, against {:.0} for the others (the engines' places: {places})",
            a.open_slow, a.open_rest
        ),
        format!("TTFT median {:.0} ms, against {:.0}", 1000.0 * a.ttft_slow, 1000.0 * a.ttft_rest),
    );
    let busier = a.open_slow > a.open_rest;
    let later = a.ttft_slow > 1.2 * a.ttft_rest;
    let _ = write!(
        text,
        " Those slow ones (1 replica, every round): {open}; {ttft}.{}",
        match (busier && a.open_slow > places as f64, later) {
            (true, true) =>
                " They came while the fleet held more requests than its places and started late too: \
                              requests whose answer began on a full engine.",
            (true, false) => " They came while the fleet held more requests than its places.",
            (false, true) =>
                " They started late, though the fleet held no more requests than usual: the \
                               fleet's count does not show what slowed them.",
            (false, false) => " Neither the fleet's count nor their starts set them apart.",
        }
    );
    text
}

pub(crate) fn section(md: &mut String, rounds: &[Vec<Run>], places: usize) {
    let _ = writeln!(md, "\n### What sets the TTOT tail\n");
    let mut rows = Vec::new();
    let mut most: Option<Most> = None;
    for routing in ROUTINGS {
        let Some(a) = anatomy(rounds, routing) else { continue };
        let _ = writeln!(md, "{}\n", anatomy_text(routing, &a, places));
        for setup in SETUPS.into_iter().filter(|s| *s != ALONE) {
            let (pairs, _) = paired_runs(rounds, routing, ALONE, setup);
            if pairs.is_empty() {
                continue;
            }
            let (share, p99, base, cond) = pooled_effects(&pairs, a.slow);
            let paired: usize = pairs.iter().map(|(a, _)| a.len()).sum();
            if most.as_ref().is_none_or(|m: &Most| pairs.len() > m.rounds) {
                most = Some(Most { routing, setup, rounds: pairs.len(), slow: a.slow, p99 });
            }
            rows.push(format!(
                "| {routing} | {} | {} | {} | {} | {:.2}% | {:.2}% | {} ({}–{}) | {} | {} ({}–{}) | {} |",
                setup.0,
                configured(setup),
                pairs.len(),
                paired.div_ceil(100),
                100.0 * base,
                100.0 * cond,
                ratio_text(share.point),
                ratio_text(share.lo),
                ratio_text(share.hi),
                verdict(&share),
                ratio_text(p99.point),
                ratio_text(p99.lo),
                ratio_text(p99.hi),
                verdict(&p99),
            ));
        }
    }
    let _ = writeln!(
        md,
        "The same comparison by figures that more requests set: the share of requests whose TTOT \
         was over twice one replica's median (every slow request counts), and the TTOT p99 of \
         every paired round's requests pooled (set by its slowest 1%, counted in the table), each over one \
         replica's on the same requests of the same rounds, with a 90% interval from resampling \
         the rounds and their requests; the verdict against the same target (at most 1.10). The \
         table above stays the headline: these say whether its unresolved TTOT p99 hides a \
         difference.\n"
    );
    let _ = writeln!(
        md,
        "| routing | replicas | `admission` | rounds | pooled p99 set by (requests) | TTOT over twice the median: 1 replica | these replicas | over 1 replica | verdict | pooled TTOT p99 over 1 replica | verdict |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|");
    for row in rows {
        let _ = writeln!(md, "{row}");
    }
    if let Some(m) = most {
        spread(md, rounds, &m);
    }
}

/// The condition with the most rounds beside one replica, for the closing paragraph.
struct Most {
    routing: &'static str,
    setup: (usize, Sharing),
    rounds: usize,
    slow: f64,
    p99: Effect,
}

/// Why more rounds resolve it slowly: how the slow TTOTs a run held spread over the rounds,
/// how little a round's two runs go together, and (while the pooled p99's point is under
/// the target) about how many rounds would bring the interval's top under it at this spread.
fn spread(md: &mut String, rounds: &[Vec<Run>], m: &Most) {
    let count = |r: &Run| r.records.iter().filter(|x| ttot(x) > m.slow).count() as f64;
    let pairs: Vec<(f64, f64)> = rounds
        .iter()
        .filter_map(|runs| {
            Some((count(run_of(runs, m.routing, ALONE)?), count(run_of(runs, m.routing, m.setup)?)))
        })
        .collect();
    let n = pairs.len() as f64;
    let (ma, mb) = (pairs.iter().map(|p| p.0).sum::<f64>() / n, pairs.iter().map(|p| p.1).sum::<f64>() / n);
    let cov: f64 = pairs.iter().map(|p| (p.0 - ma) * (p.1 - mb)).sum();
    let (va, vb): (f64, f64) =
        (pairs.iter().map(|p| (p.0 - ma).powi(2)).sum(), pairs.iter().map(|p| (p.1 - mb).powi(2)).sum());
    let corr = cov / (va * vb).sqrt();
    let range = |f: fn(&(f64, f64)) -> f64| {
        let v: Vec<f64> = pairs.iter().map(f).collect();
        (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max))
    };
    let ((a_lo, a_hi), (b_lo, b_hi)) = (range(|p| p.0), range(|p| p.1));
    let _ = write!(
        md,
        "\nWith `{}` and {} replicas ({}) over its {} rounds, a run held from {a_lo:.0} to {a_hi:.0} slow TTOTs with 1 \
         replica and from {b_lo:.0} to {b_hi:.0} with them (a mean of {ma:.1} and {mb:.1}; chance alone \
         would spread a count of {ma:.0} by about ±{:.0}), and a round's two runs {} \
         (correlation {corr:.2} between their counts){}",
        m.routing,
        m.setup.0,
        configured(m.setup),
        m.rounds,
        ma.sqrt(),
        if corr < 0.5 { "hardly go together" } else { "go together" },
        if corr < 0.5 {
            ": how many slow TTOTs a run holds is decided run by run, not by the round's requests, so \
             pairing takes little of it away and only more rounds narrow the intervals."
        } else {
            ": pairing the runs of a round takes much of it away."
        },
    );
    let (top, point) = (m.p99.hi, m.p99.point);
    if point < TARGET_RATIO && top > TARGET_RATIO {
        // The interval's half width in logs shrinks as one over the root of the rounds.
        let needed = (m.rounds as f64 * ((top / point).ln() / (TARGET_RATIO / point).ln()).powi(2)).ceil();
        let _ = write!(
            md,
            " At this spread the pooled p99's interval would end under {TARGET_RATIO:.2} after about \
             {needed:.0} rounds in all, if its point stayed at {}.",
            ratio_text(point)
        );
    }
    let _ = writeln!(md);
}
