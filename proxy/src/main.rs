use std::process::ExitCode;

use clap::Parser;
use meridian_proxy::cli::{Cli, Command, ConfigArgs};
use meridian_proxy::{AppState, Metrics, Server};

fn load(
    args: &ConfigArgs,
) -> Result<(meridian_proxy::config::MeridianConfig, meridian_core::ModelRegistry), String> {
    let overrides = args.overrides(std::env::vars()).map_err(|e| e.to_string())?;
    let path = args.config_path();
    meridian_proxy::config::load_config(path.as_deref(), &overrides).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => match load(&args) {
            Ok((cfg, models)) => {
                if let Some(problem) = no_upstream(&cfg) {
                    println!("note: {problem}");
                }
                println!(
                    "configuration ok: {} upstream(s), {} model families",
                    cfg.upstream.endpoints.len(),
                    models.families().count()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("meridian: {e}");
                ExitCode::from(2)
            }
        },
        Command::Schema => match serde_json::to_string_pretty(&meridian_proxy::config::json_schema()) {
            Ok(schema) => {
                println!("{schema}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("meridian schema: {e}");
                ExitCode::from(2)
            }
        },
        Command::Top(args) => match meridian_proxy::top::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("meridian top: {e}");
                ExitCode::from(2)
            }
        },
        Command::Serve(args) => match serve(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("meridian: {e}");
                ExitCode::from(2)
            }
        },
    }
}

async fn serve(args: ConfigArgs) -> Result<(), String> {
    let (config, models) = load(&args)?;
    let traces = meridian_proxy::telemetry::init_logging(&config.telemetry)?;
    if traces.exporting() {
        tracing::info!("exporting traces over OTLP (telemetry.tracing)");
    }
    let served = run(&args, config, models).await;
    // The last requests' spans leave before the process does.
    traces.shutdown().await;
    served
}

async fn run(
    args: &ConfigArgs,
    config: meridian_proxy::config::MeridianConfig,
    models: meridian_core::ModelRegistry,
) -> Result<(), String> {
    if let Some(problem) = no_upstream(&config) {
        return Err(problem);
    }
    // Asked for and no upstream (validation refuses both): the embedded engine twin is
    // the upstream, for as long as the proxy runs.
    #[cfg(feature = "twin")]
    let (config, _twin) = twin::serve_if_asked(args, config).await?;
    #[cfg(not(feature = "twin"))]
    {
        // Only the twin reads where the config file is (for its workload file).
        let _ = args;
        if config.twin.enabled {
            return Err(twin::NOT_BUILT.to_owned());
        }
    }
    let listen = config.server.listen.clone();
    let state =
        AppState::new(config, models, std::sync::Arc::new(Metrics::new())).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let mut server = Server::start(state, listener).await.map_err(|e| e.to_string())?;
    tracing::info!(addr = %server.local_addr, upstreams = server.state.pool.all().len(), "meridian listening");
    println!("meridian listening on http://{}", server.local_addr);
    if let Some(admin) = server.admin_addr {
        tracing::info!(addr = %admin, "admin listener (open streams) on");
        println!("admin listener on http://{admin}/admin/streams");
    }
    tokio::select! {
        r = server.wait() => r.map_err(|e| e.to_string())?,
        _ = shutdown_signal() => {
            tracing::info!("shutting down; letting open streams finish");
            server.shutdown().await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Why `meridian serve` cannot start on `config` for want of an upstream, naming the
/// settings that would give it one. The twin's answers are made up, so it is never
/// the upstream unless asked for.
fn no_upstream(config: &meridian_proxy::config::MeridianConfig) -> Option<String> {
    (config.upstream.endpoints.is_empty() && !config.twin.enabled).then(|| {
        "no upstream configured (upstream.endpoints is empty): give vLLM servers with \
         --upstream URL, MERIDIAN_UPSTREAMS or [[upstream.endpoints]] in the config file; \
         for simulated answers from the embedded engine twin instead, pass --twin \
         (twin.enabled = true)"
            .to_owned()
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The embedded engine twin (cargo feature `twin`, on by default, off in the release
/// image): simulated answers, only when asked for.
mod twin {
    /// What a build without the twin says when asked for it.
    #[cfg(not(feature = "twin"))]
    pub const NOT_BUILT: &str = "twin.enabled: this meridian was built without the engine twin \
        (cargo feature `twin`, left out of the release image); for simulated answers use a \
        build with it (scripts/run.sh --twin, or the image built with FEATURES=twin), or \
        give a real upstream";

    /// Starts the twin when `twin.enabled` asks for it and makes it the config's only
    /// upstream; it serves for as long as the returned server is held.
    #[cfg(feature = "twin")]
    pub async fn serve_if_asked(
        args: &meridian_proxy::cli::ConfigArgs,
        mut config: meridian_proxy::config::MeridianConfig,
    ) -> Result<(meridian_proxy::config::MeridianConfig, Option<meridian_sim::server::TwinServer>), String>
    {
        if !config.twin.enabled {
            return Ok((config, None));
        }
        let config_dir = args.config_path().and_then(|p| p.parent().map(std::path::Path::to_path_buf));
        let twin = start(&config.twin, config_dir.as_deref()).await?;
        tracing::warn!(url = %twin.url(), profile = %config.twin.profile, "serving SIMULATED answers from the engine twin (twin.enabled)");
        println!(
            "serving simulated answers: the embedded engine twin at {} ({}); responses carry \
             x-meridian-simulated and a meridian-twin system_fingerprint",
            twin.url(),
            config.twin.profile
        );
        config.upstream.endpoints = vec![meridian_proxy::config::EndpointConfig {
            url: twin.url(),
            name: Some("twin".into()),
            hook: None,
            models: None,
            role: Default::default(),
        }];
        Ok((config, Some(twin)))
    }

    #[cfg(feature = "twin")]
    async fn start(
        cfg: &meridian_proxy::config::TwinConfig,
        config_dir: Option<&std::path::Path>,
    ) -> Result<meridian_sim::server::TwinServer, String> {
        let beside_config = |p: &str| match config_dir {
            Some(dir) if std::path::Path::new(p).is_relative() => dir.join(p),
            _ => std::path::PathBuf::from(p),
        };
        let profile = match &cfg.profile_file {
            None => meridian_sim::profile(&cfg.profile).map_err(|e| format!("twin.profile: {e}"))?,
            Some(file) => {
                let path = beside_config(file);
                let all = meridian_sim::cost::profiles_from_file(&path)
                    .map_err(|e| format!("twin.profile_file: {e}"))?;
                let known = all.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
                all.into_iter().find(|p| p.name == cfg.profile).ok_or_else(|| {
                    format!("twin.profile: {:?} is not in {} (it has: {known})", cfg.profile, path.display())
                })?
            }
        };
        let workload = match &cfg.workload {
            Some(p) => meridian_sim::workload::WorkloadSpec::from_file(&beside_config(p))
                .map_err(|e| format!("twin.workload: {e}"))?,
            None => meridian_sim::workload::WorkloadSpec::default(),
        };
        let opts = meridian_sim::server::TwinOptions {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            profile,
            workload,
            seed: cfg.seed,
            speed: cfg.speed,
            served_model: cfg.served_model.clone(),
            prefix_cache: None,
            channel_secret: None,
            place_waits: true,
            place_turn_kept_s: meridian_core::channel::WAITING_STALE_S,
        };
        let policy = meridian_core::sched::policy_by_name(&cfg.policy)
            .ok_or_else(|| format!("twin.policy: unknown {:?}", cfg.policy))?;
        meridian_sim::server::TwinServer::start(opts, policy)
            .await
            .map_err(|e| format!("cannot start the engine twin: {e}"))
    }
}
