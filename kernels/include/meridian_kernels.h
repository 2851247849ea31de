/*
 * meridian_kernels.h: the C ABI of meridian-kernels (libmeridian_kernels.so).
 *
 * Batched entropy of softmax(logits / temperature), its top-k residual-mass bound, and
 * the EAT (EMA / EMA-variance) update, on the CPU (host pointers) or on CUDA (device
 * pointers and a CUstream; nothing is copied, nothing synchronises).
 *
 * Every function but the first three returns a status: 0 on success, else one of the
 * negative MERIDIAN_KERNELS_E* codes; meridian_kernels_last_error() then holds the
 * calling thread's message. Without CUDA (no driver, no device, no NVRTC) every CUDA call
 * returns MERIDIAN_KERNELS_EUNAVAILABLE: fall back to the CPU. Hand-written; a test checks
 * that every exported symbol is declared here.
 */
#ifndef MERIDIAN_KERNELS_H
#define MERIDIAN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MERIDIAN_KERNELS_ABI_VERSION 1

/* Status codes. */
#define MERIDIAN_KERNELS_OK 0
#define MERIDIAN_KERNELS_EUNAVAILABLE (-1) /* CUDA cannot run here: use the CPU */
#define MERIDIAN_KERNELS_ENULL (-2)        /* a required pointer was NULL */
#define MERIDIAN_KERNELS_ESHAPE (-3)       /* zero, overflowing or inconsistent sizes */
#define MERIDIAN_KERNELS_EDTYPE (-4)       /* unknown dtype code */
#define MERIDIAN_KERNELS_EARGUMENT (-5)    /* temperature, k, EAT parameters, device, alignment */
#define MERIDIAN_KERNELS_ECUDA (-6)        /* a CUDA driver or NVRTC call failed */
#define MERIDIAN_KERNELS_EINTERNAL (-7)    /* a bug (a caught panic) */

/* dtype codes. */
#define MERIDIAN_KERNELS_F32 0
#define MERIDIAN_KERNELS_BF16 1
#define MERIDIAN_KERNELS_F16 2

/* device codes. */
#define MERIDIAN_KERNELS_CPU 0
#define MERIDIAN_KERNELS_CUDA 1

/* Largest k meridian_kernels_topk_entropy accepts. */
#define MERIDIAN_KERNELS_MAX_TOP_K 32

/* MERIDIAN_KERNELS_ABI_VERSION of the loaded library. */
uint32_t meridian_kernels_abi_version(void);

/* The calling thread's last error message ("" after a success); never NULL, valid until
 * the thread's next call. */
const char *meridian_kernels_last_error(void);

/* 1 if the CUDA path can run here, else 0 (the reason is in last_error). */
int32_t meridian_kernels_cuda_available(void);

/* Per-row entropy (nats) of softmax(logits / temperature). logits: row-major
 * [batch, vocab] of dtype; out: batch floats. device 0: host pointers, `threads` workers
 * (0 = every core), stream ignored. device 1: device pointers on one GPU, enqueued on
 * `stream` (a CUstream; 0 = legacy default stream), threads ignored. -inf and NaN logits
 * are skipped; a row with +inf, or with no finite logit, gives 0. temperature > 0. */
int32_t meridian_kernels_entropy(const void *logits, int32_t dtype, size_t batch, size_t vocab,
                                 float temperature, float *out, int32_t device, uint64_t stream,
                                 uint32_t threads);

/* Per-row top-k entropy bound: out is [batch, 4] floats (top_k, lower, upper, residual),
 * from the k largest logprobs of softmax(logits / temperature); 1 <= k <= 32 and k <= vocab.
 * Other arguments as meridian_kernels_entropy. */
int32_t meridian_kernels_topk_entropy(const void *logits, int32_t dtype, size_t batch, size_t vocab,
                                      uint32_t k, float temperature, float *out, int32_t device,
                                      uint64_t stream, uint32_t threads);

/* One EAT step for each row with active[i] != 0 (active may be NULL: every row): sample
 * x[i]; state ema[i], variance[i], steps[i] updated in place (start from zeros); stop[i]
 * set to 1 when the EMA variance is below delta after warmup_steps samples, else 0.
 * Inactive rows are left untouched. 0 < alpha <= 1, delta >= 0. */
int32_t meridian_kernels_eat_update(const float *x, const uint8_t *active, double *ema,
                                    double *variance, uint32_t *steps, uint8_t *stop, size_t batch,
                                    double alpha, double delta, uint32_t warmup_steps,
                                    int32_t device, uint64_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MERIDIAN_KERNELS_H */
