//! The C ABI: results, status codes and messages for bad input, and the header in step
//! with the exported symbols.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use meridian_kernels::ffi::*;

fn last_error() -> String {
    // SAFETY: never null, NUL-terminated, valid until this thread's next call.
    unsafe { CStr::from_ptr(meridian_kernels_last_error()) }.to_string_lossy().into_owned()
}

const CPU: i32 = 0;
const CUDA: i32 = 1;

#[test]
fn entropy_on_the_cpu_through_the_abi() {
    let x = [1.0f32, 1.0, 1.0, 1.0, 0.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
    let mut out = [0f32; 2];
    // SAFETY: sizes match.
    let rc =
        unsafe { meridian_kernels_entropy(x.as_ptr().cast(), 0, 2, 4, 1.0, out.as_mut_ptr(), CPU, 0, 1) };
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(last_error(), "");
    assert!((f64::from(out[0]) - 4f64.ln()).abs() < 1e-6 && (f64::from(out[1]) - 2f64.ln()).abs() < 1e-6);

    let mut bounds = [0f32; 8];
    // SAFETY: sizes match.
    let rc = unsafe {
        meridian_kernels_topk_entropy(x.as_ptr().cast(), 0, 2, 4, 2, 1.0, bounds.as_mut_ptr(), CPU, 0, 1)
    };
    assert_eq!(rc, 0, "{}", last_error());
    // Row 1 has all its mass on 2 tokens: exact, residual 0.
    assert!((f64::from(bounds[4]) - 2f64.ln()).abs() < 1e-6 && bounds[7].abs() < 1e-6);
    assert!(bounds[1] <= out[0] + 1e-6 && out[0] <= bounds[2] + 1e-6);
}

#[test]
fn errors_have_distinct_codes_and_messages() {
    let x = [0f32; 8];
    let mut out = [0f32; 2];
    // SAFETY (all calls): every non-null pointer is valid for the sizes passed.
    unsafe {
        assert_eq!(meridian_kernels_entropy(null(), 0, 2, 4, 1.0, out.as_mut_ptr(), CPU, 0, 1), -2);
        assert!(last_error().contains("logits"), "{}", last_error());
        assert_eq!(meridian_kernels_entropy(x.as_ptr().cast(), 0, 2, 4, 1.0, null_mut(), CPU, 0, 1), -2);
        assert!(last_error().contains("out"));
        assert_eq!(
            meridian_kernels_entropy(x.as_ptr().cast(), 0, 0, 4, 1.0, out.as_mut_ptr(), CPU, 0, 1),
            -3
        );
        assert!(last_error().contains("shape"));
        assert_eq!(
            meridian_kernels_entropy(x.as_ptr().cast(), 0, usize::MAX, 4, 1.0, out.as_mut_ptr(), CPU, 0, 1),
            -3
        );
        assert_eq!(
            meridian_kernels_entropy(x.as_ptr().cast(), 7, 2, 4, 1.0, out.as_mut_ptr(), CPU, 0, 1),
            -4
        );
        assert!(last_error().contains("dtype"));
        assert_eq!(
            meridian_kernels_entropy(x.as_ptr().cast(), 0, 2, 4, -1.0, out.as_mut_ptr(), CPU, 0, 1),
            -5
        );
        assert!(last_error().contains("temperature"));
        assert_eq!(meridian_kernels_entropy(x.as_ptr().cast(), 0, 2, 4, 1.0, out.as_mut_ptr(), 9, 0, 1), -5);
        assert!(last_error().contains("device"));
        let misaligned = x.as_ptr().cast::<u8>().add(1).cast();
        assert_eq!(meridian_kernels_entropy(misaligned, 0, 1, 4, 1.0, out.as_mut_ptr(), CPU, 0, 1), -5);
        assert_eq!(
            meridian_kernels_topk_entropy(x.as_ptr().cast(), 0, 2, 4, 0, 1.0, out.as_mut_ptr(), CPU, 0, 1),
            -5
        );
        assert!(last_error().contains('k'));
        // A success clears the message.
        assert_eq!(meridian_kernels_entropy(x.as_ptr().cast(), 0, 2, 4, 1.0, out.as_mut_ptr(), CPU, 0, 1), 0);
        assert_eq!(last_error(), "");
    }
}

#[test]
fn eat_through_the_abi() {
    let x = [2.0f32, 1.0];
    let (mut ema, mut var, mut steps, mut stop) = ([0f64; 2], [0f64; 2], [0u32; 2], [9u8; 2]);
    let active = [1u8, 0];
    // SAFETY: all arrays hold 2 elements.
    let rc = unsafe {
        meridian_kernels_eat_update(
            x.as_ptr(),
            active.as_ptr(),
            ema.as_mut_ptr(),
            var.as_mut_ptr(),
            steps.as_mut_ptr(),
            stop.as_mut_ptr(),
            2,
            0.5,
            0.01,
            2,
            CPU,
            0,
        )
    };
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!((ema, steps, stop), ([2.0, 0.0], [1, 0], [0, 9]));
    // SAFETY: the null `ema` is the point; the rest are valid.
    let rc = unsafe {
        meridian_kernels_eat_update(
            x.as_ptr(),
            null(),
            null_mut(),
            var.as_mut_ptr(),
            steps.as_mut_ptr(),
            stop.as_mut_ptr(),
            2,
            0.5,
            0.01,
            2,
            CPU,
            0,
        )
    };
    assert_eq!(rc, -2);
    assert!(last_error().contains("ema"));
    // SAFETY: valid pointers; alpha is the point.
    let rc = unsafe {
        meridian_kernels_eat_update(
            x.as_ptr(),
            null(),
            ema.as_mut_ptr(),
            var.as_mut_ptr(),
            steps.as_mut_ptr(),
            stop.as_mut_ptr(),
            2,
            0.0,
            0.01,
            2,
            CPU,
            0,
        )
    };
    assert_eq!(rc, -5);
}

#[test]
fn cuda_calls_without_cuda_say_unavailable() {
    if meridian_kernels::cuda::available() {
        println!("CUDA present: the unavailable path is not exercised on this machine");
        return;
    }
    assert_eq!(meridian_kernels_cuda_available(), 0);
    assert!(last_error().contains("CUDA unavailable"), "{}", last_error());
    let x = [0f32; 4];
    let mut out = [0f32; 1];
    // SAFETY: with no CUDA, nothing is dereferenced.
    let rc =
        unsafe { meridian_kernels_entropy(x.as_ptr().cast(), 0, 1, 4, 1.0, out.as_mut_ptr(), CUDA, 0, 0) };
    assert_eq!(rc, -1);
    println!("CUDA unavailable here, as expected: {}", last_error());
}

#[test]
fn abi_version_and_header_agree_with_the_exports() {
    assert_eq!(meridian_kernels_abi_version(), ABI_VERSION);
    let header = include_str!("../include/meridian_kernels.h");
    assert!(header.contains(&format!("#define MERIDIAN_KERNELS_ABI_VERSION {ABI_VERSION}")));
    let src = include_str!("../src/ffi.rs");
    let exported: Vec<&str> =
        src.split("extern \"C\" fn ").skip(1).filter_map(|rest| rest.split('(').next()).collect();
    assert!(exported.len() >= 6, "{exported:?}");
    for name in exported {
        assert!(header.contains(&format!("{name}(")), "{name} is exported but not declared in the header");
    }
    // The status codes in the header are KernelError::code's.
    use meridian_kernels::KernelError as E;
    let codes = [
        ("EUNAVAILABLE", E::Unavailable { reason: String::new() }.code()),
        ("ENULL", E::NullPointer { what: "" }.code()),
        ("ESHAPE", E::Shape(String::new()).code()),
        ("EDTYPE", E::DType(String::new()).code()),
        ("EARGUMENT", E::Argument(String::new()).code()),
        ("ECUDA", E::Cuda { op: "", detail: String::new() }.code()),
        ("EINTERNAL", E::Internal(String::new()).code()),
    ];
    for (name, code) in codes {
        assert!(header.contains(&format!("MERIDIAN_KERNELS_{name} ({code})")), "{name} {code}");
    }
}
