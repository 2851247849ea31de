//! Top-k entropy bounds against meridian-core's `entropy_from_top_logprobs` on sorted
//! float64 logprobs, and the batched EAT against `meridian_core::signals::Eat` step by
//! step.

mod common;

use common::{logits_row, reference, top_logprobs};
use meridian_core::signals::{Eat, EatConfig, EntropyBound, entropy_from_top_logprobs};
use meridian_kernels::cpu::{self, CpuOptions, Logits};
use meridian_kernels::{KernelError, MAX_TOP_K};
use proptest::prelude::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-5
}

fn bound(row: &[f32], k: usize, t: f32, opts: CpuOptions) -> EntropyBound {
    let mut out = [EntropyBound { top_k: 0.0, lower: 0.0, upper: 0.0, residual: 0.0 }];
    cpu::topk_entropy(Logits::F32(row), 1, row.len(), k, t, &mut out, &opts).expect("topk");
    out[0]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn top_k_bound_matches_core_on_sorted_logprobs(row in logits_row(400), k in 1usize..=MAX_TOP_K, t in 0.2f32..3.0) {
        let k = k.min(row.len());
        let want = entropy_from_top_logprobs(&top_logprobs(&row, k, t), row.len());
        for opts in [CpuOptions { threads: 1, simd: true }, CpuOptions { threads: 2, simd: false }] {
            let got = bound(&row, k, t, opts);
            prop_assert!(close(got.top_k, want.top_k) && close(got.lower, want.lower)
                && close(got.upper, want.upper) && close(got.residual, want.residual), "{:?} vs {:?}", got, want);
        }
        // The bound brackets the full entropy (when the row has finite entries), to the
        // kernels' 1e-5: the residual 1 - sum p is a difference of nearly equal numbers.
        let h = reference(&row, t);
        let b = bound(&row, k, t, CpuOptions::default());
        if row.iter().all(|x| x.is_finite()) {
            prop_assert!(b.lower <= h + 1e-5 && h <= b.upper + 1e-5, "{:?} vs {}", b, h);
        }
    }
}

#[test]
fn top_k_on_a_large_row_split_across_threads() {
    let row = common::big_row(151_936, 9, 20.0);
    let want = entropy_from_top_logprobs(&top_logprobs(&row, 20, 1.0), row.len());
    let got = bound(&row, 20, 1.0, CpuOptions { threads: 4, simd: true });
    assert!(close(got.lower, want.lower) && close(got.upper, want.upper), "{got:?} vs {want:?}");
}

#[test]
fn top_k_rejects_k_out_of_range() {
    let row = [0.0f32; 8];
    let mut out = [EntropyBound { top_k: 0.0, lower: 0.0, upper: 0.0, residual: 0.0 }];
    for k in [0, 9, MAX_TOP_K + 1] {
        let r = cpu::topk_entropy(Logits::F32(&row), 1, 8, k, 1.0, &mut out, &CpuOptions::default());
        assert!(matches!(r, Err(KernelError::Argument(_))), "k {k}");
    }
}

#[test]
fn batched_eat_equals_core_eat_step_by_step() {
    let cfg = EatConfig { alpha: 0.3, delta: 1e-3, warmup_steps: 3 };
    let batch = 5;
    let mut reference: Vec<Eat> = (0..batch).map(|_| Eat::new(cfg)).collect();
    let (mut ema, mut var, mut steps, mut stop) =
        (vec![0.0; batch], vec![0.0; batch], vec![0u32; batch], vec![7u8; batch]);
    let mut want_stop = vec![7u8; batch];
    for step in 0..40 {
        let x: Vec<f32> =
            (0..batch).map(|i| 2.0 + ((step * (i + 1)) as f32 * 0.7).sin() / (1.0 + step as f32)).collect();
        // Row i takes a sample on steps where (step + i) % 3 != 0.
        let active: Vec<u8> = (0..batch).map(|i| u8::from((step + i) % 3 != 0)).collect();
        cpu::eat_update(&cfg, &x, Some(&active), &mut ema, &mut var, &mut steps, &mut stop).expect("eat");
        for i in 0..batch {
            if active[i] == 1 {
                let r = reference[i].update(f64::from(x[i]));
                want_stop[i] = u8::from(r.stop);
                assert_eq!((ema[i], var[i]), (r.ema, r.variance), "row {i} step {step}");
            }
            assert_eq!(steps[i], reference[i].state().steps);
            assert_eq!(stop[i], want_stop[i], "row {i} step {step}");
        }
    }
    assert!(stop.contains(&1), "the settling series should stop some rows");
}

#[test]
fn eat_rejects_bad_config_and_lengths() {
    let (mut e, mut v, mut s, mut st) = (vec![0.0; 2], vec![0.0; 2], vec![0u32; 2], vec![0u8; 2]);
    let good = EatConfig::default();
    for cfg in [
        EatConfig { alpha: 0.0, ..good },
        EatConfig { alpha: 1.5, ..good },
        EatConfig { delta: f64::NAN, ..good },
    ] {
        let r = cpu::eat_update(&cfg, &[1.0, 2.0], None, &mut e, &mut v, &mut s, &mut st);
        assert!(matches!(r, Err(KernelError::Argument(_))));
    }
    let r = cpu::eat_update(&good, &[1.0], None, &mut e, &mut v, &mut s, &mut st);
    assert!(matches!(r, Err(KernelError::Shape(_))));
    cpu::eat_update(&good, &[1.0, 2.0], None, &mut e, &mut v, &mut s, &mut st).expect("valid");
    assert_eq!(e, vec![1.0, 2.0]);
}
