//! The CPU path against float64 references: proptests over the shapes that break naive
//! implementations, every dtype, temperatures, thread counts, SIMD and portable paths.

mod common;

use common::{big_row, logits_row, reference};
use half::{bf16, f16};
use meridian_core::signals::entropy_from_logits;
use meridian_kernels::KernelError;
use meridian_kernels::cpu::{self, CpuOptions, Logits};
use proptest::prelude::*;

const ATOL: f64 = 1e-5;

fn run(logits: Logits<'_>, batch: usize, vocab: usize, t: f32, opts: CpuOptions) -> Vec<f32> {
    let mut out = vec![f32::NAN; batch];
    cpu::entropy(logits, batch, vocab, t, &mut out, &opts).expect("entropy");
    out
}

fn paths() -> [CpuOptions; 3] {
    [
        CpuOptions { threads: 1, simd: true },
        CpuOptions { threads: 3, simd: true },
        CpuOptions { threads: 2, simd: false },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn f32_rows_match_the_float64_reference(row in logits_row(300), t in 0.05f32..4.0) {
        let want = reference(&row, t);
        prop_assert!((want - entropy_from_logits(&row, t)).abs() < 1e-9);
        for opts in paths() {
            let got = run(Logits::F32(&row), 1, row.len(), t, opts)[0];
            prop_assert!((f64::from(got) - want).abs() < ATOL, "{:?}: {} vs {}", opts, got, want);
        }
    }

    #[test]
    fn batches_of_rows_are_independent(rows in proptest::collection::vec(logits_row(70), 1..6), t in 0.2f32..2.0) {
        // One vocab for all rows: pad shorter rows with -inf (which adds nothing).
        let vocab = rows.iter().map(Vec::len).max().unwrap_or(1);
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied().chain(std::iter::repeat(f32::NEG_INFINITY)).take(vocab)).collect();
        for opts in paths() {
            let got = run(Logits::F32(&flat), rows.len(), vocab, t, opts);
            for (r, g) in rows.iter().zip(&got) {
                prop_assert!((f64::from(*g) - reference(r, t)).abs() < ATOL);
            }
        }
    }

    #[test]
    fn half_inputs_match_the_reference_of_their_f32_values(row in proptest::collection::vec(-20.0f32..20.0, 1..400), t in 0.1f32..3.0) {
        let b: Vec<bf16> = row.iter().map(|v| bf16::from_f32(*v)).collect();
        let h: Vec<f16> = row.iter().map(|v| f16::from_f32(*v)).collect();
        let want_b = reference(&b.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), t);
        let want_h = reference(&h.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), t);
        for opts in paths() {
            prop_assert!((f64::from(run(Logits::Bf16(&b), 1, b.len(), t, opts)[0]) - want_b).abs() < ATOL);
            prop_assert!((f64::from(run(Logits::F16(&h), 1, h.len(), t, opts)[0]) - want_h).abs() < ATOL);
        }
    }
}

#[test]
fn qwen3_sized_rows_at_several_temperatures() {
    let vocab = 151_936;
    for (seed, spread) in [(1u64, 30.0f32), (2, 4.0), (3, 0.01), (4, 80.0)] {
        let row = big_row(vocab, seed, spread);
        for t in [0.6f32, 1.0, 1.7] {
            let want = reference(&row, t);
            for opts in paths() {
                let got = run(Logits::F32(&row), 1, vocab, t, opts)[0];
                assert!((f64::from(got) - want).abs() < ATOL, "seed {seed} t {t} {opts:?}: {got} vs {want}");
            }
        }
    }
}

#[test]
fn rising_and_falling_rows_rescale_exactly() {
    for n in [1usize, 7, 8, 15, 16, 17, 1000, 4099] {
        let up: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let steep: Vec<f32> = (0..n).map(|i| i as f32 * 3.0).collect();
        let down: Vec<f32> = up.iter().rev().copied().collect();
        for row in [&up, &steep, &down] {
            for t in [0.6f32, 1.0] {
                let want = reference(row, t);
                for opts in paths() {
                    let got = run(Logits::F32(row), 1, n, t, opts)[0];
                    assert!((f64::from(got) - want).abs() < ATOL, "n {n} t {t}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn degenerate_rows() {
    let cases: [(&[f32], f64); 6] = [
        (&[f32::NEG_INFINITY; 20], 0.0),
        (&[f32::NAN, 1.0, f32::NAN, 1.0], 2f64.ln()),
        (&[0.0, f32::NEG_INFINITY, 0.0, 0.0], 3f64.ln()),
        (&[5.0], 0.0),
        (&[1.0, f32::INFINITY, 2.0], 0.0),
        (&[f32::MAX, f32::MAX, -f32::MAX], 2f64.ln()),
    ];
    for (row, want) in cases {
        for opts in paths() {
            let got = run(Logits::F32(row), 1, row.len(), 1.0, opts)[0];
            assert!((f64::from(got) - want).abs() < ATOL, "{row:?} {opts:?}: {got} vs {want}");
            assert!((entropy_from_logits(row, 1.0) - want).abs() < ATOL);
        }
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    let x = [0.0f32; 6];
    let mut out = [0.0f32; 2];
    let o = CpuOptions::default();
    assert!(matches!(cpu::entropy(Logits::F32(&x), 2, 4, 1.0, &mut out, &o), Err(KernelError::Shape(_))));
    assert!(matches!(cpu::entropy(Logits::F32(&x), 0, 6, 1.0, &mut out, &o), Err(KernelError::Shape(_))));
    assert!(matches!(cpu::entropy(Logits::F32(&x), 3, 2, 1.0, &mut out, &o), Err(KernelError::Shape(_))));
    for t in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            cpu::entropy(Logits::F32(&x), 2, 3, t, &mut out, &o),
            Err(KernelError::Argument(_))
        ));
    }
    cpu::entropy(Logits::F32(&x), 2, 3, 1.0, &mut out, &o).expect("valid");
    assert!((f64::from(out[0]) - 3f64.ln()).abs() < ATOL);
}

#[test]
fn reports_which_path_it_takes() {
    // Not an assertion about the machine: just that the answer is stable and printed.
    println!("SIMD path available: {}", cpu::simd_available());
    assert_eq!(cpu::simd_available(), cpu::simd_available());
}
