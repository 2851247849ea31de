# syntax=docker/dockerfile:1
# vLLM's official OpenAI server image with the Meridian hook (pip distribution
# meridian-vllm-hook, import name meridian_hook) installed next to vLLM. Build from the
# repository root:
#   docker build -f docker/vllm-hook.Dockerfile -t meridian-vllm:0.1.0 .
# Not built in this repository's CI (no container daemon there); see docs/src/deployment.md.
#
# The hook is switched on by vLLM flags (the Helm chart passes them):
#   --scheduler-cls meridian_hook.scheduler.MeridianScheduler
#   --logits-processors meridian_hook.logits:MeridianLogitsProcessor
# and reads [hook]/[exit] from the file named by MERIDIAN_HOOK_CONFIG.

# Pinned: the hook is written against vLLM's scheduler and logits-processor interfaces of
# this version (docs/src/deployment.md says how to move it).
ARG VLLM_VERSION=0.32.0
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS rust

# Build the wheel with the image's own Python, so its ABI tag matches the interpreter the
# wheel will be installed into.
FROM vllm/vllm-openai:v${VLLM_VERSION} AS hook-build
COPY --from=rust /usr/local/cargo /usr/local/cargo
COPY --from=rust /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
WORKDIR /src
COPY . .
# vllm-hook/ is a maturin project (pyproject.toml); pip drives maturin through PEP 517.
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m pip wheel --no-deps --wheel-dir /wheels ./vllm-hook

FROM vllm/vllm-openai:v${VLLM_VERSION}
COPY --from=hook-build /wheels /tmp/meridian-wheels
# vLLM is already installed; the hook's other requirements, if any, come from the index.
RUN python3 -m pip install --no-cache-dir /tmp/meridian-wheels/meridian_vllm_hook-*.whl \
    && rm -rf /tmp/meridian-wheels \
    && python3 -c "import meridian_hook.scheduler, meridian_hook.logits"
# vLLM's image runs as root and its entrypoint (`vllm serve`) is kept.
