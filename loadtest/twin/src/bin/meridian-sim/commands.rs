//! What each `meridian-sim` subcommand does, one function per subcommand, given the
//! arguments `cli` parsed; `calibrate` has its own module.

use std::path::PathBuf;

use meridian_core::sched::{POLICY_NAMES, SchedulingPolicy, policy_by_name};
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::{EngineConfig, ab, experiment};

use crate::cli::{
    AbArgs, ConversationsArgs, MigrationArgs, PlotArgs, PolicyList, ReplayArgs, RunArgs, ServeArgs,
    TraceHitsArgs,
};

/// An eviction order by its name on the command line.
fn eviction_named(name: &str) -> Result<meridian_sim::engine::Eviction, String> {
    use meridian_sim::engine::Eviction;
    match name {
        "lru" => Ok(Eviction::Lru),
        "dead-first" => Ok(Eviction::DeadFirst),
        other => Err(format!("{other:?}: expected lru (stock vLLM) or dead-first (the hook's)")),
    }
}

pub async fn serve(args: ServeArgs) -> Result<(), String> {
    let ServeArgs {
        listen,
        served_model,
        speed,
        policy,
        prefix_cache,
        channel_token_env,
        no_place_waits,
        engine,
    } = args;
    let prefix_cache =
        prefix_cache.as_deref().map(eviction_named).transpose().map_err(|e| format!("--prefix-cache {e}"))?;
    if !(speed.is_finite() && speed > 0.0) {
        return Err(format!("--speed must be a positive number; got {speed}"));
    }
    let channel_secret = match channel_token_env {
        Some(var) => match std::env::var(&var) {
            Ok(secret) if !secret.trim().is_empty() => Some(secret.trim().to_owned()),
            _ => return Err(format!("--channel-token-env: environment variable {var} is not set")),
        },
        None => None,
    };
    let opts = TwinOptions {
        listen,
        profile: engine.profile()?,
        workload: engine.workload()?,
        seed: engine.seed,
        speed,
        served_model,
        prefix_cache,
        channel_secret,
        place_waits: !no_place_waits,
        place_turn_kept_s: meridian_core::channel::WAITING_STALE_S,
    };
    let twin = TwinServer::start(opts, pick(&policy)?).await.map_err(|e| e.to_string())?;
    println!("listening on {} (engine twin, policy {})", twin.url(), twin.policy_name());
    tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
    Ok(())
}

pub fn replay(args: ReplayArgs) -> Result<(), String> {
    let ReplayArgs { report, policy, out, engine } = args;
    let parsed = read_report(&report)?;
    let requests =
        meridian_sim::replay::requests_of(&parsed).map_err(|e| format!("{}: {e}", report.display()))?;
    let predicted =
        meridian_sim::replay::replay(EngineConfig::from(&engine.profile()?), pick(&policy)?, &requests);
    std::fs::write(&out, predicted.to_string()).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(())
}

pub fn conversations(args: ConversationsArgs) -> Result<(), String> {
    let ConversationsArgs {
        kv_blocks,
        rates,
        conversations,
        turns,
        system_tokens,
        think_time_s,
        seeds,
        policy,
        report,
        json,
        engine,
    } = args;
    pick(&policy)?;
    let spec = meridian_sim::conversation::ConversationSpec {
        turn: engine.workload()?,
        turns,
        system_tokens,
        think_time_s,
    };
    let seeds: Vec<u64> = (engine.seed..engine.seed + seeds.max(1)).collect();
    let make = || pick(&policy).unwrap_or_else(|_| Box::new(meridian_core::sched::Fcfs));
    let profile = engine.profile()?;
    let cells = meridian_sim::conversation::eviction_cells(
        EngineConfig::from(&profile),
        &make,
        &spec,
        &kv_blocks,
        &rates,
        conversations,
        &seeds,
    );
    let table = format!(
        "Profile `{}`, policy `{policy}`, {conversations} conversations of {turns} turns, a \
         {system_tokens}-token system prompt, {think_time_s} s mean think time, seeds {}-{}:\n\n{}",
        profile.name,
        seeds[0],
        seeds[seeds.len() - 1],
        meridian_sim::conversation::eviction_table(&cells)
    );
    println!("{table}");
    if let Some(path) = report {
        std::fs::write(&path, table).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = json {
        let cells: Vec<serde_json::Value> = cells.iter().map(|c| c.to_json()).collect();
        std::fs::write(&path, serde_json::Value::Array(cells).to_string())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

pub fn migration(args: MigrationArgs) -> Result<(), String> {
    use meridian_sim::migration::{Move, Pools, compare};
    let MigrationArgs {
        engines,
        think,
        moves,
        connector_gb_s,
        kv_bytes_per_token,
        connector_fixed_ms,
        loads,
        num_prompts,
        seeds,
        policy,
        report,
        engine,
    } = args;
    pick(&policy)?;
    let connector = Move::nixl(kv_bytes_per_token, connector_gb_s * 1e9, connector_fixed_ms / 1e3);
    let mut splits = Vec::new();
    for &t in &think {
        if t == 0 || t >= engines {
            return Err(format!(
                "--think {t}: a split needs think and answer engines (1 to {})",
                engines - 1
            ));
        }
        for m in &moves {
            let moved = match m.as_str() {
                "reprefill" => Move::Reprefill,
                "connector" => connector,
                other => return Err(format!("--moves {other:?}: expected reprefill or connector")),
            };
            splits.push(Pools::Split { think: t, answer: engines - t, moved });
        }
    }
    let make = || pick(&policy).unwrap_or_else(|_| Box::new(meridian_core::sched::Fcfs));
    let profile = engine.profile()?;
    let config = EngineConfig::from(&profile);
    let spec = engine.workload()?;
    let seeds: Vec<u64> = (engine.seed..engine.seed + seeds.max(1)).collect();
    let cap = compare::capacity(config, &make, spec, engines, num_prompts, seeds[0]);
    let cells = compare::cells(config, &make, spec, engines, &splits, cap, &loads, num_prompts, &seeds);
    let table = format!(
        "Profile `{}`, policy `{policy}` in every engine, {engines} engines, {num_prompts} requests a run, seeds {}-{}:\n\n{}",
        profile.name,
        seeds[0],
        seeds[seeds.len() - 1],
        compare::markdown(cap, &cells, seeds.len())
    );
    println!("{table}");
    if let Some(path) = report {
        std::fs::write(&path, table).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

pub fn trace_hits(args: TraceHitsArgs) -> Result<(), String> {
    let TraceHitsArgs { report, kv_blocks, system_tokens, eviction, policy, out, engine } = args;
    use meridian_sim::conversation::trace;
    let eviction = eviction_named(&eviction).map_err(|e| format!("--eviction {e}"))?;
    let parsed = read_report(&report)?;
    let turns = trace::turns_of(&parsed).map_err(|e| format!("{}: {e}", report.display()))?;
    let profile = engine.profile()?;
    let block_size = profile.block_size;
    let config = EngineConfig { kv_blocks, prefix_cache: Some(eviction), ..EngineConfig::from(&profile) };
    let hits = trace::replay_turns(config, pick(&policy)?, &turns, system_tokens);
    let text = trace::hits_json(&hits, block_size).to_string();
    std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(())
}

pub fn run(args: RunArgs) -> Result<(), String> {
    let RunArgs { request_rate, num_prompts, policy, engine } = args;
    let profile = engine.profile()?;
    let res = experiment::run_poisson(
        EngineConfig::from(&profile),
        pick(&policy)?,
        engine.workload()?,
        request_rate,
        num_prompts,
        engine.seed,
    );
    let ms = |f: fn(&experiment::SimRecord) -> Option<f64>| {
        let v: Vec<f64> = res.records.iter().filter_map(f).map(|s| s * 1000.0).collect();
        format!("p50 {}  p99 {}", percentile(v.clone(), 50.0), percentile(v, 99.0))
    };
    let itl: Vec<f64> = res.records.iter().flat_map(|r| r.output_itl.iter().map(|s| s * 1000.0)).collect();
    println!(
        "profile {}, policy {policy}, {num_prompts} requests at {request_rate} req/s, seed {}",
        profile.name, engine.seed
    );
    println!("TTFT (ms)               {}", ms(|r| r.ttft));
    println!("TTFO (ms)               {}", ms(|r| r.ttfo));
    println!("think-to-output (ms)    {}", ms(|r| r.think_to_output));
    println!("output ITL (ms)         p50 {}  p99 {}", percentile(itl.clone(), 50.0), percentile(itl, 99.0));
    println!("largest answer gap (ms) {}", ms(experiment::SimRecord::largest_answer_gap));
    println!(
        "total token throughput  {:.0} tok/s over {:.1} s simulated",
        res.total_token_throughput(),
        res.makespan_s
    );
    println!("preemptions             {}", res.preemptions);
    println!(
        "simulated {} steps in {:.2} s wall: {:.0} steps/s",
        res.steps,
        res.wall_s,
        res.steps_per_second()
    );
    Ok(())
}

pub fn ab(args: AbArgs) -> Result<(), String> {
    let AbArgs {
        policies: PolicyList(policies),
        loads,
        num_prompts,
        slo_ttot_ms,
        slo_answer_gap_ms,
        slo_output_itl_ms,
        verdict,
        target_load,
        report,
        json,
        capacity,
        plots,
        engine,
    } = args;
    let resolved = engine.profile()?;
    let (profile, flags, seed) = (&resolved.name, engine.profile_flags(&resolved), engine.seed);
    let slo = ab::JointSlo {
        ttot_ms: slo_ttot_ms,
        answer_gap_ms: slo_answer_gap_ms,
        mean_output_itl_ms: slo_output_itl_ms,
    };
    let (cap, cells) = ab::compare(
        EngineConfig::from(&resolved),
        engine.workload()?,
        &policies,
        &loads,
        num_prompts,
        seed,
        slo,
        capacity,
    )?;
    if let Some(path) = &json {
        let text = serde_json::to_string_pretty(&serde_json::json!({"capacity": cap, "cells": cells}))
            .map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut md = format!(
        "### {profile}\n\n`meridian-sim ab {flags} --policies {} --loads {} --num-prompts {num_prompts} --seed {seed}{}`\n\n{}\n",
        policies.join(","),
        loads.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(","),
        engine.workload.as_ref().map(|w| format!(" --workload {}", w.display())).unwrap_or_default(),
        ab::markdown(cap, &cells, slo)
    );
    if verdict {
        md.push_str(&ab::verdicts(&cells, &ab::Target { load: target_load, ..ab::Target::default() }));
    }
    if let Some(stem) = &plots {
        let base = report.as_ref().and_then(|r| r.parent()).map(std::path::Path::to_path_buf);
        for (suffix, svg) in ab::plots(&cells) {
            let path = PathBuf::from(format!("{}-{suffix}.svg", stem.display()));
            std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
            let link = base
                .as_ref()
                .and_then(|b| path.strip_prefix(b).ok())
                .map_or_else(|| path.display().to_string(), |p| p.display().to_string());
            md.push_str(&format!("![{profile}: {suffix}]({link})\n"));
        }
        md.push('\n');
    }
    println!("{md}");
    if let Some(path) = report {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(md.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub fn plot(args: PlotArgs) -> Result<(), String> {
    let PlotArgs { out } = args;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| e.to_string())?;
    let spec: PlotSpec = serde_json::from_str(&text).map_err(|e| format!("plot spec: {e}"))?;
    let svg = meridian_plot::plot(&spec.title, &spec.x_label, &spec.y_label, &spec.series);
    std::fs::write(&out, svg).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(())
}

/// A load tester's JSON report.
fn read_report(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn pick(name: &str) -> Result<Box<dyn SchedulingPolicy>, String> {
    policy_by_name(name).ok_or_else(|| format!("--policy must be one of {POLICY_NAMES:?}; got {name:?}"))
}

/// The `p`th percentile of `v`, right-aligned in 9 columns; "n/a" for no values.
fn percentile(mut v: Vec<f64>, p: f64) -> String {
    if v.is_empty() {
        return format!("{:>9}", "n/a");
    }
    v.sort_by(|a, b| a.total_cmp(b));
    format!("{:>9.1}", v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1])
}

#[derive(serde::Deserialize)]
struct PlotSpec {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<meridian_plot::Series>,
}
