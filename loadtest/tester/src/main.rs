use std::process::ExitCode;

use clap::Parser;
use meridian_core::ModelRegistry;
use meridian_loadtest::args::{Args, DatasetName};
use meridian_loadtest::arrivals::{Rate, schedule};
use meridian_loadtest::client::{Api, Target};
use meridian_loadtest::conversation::{
    ConversationPlan, ConversationRun, ConversationShape, run_conversations,
};
use meridian_loadtest::dataset::{self, Prompt};
use meridian_loadtest::record::RequestRecord;
use meridian_loadtest::report::{self, JSON_SCHEMA, JsonReport, JsonRun};
use meridian_loadtest::run::{Plan, run};
use meridian_loadtest::server_metrics::PrefixCacheCounters;
use meridian_loadtest::stats::{RunSummary, Slo};
use meridian_loadtest::whole_request::{Reference, WholeRequestSlo};

// One thread: the tester must cost little and never compete with the server for cores;
// its work per chunk is small and nothing in it blocks.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match real_main(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("meridian-loadtest: {e}");
            ExitCode::from(2)
        }
    }
}

fn parse_rate(s: &str) -> Result<Option<f64>, String> {
    match s {
        "inf" => Ok(None),
        v => match v.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Some(r)),
            _ => Err(format!("--request-rate must be a positive number or inf; got {v:?}")),
        },
    }
}

async fn first_model(client: &reqwest::Client, base: &str) -> Result<String, String> {
    let v: serde_json::Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .map_err(|e| format!("cannot list models at {base}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("bad /v1/models answer from {base}: {e}"))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{base} lists no model; pass --model"))
}

/// What a run sends: single requests, or conversations of several turns.
enum Workload {
    Single(Vec<Prompt>),
    Turns(ConversationPlan),
}

impl Workload {
    /// How many arrivals the schedule needs: a request each, or a conversation each.
    fn starts(&self) -> usize {
        match self {
            Workload::Single(p) => p.len(),
            Workload::Turns(plan) => plan.conversations.len(),
        }
    }

    fn requests(&self) -> usize {
        match self {
            Workload::Single(p) => p.len(),
            Workload::Turns(plan) => plan.requests(),
        }
    }

    fn think_budgets(&self) -> bool {
        match self {
            Workload::Single(p) => p.iter().any(|p| p.think_budget.is_some()),
            Workload::Turns(plan) => {
                plan.conversations.iter().flatten().any(|t| t.prompt.think_budget.is_some())
            }
        }
    }
}

struct Outcome {
    summary: RunSummary,
    records: Vec<RequestRecord>,
    client_cpu_s: f64,
}

async fn real_main(args: Args) -> Result<ExitCode, String> {
    let slos = args.goodput.iter().map(|s| Slo::parse(s)).collect::<Result<Vec<_>, _>>()?;
    let whole_request = match &args.slo_reference {
        Some(path) => {
            if !(args.slo_start_factor >= 1.0 && args.slo_start_allowance_ms >= 0.0) {
                return Err(
                    "--slo-start-factor must be at least 1 and --slo-start-allowance-ms not negative".into(),
                );
            }
            let slo = WholeRequestSlo {
                start_factor: args.slo_start_factor,
                start_allowance_ms: args.slo_start_allowance_ms,
                answer_ms: args.stall_threshold_ms,
            };
            Some((slo, Reference::read(path)?))
        }
        None => None,
    };
    let base_rate = parse_rate(&args.request_rate)?;
    let extra_body = match &args.extra_body {
        Some(s) => Some(serde_json::from_str(s).map_err(|e| format!("--extra-body is not JSON: {e}"))?),
        None => None,
    };
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| e.to_string())?;
    let bases: Vec<String> =
        args.base_url.iter().map(|b| b.trim().trim_end_matches('/').to_owned()).collect();
    if bases.iter().any(String::is_empty) {
        return Err("--base-url: an empty URL in the list".into());
    }
    let base = bases[0].clone();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&client, &base).await?,
    };
    let registry = ModelRegistry::builtin().map_err(|e| e.to_string())?;
    let family = match &args.model_family {
        Some(f) => Some(registry.get(f).cloned().ok_or_else(|| format!("--model-family: no family {f:?}"))?),
        None => registry.resolve(&model).cloned(),
    };
    let lengths = dataset::RandomLengths {
        input: args.random_input_len,
        output: args.random_output_len,
        think: args.random_think_len,
        range_ratio: args.random_range_ratio,
    };
    let workload = match args.dataset_name {
        DatasetName::Random => Workload::Single(dataset::random(args.num_prompts, lengths, args.seed)),
        DatasetName::Sharegpt => {
            let path = args.dataset_path.as_ref().ok_or("--dataset-name sharegpt needs --dataset-path")?;
            Workload::Single(
                dataset::sharegpt(path, args.num_prompts, args.sharegpt_output_len, args.seed)
                    .map_err(|e| e.to_string())?,
            )
        }
        kind @ (DatasetName::Conversations | DatasetName::Agent) => {
            if !(args.think_time.is_finite() && args.think_time >= 0.0) || args.turns == 0 {
                return Err(
                    "--think-time must be a number of seconds, not negative, and --turns at least 1".into()
                );
            }
            let waits = if kind == DatasetName::Agent { args.think_time / 10.0 } else { args.think_time };
            let shape = ConversationShape {
                turn: lengths,
                turns: args.turns,
                system_tokens: args.system_prompt_len,
                think_time_s: waits,
            };
            Workload::Turns(ConversationPlan::new(args.num_prompts, shape, args.seed))
        }
    };
    if let Some((_, reference)) = &whole_request {
        reference.check_size(workload.requests())?;
    }
    let api = Api::of_endpoint(&args.endpoint);
    if let Some(why) = api.refuses(workload.think_budgets(), args.ignore_eos) {
        return Err(format!("--endpoint {}: {why}", args.endpoint));
    }
    if args.dataset_name.multi_turn() && !api.converses() {
        return Err(format!(
            "--dataset-name {:?}: a conversation's history is sent as chat messages; use --endpoint /v1/chat/completions (got {})",
            args.dataset_name, args.endpoint
        ));
    }
    let metrics_url = args.metrics_url.clone().unwrap_or_else(|| format!("{base}/metrics"));
    let target = |urls: &[String]| Target {
        client: client.clone(),
        urls: urls.iter().map(|u| format!("{}{}", u.trim_end_matches('/'), args.endpoint)).collect(),
        model: model.clone(),
        api,
        stream: !args.no_stream,
        api_key: args.api_key.clone(),
        extra_body: extra_body.clone(),
        family: family.clone(),
        ignore_eos: args.ignore_eos,
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");

    // What to run: one rate, a sweep, or the same plan against two targets.
    let mut rates: Vec<Option<f64>> = if args.sweep_rates.is_empty() {
        vec![base_rate]
    } else {
        args.sweep_rates.iter().map(|r| Some(*r)).collect()
    };
    let mut targets = vec![(args.label.clone(), target(&bases))];
    if let Some(other) = &args.compare_base_url {
        targets.push((args.compare_label.clone(), target(std::slice::from_ref(other))));
    }
    let ramp = match (args.ramp_up_strategy, args.ramp_up_start_rps, args.ramp_up_end_rps) {
        (Some(_), Some(start), Some(end)) if start > 0.0 && end > 0.0 => Some(Rate::Ramp { start, end }),
        (Some(_), _, _) => {
            return Err("--ramp-up-strategy needs positive --ramp-up-start-rps and --ramp-up-end-rps".into());
        }
        _ => None,
    };

    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut i = 0;
    while i < rates.len() {
        let rate = rates[i];
        let arrival = ramp.unwrap_or(match rate {
            None => Rate::Unlimited,
            Some(r) => Rate::Constant(r),
        });
        let offsets = schedule(workload.starts(), arrival, args.burstiness, args.seed);
        let mut saturated = false;
        for (label, tgt) in &targets {
            let label = match rate {
                Some(r) if rates.len() > 1 || args.sweep_to_saturation => format!("{label}@{r}"),
                _ => label.clone(),
            };
            let before = PrefixCacheCounters::read(&client, &metrics_url).await;
            let out = match &workload {
                Workload::Single(prompts) => {
                    let plan = Plan {
                        prompts: prompts.clone(),
                        offsets: offsets.clone(),
                        max_concurrency: args.max_concurrency,
                        duration_s: args.duration,
                        progress: !args.disable_tqdm,
                        label: label.clone(),
                    };
                    run(tgt, &plan).await
                }
                Workload::Turns(plan) => {
                    let run = ConversationRun {
                        plan: plan.clone(),
                        offsets: offsets.clone(),
                        max_concurrency: args.max_concurrency,
                        duration_s: args.duration,
                        sample_seeds: args.sample_seeds,
                        session_header: Some(args.session_header.trim())
                            .filter(|h| !h.is_empty())
                            .map(str::to_owned),
                        seed: args.seed,
                    };
                    run_conversations(tgt, &run).await
                }
            };
            let after = PrefixCacheCounters::read(&client, &metrics_url).await;
            let mut summary =
                RunSummary::of(&label, rate, &out.records, out.duration_s, &slos, args.stall_threshold_ms);
            summary.prefix_cache = before.zip(after).map(|(b, a)| a.since(&b));
            if let Some((slo, reference)) = &whole_request {
                summary.judge_whole_request(&out.records, *slo, reference);
            }
            if let Some(r) = rate {
                saturated |= summary.request_throughput < 0.9 * r || summary.failed * 20 > summary.requests;
            }
            outcomes.push(Outcome { summary, records: out.records, client_cpu_s: out.client_cpu_s });
        }
        if args.sweep_to_saturation && i + 1 == rates.len() && !saturated {
            if let Some(r) = rate {
                rates.push(Some(r * 2.0));
            }
        }
        i += 1;
    }

    let summaries: Vec<&RunSummary> = outcomes.iter().map(|o| &o.summary).collect();
    println!("{}", report::table(&summaries));
    for s in summaries.iter().filter(|s| s.completed > 0 && !s.ttfo.measured()) {
        eprintln!(
            "{}: no request reached its answer (every token was thinking), so TTFO, the \
             think-to-output gap and output ITL are n/a; give requests room past their \
             thought (--random-output-len, --random-think-len)",
            s.label
        );
    }
    for o in &outcomes {
        if !o.summary.failed_by_outcome.is_empty() {
            let by: Vec<String> =
                o.summary.failed_by_outcome.iter().map(|(k, n)| format!("{k} {n}")).collect();
            eprintln!("{}: failed by outcome: {}", o.summary.label, by.join(", "));
        }
        if !o.summary.first_errors.is_empty() {
            eprintln!("{}: first errors: {:?}", o.summary.label, o.summary.first_errors);
        }
    }
    let pairs: Vec<(&RunSummary, &[RequestRecord])> =
        outcomes.iter().map(|o| (&o.summary, o.records.as_slice())).collect();
    if args.save_result {
        let name =
            args.result_filename.clone().unwrap_or_else(|| format!("meridian-loadtest-{}.json", args.seed));
        let path = args.result_dir.join(name);
        let json = JsonReport {
            schema: JSON_SCHEMA,
            command: command.clone(),
            runs: outcomes
                .iter()
                .map(|o| JsonRun { summary: &o.summary, client_cpu_s: o.client_cpu_s, requests: &o.records })
                .collect(),
        };
        let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, report::csv(&pairs))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.html {
        std::fs::write(path, report::html_report(&pairs, &command))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(min) = args.slo_min_fraction {
        let failing: Vec<_> = outcomes
            .iter()
            .filter(|o| o.summary.good_fraction < min)
            .map(|o| o.summary.label.clone())
            .collect();
        if !failing.is_empty() {
            eprintln!(
                "SLO gate failed: fewer than {:.0}% of requests met every SLO in {failing:?}",
                min * 100.0
            );
            return Ok(ExitCode::from(3));
        }
    }
    Ok(ExitCode::SUCCESS)
}
