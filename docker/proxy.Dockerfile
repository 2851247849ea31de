# syntax=docker/dockerfile:1
# The `meridian` proxy image. Build from the repository root:
#   docker build -f docker/proxy.Dockerfile -t meridian-proxy:0.1.0 .
# The release image leaves the embedded engine twin (simulated answers) out; the chart's
# demo mode needs an image with it, tagged with `-twin`:
#   docker build -f docker/proxy.Dockerfile --build-arg FEATURES=twin -t meridian-proxy:0.1.0-twin .
# Not built in this repository's CI (no container daemon there); see docs/src/deployment.md.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
# Cargo features of the proxy: none for the release image; `twin` for the demo image.
ARG FEATURES=""
WORKDIR /src
COPY . .
# The workspace's lock file pins every dependency (--locked).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p meridian-proxy --bin meridian --no-default-features \
        ${FEATURES:+--features "$FEATURES"} \
    && install -D target/release/meridian /out/meridian
# The image's default config: the documented defaults, listening on all interfaces (inside a
# container 127.0.0.1 is unreachable from outside). Checked with the binary just built.
RUN sed 's/^listen = "127.0.0.1:8080"$/listen = "0.0.0.0:8080"/' meridian.toml > /out/meridian.toml \
    && grep -q '^listen = "0.0.0.0:8080"$' /out/meridian.toml \
    && /out/meridian check --config /out/meridian.toml

# glibc + libgcc, no shell, no package manager; runs as 65532 (nonroot).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/meridian /usr/local/bin/meridian
COPY --from=build /out/meridian.toml /etc/meridian/meridian.toml
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["meridian"]
CMD ["serve", "--config", "/etc/meridian/meridian.toml"]
