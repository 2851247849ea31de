//! The OTLP trace pipeline: exporter, sampler and resource from `[telemetry.tracing]`,
//! each unset field falling back to its standard `OTEL_*` variable. Nothing is built
//! while tracing is off, so a proxy without it pays for no exporter and no spans.

use crate::config::TracingConfig;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Tracer};

/// Why the trace pipeline could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    #[error("{origin}: unknown OTLP protocol {value:?} (grpc or http/protobuf)")]
    Protocol { origin: &'static str, value: String },
    #[error("telemetry.tracing: cannot build the OTLP {protocol} exporter: {source}")]
    Exporter {
        protocol: &'static str,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Grpc,
    HttpProtobuf,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::HttpProtobuf => "http/protobuf",
        }
    }
}

/// The transport: the config's, else `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
/// `OTEL_EXPORTER_OTLP_PROTOCOL`, else gRPC (the OTLP default).
fn transport(cfg: &TracingConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Transport, TracingError> {
    let (origin, value) = match &cfg.protocol {
        Some(p) => ("telemetry.tracing.protocol", p.clone()),
        None => match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v),
            None => match env("OTEL_EXPORTER_OTLP_PROTOCOL") {
                Some(v) => ("OTEL_EXPORTER_OTLP_PROTOCOL", v),
                None => return Ok(Transport::Grpc),
            },
        },
    };
    match value.trim() {
        "grpc" => Ok(Transport::Grpc),
        "http/protobuf" => Ok(Transport::HttpProtobuf),
        _ => Err(TracingError::Protocol { origin, value }),
    }
}

/// The configured endpoint as the exporter wants it. The config names the collector the
/// way `OTEL_EXPORTER_OTLP_ENDPOINT` does, so over HTTP the traces path is added here
/// (the exporter takes a programmatic endpoint as the full URL).
fn endpoint(cfg: &TracingConfig, transport: Transport) -> Option<String> {
    let e = cfg.endpoint.as_deref()?.trim_end_matches('/');
    Some(match transport {
        Transport::HttpProtobuf if !e.ends_with("/v1/traces") => format!("{e}/v1/traces"),
        _ => e.to_owned(),
    })
}

/// Whether traces are exported: never with `OTEL_SDK_DISABLED=true`; else as
/// `telemetry.tracing.enabled` says; unset, when `OTEL_TRACES_EXPORTER` names `otlp`. The
/// variable's own default is `otlp`, but only a value someone set counts: a proxy does
/// not start exporting because a variable is absent.
fn tracing_on(cfg: &TracingConfig, env: &dyn Fn(&str) -> Option<String>) -> bool {
    if sdk_disabled(env) {
        return false;
    }
    cfg.enabled.unwrap_or_else(|| {
        env("OTEL_TRACES_EXPORTER")
            .is_some_and(|v| v.split(',').any(|e| e.trim().eq_ignore_ascii_case("otlp")))
    })
}

/// Whether `OTEL_SDK_DISABLED` turns the SDK off (the spec's only true value is "true").
fn sdk_disabled(env: &dyn Fn(&str) -> Option<String>) -> bool {
    env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

fn read_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A running trace pipeline; [`shutdown`](Self::shutdown) flushes what is still queued.
pub struct TracePipeline {
    provider: SdkTracerProvider,
    pub(super) tracer: Tracer,
}

impl TracePipeline {
    /// Builds the pipeline, or `None` when tracing is off (see [`tracing_on`]). Must run
    /// inside the tokio runtime (gRPC's channel lives there).
    pub fn start(cfg: &TracingConfig) -> Result<Option<Self>, TracingError> {
        if !tracing_on(cfg, &read_env) {
            return Ok(None);
        }
        let transport = transport(cfg, &read_env)?;
        let endpoint = endpoint(cfg, transport);
        let built = match transport {
            Transport::Grpc => {
                // tonic speaks TLS only when given a config: an https:// collector, from
                // the config or the variables, gets one with the system's roots.
                let tls = endpoint
                    .clone()
                    .or_else(|| read_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
                    .or_else(|| read_env("OTEL_EXPORTER_OTLP_ENDPOINT"))
                    .is_some_and(|e| e.trim().starts_with("https://"));
                let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                if let Some(e) = endpoint {
                    b = b.with_endpoint(e);
                }
                if tls {
                    b = b.with_tls_config(ClientTlsConfig::new().with_native_roots());
                }
                b.build()
            }
            Transport::HttpProtobuf => {
                let mut b = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary);
                if let Some(e) = endpoint {
                    b = b.with_endpoint(e);
                }
                b.build()
            }
        };
        let exporter =
            built.map_err(|source| TracingError::Exporter { protocol: transport.name(), source })?;
        // The resource builder reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the
        // config wins over them, and "meridian" is the name when nobody gave one.
        let mut resource = Resource::builder();
        match (&cfg.service_name, read_env("OTEL_SERVICE_NAME")) {
            (Some(name), _) => resource = resource.with_service_name(name.clone()),
            (None, None) => resource = resource.with_service_name("meridian"),
            (None, Some(_)) => {}
        }
        let mut builder =
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build());
        // Unset, the SDK's default reads OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG.
        if let Some(ratio) = cfg.sample_ratio {
            builder = builder.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
        }
        let provider = builder.build();
        let tracer = provider.tracer("meridian");
        Ok(Some(TracePipeline { provider, tracer }))
    }

    /// Exports the spans still queued and stops the exporter. Blocks (the batch
    /// processor's own thread does the work), so call it off the runtime's workers or at
    /// exit.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.force_flush() {
            eprintln!("meridian: traces not flushed at exit: {e}");
        }
        if let Err(e) = self.provider.shutdown() {
            eprintln!("meridian: trace exporter did not shut down cleanly: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn protocol_comes_from_config_then_signal_variable_then_general_variable() {
        let mut cfg = TracingConfig { enabled: Some(true), ..TracingConfig::default() };
        assert_eq!(transport(&cfg, &env_of(&[])).unwrap(), Transport::Grpc);
        let general = env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]);
        assert_eq!(transport(&cfg, &general).unwrap(), Transport::HttpProtobuf);
        let both = env_of(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]);
        assert_eq!(transport(&cfg, &both).unwrap(), Transport::Grpc);
        cfg.protocol = Some("http/protobuf".into());
        assert_eq!(transport(&cfg, &both).unwrap(), Transport::HttpProtobuf);
        cfg.protocol = None;
        let bad = env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]);
        let err = transport(&cfg, &bad).unwrap_err().to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && err.contains("http/json"), "{err}");
    }

    #[test]
    fn http_endpoint_gets_the_traces_path_like_the_base_variable_does() {
        let cfg =
            TracingConfig { endpoint: Some("http://collector:4318/".into()), ..TracingConfig::default() };
        assert_eq!(
            endpoint(&cfg, Transport::HttpProtobuf).as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(endpoint(&cfg, Transport::Grpc).as_deref(), Some("http://collector:4318"));
        let full =
            TracingConfig { endpoint: Some("http://c:4318/v1/traces".into()), ..TracingConfig::default() };
        assert_eq!(endpoint(&full, Transport::HttpProtobuf).as_deref(), Some("http://c:4318/v1/traces"));
        assert_eq!(endpoint(&TracingConfig::default(), Transport::Grpc), None);
    }

    #[test]
    fn sdk_disabled_only_by_true() {
        assert!(sdk_disabled(&env_of(&[("OTEL_SDK_DISABLED", "TRUE")])));
        assert!(!sdk_disabled(&env_of(&[("OTEL_SDK_DISABLED", "1")])));
        assert!(!sdk_disabled(&env_of(&[])));
    }

    #[test]
    fn an_explicit_otlp_traces_exporter_turns_traces_on_unless_the_config_says_off() {
        let unset = TracingConfig::default();
        assert!(!tracing_on(&unset, &env_of(&[])), "off by default");
        assert!(tracing_on(&unset, &env_of(&[("OTEL_TRACES_EXPORTER", "otlp")])));
        assert!(tracing_on(&unset, &env_of(&[("OTEL_TRACES_EXPORTER", "console, OTLP")])));
        assert!(!tracing_on(&unset, &env_of(&[("OTEL_TRACES_EXPORTER", "none")])));
        let off = TracingConfig { enabled: Some(false), ..TracingConfig::default() };
        assert!(!tracing_on(&off, &env_of(&[("OTEL_TRACES_EXPORTER", "otlp")])), "the config's false wins");
        let on = TracingConfig { enabled: Some(true), ..TracingConfig::default() };
        assert!(tracing_on(&on, &env_of(&[])));
        let disabled = env_of(&[("OTEL_TRACES_EXPORTER", "otlp"), ("OTEL_SDK_DISABLED", "true")]);
        assert!(!tracing_on(&on, &disabled) && !tracing_on(&unset, &disabled), "the SDK switch wins");
    }

    #[test]
    fn nothing_is_built_while_tracing_is_off() {
        assert!(TracePipeline::start(&TracingConfig::default()).unwrap().is_none());
    }
}
