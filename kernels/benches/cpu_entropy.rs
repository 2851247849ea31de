//! The CPU path's own speed and accuracy on [batch, 151936] logits (Qwen3's vocabulary):
//! milliseconds per call on 1 thread and on every core, GB/s of logits read, and the
//! largest deviation from the float64 definition over the rows. The NumPy comparison
//! that the docs report is scripts/bench-kernels.sh (it calls this crate's cdylib and
//! NumPy side by side in one process).
//!
//!   cargo bench -p meridian-kernels --bench cpu_entropy [-- BATCH]

use std::time::Instant;

use half::bf16;
use meridian_core::signals::entropy_from_logits;
use meridian_kernels::cpu::{self, CpuOptions, Logits};

const VOCAB: usize = 151_936;
const REPS: usize = 5;

fn logits(batch: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..batch * VOCAB)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Roughly the shape of real logits: a wide bulk and a thin high tail.
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            let tail = if s % 3000 == 0 { 12.0 } else { 0.0 };
            (u - 0.5) * 24.0 + tail
        })
        .collect()
}

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[REPS / 2]
}

fn main() {
    let batch: usize = std::env::args().filter_map(|a| a.parse().ok()).next().unwrap_or(256);
    let x = logits(batch);
    let xb: Vec<bf16> = x.iter().map(|v| bf16::from_f32(*v)).collect();
    let mut out = vec![0f32; batch];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("[{batch}, {VOCAB}] logits, SIMD path: {}, {cores} cores", cpu::simd_available());
    for (name, threads, simd) in
        [("simd, 1 thread", 1, true), ("simd, all cores", 0, true), ("portable f64, 1 thread", 1, false)]
    {
        let opts = CpuOptions { threads, simd };
        let ms =
            median_ms(|| cpu::entropy(Logits::F32(&x), batch, VOCAB, 0.6, &mut out, &opts).expect("entropy"));
        let gbs = (batch * VOCAB * 4) as f64 / (ms * 1e-3) / 1e9;
        println!("f32  {name:<24} {ms:9.2} ms  {gbs:6.2} GB/s");
    }
    let opts = CpuOptions::single_thread();
    let ms =
        median_ms(|| cpu::entropy(Logits::Bf16(&xb), batch, VOCAB, 0.6, &mut out, &opts).expect("entropy"));
    println!(
        "bf16 simd, 1 thread             {ms:9.2} ms  {:6.2} GB/s",
        (batch * VOCAB * 2) as f64 / (ms * 1e-3) / 1e9
    );

    cpu::entropy(Logits::F32(&x), batch, VOCAB, 0.6, &mut out, &opts).expect("entropy");
    let worst = x
        .chunks(VOCAB)
        .zip(&out)
        .map(|(row, h)| (entropy_from_logits(row, 0.6) - f64::from(*h)).abs())
        .fold(0.0f64, f64::max);
    println!("largest |H - H_f64| over the batch: {worst:.2e}");
}
