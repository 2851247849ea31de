//! `meridian.toml` loading: the shipped file is valid, mistakes are named by dotted path,
//! and overrides from flags and the environment land where they should.

use meridian_core::ModelRegistry;
use meridian_proxy::config::MeridianConfig;
use meridian_proxy::config::{ConfigError, Override, load_config, parse_config};

const SHIPPED: &str = include_str!("../../meridian.toml");

fn validate(text: &str) -> Result<MeridianConfig, String> {
    let cfg = parse_config(text, "test.toml", &[]).map_err(|e| e.to_string())?;
    cfg.validate(&ModelRegistry::builtin().unwrap())
        .map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))?;
    Ok(cfg)
}

#[test]
fn shipped_file_is_valid_and_equals_the_defaults() {
    let cfg = validate(SHIPPED).unwrap();
    assert_eq!(cfg, MeridianConfig::default(), "meridian.toml must document the defaults");
}

#[test]
fn unknown_field_is_rejected_with_its_path() {
    let err = validate("[upstream]\nmax_attempt = 3\n").unwrap_err();
    assert!(err.contains("upstream"), "{err}");
    assert!(err.contains("unknown field `max_attempt`"), "{err}");
}

#[test]
fn type_errors_name_the_dotted_path() {
    let err = validate("[upstream]\nmax_attempts = \"three\"\n").unwrap_err();
    assert!(err.contains("upstream.max_attempts"), "{err}");
}

#[test]
fn every_invalid_value_is_reported_at_once() {
    let err = validate(
        r#"
[server]
listen = "nowhere"
[upstream]
max_attempts = 0
health_interval_s = -1.0
pool_idle_timeout_s = 0
[[upstream.endpoints]]
url = "http://vllm:8000/v1"
[[upstream.endpoints]]
url = "ftp://x"
[[upstream.endpoints]]
url = "http://a:8000"
models = []
[[upstream.endpoints]]
url = "http://b:8000"
models = ["ok", " "]
[models]
default_family = "nope"
[admission]
enabled = true
max_kv_usage = 1.5
queue_timeout_s = 0
max_queued = 0
"#,
    )
    .unwrap_err();
    for expected in [
        "server.listen must be an address",
        "upstream.max_attempts must be in [1, 10]; got 0",
        "upstream.health_interval_s must be a positive number of seconds; got -1",
        "upstream.pool_idle_timeout_s must be a positive number of seconds; got 0",
        "upstream.endpoints[0].url must be the server's base URL without /v1",
        "upstream.endpoints[1].url must be an http:// or https:// URL",
        "upstream.endpoints[2].models must list at least one served model name",
        "upstream.endpoints[3].models[1] must not be empty",
        "models.default_family names unknown family \"nope\"",
        "admission.max_kv_usage must be in (0, 1]; got 1.5",
        "admission.queue_timeout_s must be a positive number of seconds; got 0",
        "admission.max_queued must be in [1, 1000000]; got 0",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}

#[test]
fn admission_needs_a_saturation_signal_when_enabled() {
    let err = validate("[admission]\nenabled = true\n").unwrap_err();
    assert!(err.contains("admission.enabled is true but no saturation signal is set"), "{err}");
    assert!(validate("[admission]\nmax_streams = 0\n").unwrap_err().contains("admission.max_streams"));
    let ok = validate("[admission]\nenabled = true\nmax_waiting = 0\n").unwrap();
    assert_eq!(ok.admission.max_waiting, Some(0));
}

#[test]
fn a_replicas_place_must_be_among_the_replicas() {
    let err = validate("[admission]\nreplicas = 2\nreplica_index = 2\n").unwrap_err();
    assert!(err.contains("admission.replica_index must be below admission.replicas (2)"), "{err}");
    assert!(
        validate("[admission]\nreplicas = 0\n")
            .unwrap_err()
            .contains("admission.replicas must be in [1, 1000]")
    );
    let err = validate("[admission]\nmax_streams = 2\nreplicas = 3\n").unwrap_err();
    assert!(err.contains("admission.replicas is more than admission.max_streams (2)"), "{err}");
    let ok = validate("[admission]\nreplicas = 3\nreplica_index = 2\n").unwrap();
    assert_eq!((ok.admission.replicas, ok.admission.replica_index), (3, Some(2)));
}

#[test]
fn places_from_the_engine_need_a_limit_and_a_hook_per_engine() {
    let on = "[admission]\nenabled = true\nplaces = \"engine\"\n";
    let err = validate(&format!("{on}max_waiting = 0\n")).unwrap_err();
    assert!(err.contains("admission.places is \"engine\" but admission.max_streams is unset"), "{err}");
    let err = validate(&format!("{on}max_streams = 8\n")).unwrap_err();
    assert!(err.contains("no upstream.endpoints[].hook is set"), "{err}");
    let two = |second: &str| {
        format!(
            "{on}max_streams = 8\n[[upstream.endpoints]]\nurl = \"http://a:8000\"\nhook = \"a:8100\"\n\
             [[upstream.endpoints]]\nurl = \"http://b:8000\"\nhook = \"{second}\"\n"
        )
    };
    let err = validate(&two("a:8100")).unwrap_err();
    assert!(err.contains("two upstream.endpoints name the hook a:8100"), "{err}");
    let ok = validate(&two("b:8100")).unwrap();
    assert_eq!(ok.admission.places, meridian_proxy::config::PlacesFrom::Engine);
    assert!(!ok.admission.place_waits, "no waits on the engines unless asked for (ADR 0013)");
    assert!(validate("[admission]\nplaces = \"everywhere\"\n").is_err(), "an unknown way is refused");
    let err = validate("[admission]\nplace_waits = true\n").unwrap_err();
    assert!(err.contains("admission.place_waits is true but admission.places is not \"engine\""), "{err}");
    let waits =
        validate(&two("b:8100").replacen("max_streams = 8\n", "max_streams = 8\nplace_waits = true\n", 1));
    assert!(waits.unwrap().admission.place_waits);
}

#[test]
fn set_flags_parse_toml_literals_and_fall_back_to_strings() {
    let overrides = [
        Override::parse("upstream.max_attempts=3", "--set").unwrap(),
        Override::parse("server.listen=0.0.0.0:9000", "--set").unwrap(),
        Override::parse("upstream.forward_authorization=true", "--set").unwrap(),
    ];
    let cfg = parse_config(SHIPPED, "meridian.toml", &overrides).unwrap();
    assert_eq!(cfg.upstream.max_attempts, 3);
    assert_eq!(cfg.server.listen, "0.0.0.0:9000");
    assert!(cfg.upstream.forward_authorization);
}

#[test]
fn environment_overrides_use_double_underscore_paths() {
    let env = [
        ("MERIDIAN_UPSTREAM__IDLE_TIMEOUT_S".to_owned(), "7.5".to_owned()),
        ("MERIDIAN_TELEMETRY__LOG_FORMAT".to_owned(), "json".to_owned()),
        ("MERIDIAN_CONFIG".to_owned(), "ignored.toml".to_owned()),
        ("PATH".to_owned(), "/bin".to_owned()),
    ];
    let overrides = Override::from_env(env);
    assert_eq!(overrides.len(), 2);
    let cfg = parse_config("", "defaults", &overrides).unwrap();
    assert_eq!(cfg.upstream.idle_timeout_s, 7.5);
    assert_eq!(cfg.telemetry.log_format, meridian_proxy::config::LogFormat::Json);
}

#[test]
fn override_of_unknown_field_is_an_error_naming_it() {
    let o = Override::parse("upstream.bogus=1", "--set").unwrap();
    let err = parse_config("", "defaults", &[o]).unwrap_err().to_string();
    assert!(err.contains("bogus"), "{err}");
}

#[test]
fn malformed_override_is_rejected() {
    assert!(matches!(Override::parse("novalue", "--set"), Err(ConfigError::Override(_))));
    assert!(matches!(Override::parse("a..b=1", "--set"), Err(ConfigError::Override(_))));
}

#[test]
fn load_config_reads_a_models_dir_relative_to_the_file() {
    let dir = std::env::temp_dir().join(format!("meridian-cfg-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("extra")).unwrap();
    std::fs::write(
        dir.join("extra/custom.toml"),
        r#"name = "custom"
display_name = "Custom"
match = ["my-reasoner"]
initial_phase = "think"
[tags]
start = ["<r>"]
end = ["</r>"]
[verification]
status = "text_only"
source = "test"
"#,
    )
    .unwrap();
    std::fs::write(dir.join("m.toml"), "[models]\ndir = \"extra\"\ndefault_family = \"custom\"\n").unwrap();
    let (_, models) = load_config(Some(&dir.join("m.toml")), &[]).unwrap();
    assert_eq!(models.resolve("org/My-Reasoner-7B").unwrap().name(), "custom");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_file_is_a_clear_error() {
    let err = load_config(Some(std::path::Path::new("/nonexistent/meridian.toml")), &[]).unwrap_err();
    assert!(err.to_string().starts_with("cannot read /nonexistent/meridian.toml"), "{err}");
}

#[test]
fn priorities_must_keep_output_before_interactive_before_batch() {
    let err = validate("[priority]\nenabled = true\noutput = 5\nbatch = -1\n").unwrap_err();
    assert!(err.contains("priority.output must not be above priority.interactive"), "{err}");
    assert!(err.contains("priority.batch must not be below priority.interactive"), "{err}");
    assert!(validate("[priority]\nenabled = true\noutput = -1\ninteractive = -1\nbatch = 3\n").is_ok());
}

#[test]
fn hook_and_exit_sections_are_checked_by_dotted_path() {
    let err = validate(
        "[hook]\nlisten = \"nowhere\"\npolicy = \"lifo\"\n[exit]\neat_alpha = 0.0\nrpdi_lambda = 0.5\n",
    )
    .unwrap_err();
    for path in ["hook.listen", "hook.policy", "exit.eat_alpha", "exit.rpdi_lambda"] {
        assert!(err.contains(path), "{path} missing from: {err}");
    }
    let err = validate("[[upstream.endpoints]]\nurl = \"http://a:8000\"\nhook = \"a\"\n").unwrap_err();
    assert!(err.contains("upstream.endpoints[0].hook"), "{err}");
}

#[test]
fn the_hook_refuses_an_unsupported_vllm_unless_told_to_run_disabled() {
    use meridian_proxy::config::OnUnsupportedVllm;
    assert_eq!(validate("").unwrap().hook.on_unsupported_vllm, OnUnsupportedVllm::Refuse);
    let cfg = validate("[hook]\non_unsupported_vllm = \"disable\"\n").unwrap();
    assert_eq!(cfg.hook.on_unsupported_vllm, OnUnsupportedVllm::Disable);
    let err = validate("[hook]\non_unsupported_vllm = \"ignore\"\n").unwrap_err();
    assert!(err.contains("hook.on_unsupported_vllm") && err.contains("refuse"), "{err}");
}

#[test]
fn the_admin_listener_is_off_by_default_and_checked_when_asked_for() {
    let cfg = validate("").unwrap();
    assert_eq!(cfg.admin.listen, None);
    let err = validate("[admin]\nlisten = \"localhost\"\ntoken_env = \" \"\n").unwrap_err();
    assert!(err.contains("admin.listen must be an address"), "{err}");
    assert!(err.contains("admin.token_env must name an environment variable"), "{err}");
    let err = validate("[server]\nlisten = \"127.0.0.1:8080\"\n[admin]\nlisten = \"127.0.0.1:8080\"\n")
        .unwrap_err();
    assert!(err.contains("admin.listen must differ from server.listen"), "{err}");
    assert!(validate("[admin]\nlisten = \"127.0.0.1:9091\"\n").is_ok());
}

#[test]
fn tracing_section_is_off_by_default_and_checked_by_dotted_path() {
    let cfg = validate("").unwrap();
    assert_eq!(
        cfg.telemetry.tracing.enabled, None,
        "unset: the standard OTEL_TRACES_EXPORTER decides, off without it"
    );
    let err = validate(
        "[telemetry.tracing]\nenabled = true\nprotocol = \"http/json\"\nsample_ratio = 1.5\n\
         endpoint = \"collector:4317\"\nservice_name = \" \"\n",
    )
    .unwrap_err();
    for path in [
        "telemetry.tracing.protocol",
        "telemetry.tracing.sample_ratio",
        "telemetry.tracing.endpoint",
        "telemetry.tracing.service_name",
    ] {
        assert!(err.contains(path), "{path} missing from: {err}");
    }
    let ok = validate(
        "[telemetry.tracing]\nenabled = true\nprotocol = \"http/protobuf\"\nsample_ratio = 0.25\n\
         endpoint = \"http://collector:4318/v1/traces\"\nservice_name = \"edge\"\n",
    )
    .unwrap();
    assert_eq!(ok.telemetry.tracing.protocol.as_deref(), Some("http/protobuf"));
    let err = validate("[telemetry.tracing]\nsampler = 1\n").unwrap_err();
    assert!(err.contains("telemetry.tracing"), "{err}");
}
