"""Step-time curve of a Qwen3-8B-shaped model on one GPU, to check the twin's
`h100-qwen3-8b` profile (derived from datasheets) against a measurement.

`python3 -m gpucurve measure` (from scripts/; needs a CUDA GPU and PyTorch) builds the
model's shape with random bf16 weights, runs one engine step per step shape (decode
batches over cached context, prompt chunks after a computed prefix, and the two mixed as
vLLM's chunked prefill mixes them) and times each as a CUDA graph, as vLLM replays its steps, and eagerly, as
a Python loop launching each kernel. It writes the timings as step traces in the format
of `meridian_hook.steptrace`, so `meridian-sim calibrate --steps` fits the twin's cost
model to them exactly as it fits a real engine's trace. It ends with a breakdown of a few
steps' GPU time by kernel family (PyTorch's profiler); `breakdown` re-takes that alone.
`fused` times a few of the steps again under torch.compile, whose fusion of the
elementwise ops is what vLLM's compiled model gets, beside the plain step.

`python3 -m gpucurve report` (needs cargo, for `meridian-sim`) fits the graph trace, sets
the fit and the datasheet profile beside the measured steps, runs the twin's A/B on both
profiles, and writes docs/src/benchmarks/gpu-step-curve.md with its plots.

What a step here is: embeddings, 36 decoder layers (RMSNorm, fused QKV projection,
per-head q/k RMSNorm, rotary embedding, the KV write, attention, output projection,
RMSNorm, fused gate/up projection, SiLU, down projection), the final norm, the LM head on
the last token of each request, and a softmax + argmax sampler. Attention runs through
PyTorch's scaled_dot_product_attention (its FlashAttention-2 where it takes the call):
decodes as one batched call with each KV head's four query heads folded into its query
length (exact for one-token queries, and what GQA decode kernels do), a prompt chunk as
one causal call aligned to the bottom right (its tokens see the whole prefix). What it
leaves out of a vLLM step: the scheduler, input preparation and detokenisation on the
CPU (overlapped with the GPU under vLLM's async scheduling), paged KV (here each decode
batch's cache is one dense tensor), vLLM's fused kernels (RMSNorm, rotary and SiLU are
separate PyTorch ops here: the breakdown measures what they cost) and FlashAttention-3,
which vLLM runs on Hopper. The KV cache is
one buffer that every layer reads: the bytes each layer reads are a real layer's, only
the footprint is smaller."""
