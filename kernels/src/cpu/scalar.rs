//! The portable path: `meridian_core`'s float64 one-pass state, element by element. Used
//! where AVX2/FMA/F16C are missing, and as the exact reference the SIMD path is tested
//! against.

use meridian_core::signals::EntropyState;

use super::Logits;
use super::topk::TopK;

pub(crate) fn reduce(seg: &Logits<'_>, temperature: f32, top: &mut TopK) -> EntropyState {
    let t = super::effective_temperature(temperature);
    let mut state = EntropyState::EMPTY;
    let mut each = |v: f32| {
        state.push(f64::from(v) / t);
        top.offer(v);
    };
    match seg {
        Logits::F32(s) => s.iter().for_each(|&v| each(v)),
        Logits::Bf16(s) => s.iter().for_each(|v| each(v.to_f32())),
        Logits::F16(s) => s.iter().for_each(|v| each(v.to_f32())),
    }
    state
}
