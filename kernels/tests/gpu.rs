//! GPU-vs-CPU agreement (atol 1e-5) for every kernel, dtype and awkward shape. Each test
//! checks for CUDA at run time and, without it, prints why it is skipped and passes:
//! "skipped: no CUDA device (<reason>)".

mod common;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::{bf16, f16};
use meridian_core::signals::EntropyBound;
use meridian_kernels::cpu::{self, CpuOptions, Logits};
use meridian_kernels::cuda::{self, EatBuffers};
use meridian_kernels::{DType, EatConfig, KernelError};

const ATOL: f32 = 1e-5;

fn gpu(test: &str) -> Option<(Arc<CudaContext>, Arc<CudaStream>)> {
    match cuda::probe() {
        Err(e) => {
            println!("{test}: skipped: no CUDA device ({e})");
            None
        }
        Ok(info) => {
            println!("{test}: running on {info:?}");
            let ctx = CudaContext::new(info.ordinal as usize).expect("context");
            let stream = ctx.new_stream().expect("stream");
            Some((ctx, stream))
        }
    }
}

fn ptr<T>(s: &CudaSlice<T>, st: &CudaStream) -> u64 {
    s.device_ptr(st).0
}

fn ptr_mut<T>(s: &mut CudaSlice<T>, st: &CudaStream) -> u64 {
    s.device_ptr_mut(st).0
}

/// The rows as the CPU sees them, in the dtype.
enum Host {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Host {
    fn logits(&self) -> Logits<'_> {
        match self {
            Host::F32(v) => Logits::F32(v),
            Host::Bf16(v) => Logits::Bf16(v),
            Host::F16(v) => Logits::F16(v),
        }
    }
}

/// The rows on the GPU (as the dtype's bytes) and on the host.
fn upload(st: &Arc<CudaStream>, x: &[f32], dtype: DType) -> (CudaSlice<u8>, Host) {
    let (bytes, host): (Vec<u8>, Host) = match dtype {
        DType::F32 => (x.iter().flat_map(|v| v.to_le_bytes()).collect(), Host::F32(x.to_vec())),
        DType::Bf16 => {
            let h: Vec<bf16> = x.iter().map(|v| bf16::from_f32(*v)).collect();
            (h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(), Host::Bf16(h))
        }
        DType::F16 => {
            let h: Vec<f16> = x.iter().map(|v| f16::from_f32(*v)).collect();
            (h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(), Host::F16(h))
        }
    };
    (st.clone_htod(&bytes).expect("upload"), host)
}

const SHAPES: [(usize, usize); 6] = [(1, 1), (3, 7), (5, 17), (2, 1000), (4, 4099), (8, 151_936)];

#[test]
fn entropy_agrees_with_the_cpu_for_every_dtype_and_shape() {
    let Some((_ctx, st)) = gpu("entropy_agrees_with_the_cpu_for_every_dtype_and_shape") else { return };
    for (batch, vocab) in SHAPES {
        let mut x = common::big_row(batch * vocab, (batch * vocab) as u64, 30.0);
        if vocab > 4 {
            x[2] = f32::NEG_INFINITY;
            x[vocab + 1] = f32::NAN;
        }
        for dtype in DType::ALL {
            for t in [0.6f32, 1.0] {
                let (dx, host) = upload(&st, &x, dtype);
                let mut dout = st.alloc_zeros::<f32>(batch).expect("alloc");
                // SAFETY: live allocations of the right sizes on this stream's device.
                unsafe {
                    cuda::entropy(
                        ptr(&dx, &st),
                        dtype,
                        batch,
                        vocab,
                        t,
                        ptr_mut(&mut dout, &st),
                        st.cu_stream() as u64,
                    )
                }
                .expect("cuda entropy");
                let got = st.clone_dtoh(&dout).expect("download");
                let mut want = vec![0f32; batch];
                cpu::entropy(host.logits(), batch, vocab, t, &mut want, &CpuOptions::default()).expect("cpu");
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() < ATOL, "[{batch},{vocab}] {dtype:?} t {t}: gpu {g} cpu {w}");
                }
            }
        }
    }
}

#[test]
fn misaligned_rows_and_degenerate_rows() {
    let Some((_ctx, st)) = gpu("misaligned_rows_and_degenerate_rows") else { return };
    // Start one element into the allocation, so no row is 16-byte aligned.
    let rows: Vec<f32> = [vec![f32::NEG_INFINITY; 33], vec![1.0, f32::INFINITY, 2.0], vec![0.5; 40]].concat();
    let mut x = vec![9.0f32];
    x.extend(rows.iter().take(33 * 3).copied().chain(std::iter::repeat(0.0)).take(33 * 3));
    let dx = st.clone_htod(&x).expect("upload");
    let mut dout = st.alloc_zeros::<f32>(3).expect("alloc");
    // SAFETY: 99 floats after the first one, 3 outputs.
    unsafe {
        cuda::entropy(
            ptr(&dx, &st) + 4,
            DType::F32,
            3,
            33,
            1.0,
            ptr_mut(&mut dout, &st),
            st.cu_stream() as u64,
        )
    }
    .expect("cuda entropy");
    let got = st.clone_dtoh(&dout).expect("download");
    let mut want = vec![0f32; 3];
    cpu::entropy(Logits::F32(&x[1..]), 3, 33, 1.0, &mut want, &CpuOptions::default()).expect("cpu");
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < ATOL, "gpu {g} cpu {w}");
    }
}

#[test]
fn top_k_agrees_with_the_cpu() {
    let Some((_ctx, st)) = gpu("top_k_agrees_with_the_cpu") else { return };
    for (batch, vocab) in SHAPES {
        let x = common::big_row(batch * vocab, 77 + vocab as u64, 20.0);
        for dtype in DType::ALL {
            let k = 20.min(vocab);
            let (dx, host) = upload(&st, &x, dtype);
            let mut dout = st.alloc_zeros::<f32>(4 * batch).expect("alloc");
            // SAFETY: live allocations of the right sizes.
            unsafe {
                cuda::topk_entropy(
                    ptr(&dx, &st),
                    dtype,
                    batch,
                    vocab,
                    k,
                    1.0,
                    ptr_mut(&mut dout, &st),
                    st.cu_stream() as u64,
                )
            }
            .expect("cuda topk");
            let got = st.clone_dtoh(&dout).expect("download");
            let mut want = vec![EntropyBound { top_k: 0.0, lower: 0.0, upper: 0.0, residual: 0.0 }; batch];
            cpu::topk_entropy(host.logits(), batch, vocab, k, 1.0, &mut want, &CpuOptions::default())
                .expect("cpu");
            for (g, w) in got.chunks(4).zip(&want) {
                let w = [w.top_k as f32, w.lower as f32, w.upper as f32, w.residual as f32];
                for (a, b) in g.iter().zip(w) {
                    assert!((a - b).abs() < ATOL, "[{batch},{vocab}] {dtype:?}: gpu {g:?} cpu {w:?}");
                }
            }
        }
    }
}

#[test]
fn eat_is_bit_identical_to_the_cpu() {
    let Some((_ctx, st)) = gpu("eat_is_bit_identical_to_the_cpu") else { return };
    let cfg = EatConfig { alpha: 0.2, delta: 1e-3, warmup_steps: 4 };
    let batch = 300;
    let (mut ema, mut var, mut steps, mut stop) =
        (vec![0f64; batch], vec![0f64; batch], vec![0u32; batch], vec![0u8; batch]);
    let mut d_ema = st.clone_htod(&ema).expect("up");
    let mut d_var = st.clone_htod(&var).expect("up");
    let mut d_steps = st.clone_htod(&steps).expect("up");
    let mut d_stop = st.clone_htod(&stop).expect("up");
    for step in 0..30 {
        let x: Vec<f32> =
            (0..batch).map(|i| 1.0 + ((i * 7 + step) as f32).sin() / (1.0 + step as f32)).collect();
        let active: Vec<u8> = (0..batch).map(|i| u8::from((i + step) % 4 != 0)).collect();
        let (dx, da) = (st.clone_htod(&x).expect("up"), st.clone_htod(&active).expect("up"));
        let b = EatBuffers {
            x: ptr(&dx, &st),
            active: ptr(&da, &st),
            ema: ptr_mut(&mut d_ema, &st),
            variance: ptr_mut(&mut d_var, &st),
            steps: ptr_mut(&mut d_steps, &st),
            stop: ptr_mut(&mut d_stop, &st),
        };
        // SAFETY: every buffer holds `batch` elements on this device.
        unsafe { cuda::eat_update(&cfg, &b, batch, st.cu_stream() as u64) }.expect("cuda eat");
        cpu::eat_update(&cfg, &x, Some(&active), &mut ema, &mut var, &mut steps, &mut stop).expect("cpu eat");
    }
    assert_eq!(st.clone_dtoh(&d_ema).expect("down"), ema);
    assert_eq!(st.clone_dtoh(&d_var).expect("down"), var);
    assert_eq!(st.clone_dtoh(&d_steps).expect("down"), steps);
    assert_eq!(st.clone_dtoh(&d_stop).expect("down"), stop);
}

/// Needs only NVRTC (no driver, no device): compiles the embedded source for the
/// architectures the hook targets and checks every kernel is in each cubin.
#[test]
fn kernels_compile_with_nvrtc() {
    for (major, minor) in [(9, 0), (8, 0), (8, 9), (7, 5)] {
        match cuda::compile_only(major, minor) {
            Err(KernelError::Unavailable { reason }) => {
                println!("kernels_compile_with_nvrtc: skipped: no NVRTC ({reason})");
                return;
            }
            Err(e) => panic!("sm_{major}{minor}: {e}"),
            Ok(cubin) => {
                for name in cuda::KERNELS {
                    assert!(
                        cubin.windows(name.len()).any(|w| w == name.as_bytes()),
                        "{name} missing for sm_{major}{minor}"
                    );
                }
                println!("sm_{major}{minor}: {} byte cubin", cubin.len());
            }
        }
    }
}

#[test]
fn host_pointers_are_refused_on_the_cuda_path() {
    let x = [0f32; 8];
    let mut out = [0f32; 2];
    // SAFETY: host memory; the call must refuse it before any launch.
    let r = unsafe { cuda::entropy(x.as_ptr() as u64, DType::F32, 2, 4, 1.0, out.as_mut_ptr() as u64, 0) };
    match r {
        Err(KernelError::Unavailable { reason }) => println!("skipped: no CUDA device ({reason})"),
        Err(KernelError::Argument(msg)) => assert!(msg.contains("not CUDA device memory"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}
