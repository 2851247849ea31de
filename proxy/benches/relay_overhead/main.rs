//! What the proxy adds, measured side by side on one machine in one run: the same
//! recorded vLLM stream fetched from the mock upstream directly, through nginx as a
//! plain pass-through proxy, and through `meridian`, for every target of issue 15:
//! proxy CPU per relayed event (plain and under a think budget ended by continuation),
//! latency added at 2,000 requests/s, saturation throughput, 220 KB prompts at 150
//! concurrent requests, and memory per open stream at 10,000 streams. Writes
//! docs/src/benchmarks/proxy-overhead.md.
//!
//!   scripts/bench-proxy.sh       (installs nginx, builds the release binaries, runs this)
//!   scripts/bench-proxy.sh --only-cpu    (the CPU-per-event runs alone; writes nothing)
//!   MERIDIAN_BASELINE_BIN=/path/to/old/meridian scripts/bench-proxy.sh --only-cpu
//!                                (and an older build beside this one, before and after;
//!                                with MERIDIAN_AB_PAGE=<page.md> and MERIDIAN_BASELINE_LABEL=<its
//!                                commit>, the comparison is written there, a relative path
//!                                taken from the repository's root; MERIDIAN_CPU_REPS sets the
//!                                repetitions, 3 by default: see `ab`)

mod ab;
#[path = "../common/mod.rs"]
mod common;
mod hold;
mod load;
mod nginx;
mod phases;
mod procs;
mod report;
mod sections;
mod stats;
mod tracking;

use common::{Proc, port_of, spawn, target_dir};
use phases::Path;
use stats::Reps;

/// Repetitions of each side-by-side measurement; the report shows their median and
/// range, so one hiccup of a shared 2-core machine does not decide a figure.
const REPS: usize = 5;

fn main() {
    // The load generator keeps to one thread so that it, the mock, and the proxy under
    // test share the two cores in the same way for every path.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench());
}

fn meridian(mock: &Proc, extra: &[&str]) -> Proc {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--upstream", &mock.url];
    args.extend_from_slice(extra);
    spawn(&target_dir().join("meridian"), &args)
}

/// The same number of nginx workers as meridian has tokio workers: tokio's default
/// runtime (`#[tokio::main]` in proxy/src/main.rs) runs one per core, so both may use
/// every core.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

async fn bench() {
    let dir = target_dir();
    // The mock keeps no request bodies: 220 KB prompts by the thousand would fill it.
    let mock = spawn(&dir.join("meridian-mock-upstream"), &["--no-bodies"]);
    let plain = meridian(&mock, &[]);
    let continued = meridian(&mock, &["--set", "budget.forcing=continuation"]);
    let ngx = nginx::Nginx::start(port_of(&mock.url), workers()).unwrap_or_else(|e| panic!("nginx: {e}"));
    // The same stack as meridian doing nothing but forward: what the stack costs.
    let bare = |client: &str| {
        let args = ["--listen", "127.0.0.1:0", "--upstream", &mock.url, "--client", client];
        spawn(&dir.join("examples").join("bare_relay"), &args)
    };
    let (bare_reqwest, bare_hyper) = (bare("reqwest"), bare("hyper"));
    // Before and after a change: another build of meridian, measured beside this one.
    let baseline_bin = std::env::var_os("MERIDIAN_BASELINE_BIN");
    let older = |extra: &[&str]| {
        baseline_bin.as_ref().map(|bin| {
            let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--upstream", &mock.url];
            args.extend_from_slice(extra);
            spawn(std::path::Path::new(bin), &args)
        })
    };
    let (baseline, baseline_continued) = (older(&[]), older(&["--set", "budget.forcing=continuation"]));

    let direct = Path { name: "direct", url: mock.url.clone(), pids: vec![] };
    let via_nginx = Path { name: "nginx", url: ngx.url.clone(), pids: ngx.pids() };
    let via_meridian = Path { name: "meridian", url: plain.url.clone(), pids: vec![plain.child.id()] };
    let via_continued =
        Path { name: "meridian-continuation", url: continued.url.clone(), pids: vec![continued.child.id()] };

    let via_bare_reqwest =
        Path { name: "bare-reqwest", url: bare_reqwest.url.clone(), pids: vec![bare_reqwest.child.id()] };
    let via_bare_hyper =
        Path { name: "bare-hyper", url: bare_hyper.url.clone(), pids: vec![bare_hyper.child.id()] };

    let as_path = |name, p: &Option<Proc>| {
        p.as_ref().map(|b| Path { name, url: b.url.clone(), pids: vec![b.child.id()] })
    };
    let via_baseline = as_path("meridian-baseline", &baseline);
    let via_baseline_continued = as_path("meridian-baseline-continuation", &baseline_continued);

    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(4096)
        .build()
        .expect("http client");
    let warm = [&direct, &via_nginx, &via_meridian, &via_continued, &via_bare_reqwest, &via_bare_hyper];
    for p in warm.into_iter().chain(via_baseline.as_ref()).chain(via_baseline_continued.as_ref()) {
        for _ in 0..200 {
            let _ = load::one(&client, &p.url, &load::Shape::plain()).await;
        }
    }

    let mut reps = Reps::default();
    let continuations_before = scrape(&client, &continued.url, "meridian_continuations_total").await;
    let spaced = || load::Shape::spaced(phases::CPU_INTERVAL_MS);
    let mut cpu_paths = vec![
        (&via_meridian, spaced()),
        (&via_continued, load::Shape::budget(phases::CPU_INTERVAL_MS, phases::THINK_BUDGET)),
        (&via_nginx, spaced()),
        (&via_bare_reqwest, spaced()),
        (&via_bare_hyper, spaced()),
    ];
    if let (Some(b), Some(c)) = (&via_baseline, &via_baseline_continued) {
        cpu_paths.insert(1, (b, spaced()));
        cpu_paths.insert(3, (c, load::Shape::budget(phases::CPU_INTERVAL_MS, phases::THINK_BUDGET)));
    }
    // More repetitions (`MERIDIAN_CPU_REPS`) narrow a before-and-after comparison.
    let cpu_reps = std::env::var("MERIDIAN_CPU_REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    phases::cpu_per_event(&client, &cpu_paths, cpu_reps, &mut reps).await;
    if via_baseline.is_some() {
        // Each repetition measured both within seconds of each other: their ratio is
        // steadier than either figure on a shared machine.
        for (now, before) in [
            ("cpu meridian", "cpu meridian-baseline"),
            ("cpu meridian-continuation", "cpu meridian-baseline-continuation"),
        ] {
            let ratios: Vec<f64> =
                reps.values(now).iter().zip(reps.values(before)).map(|(a, b)| a / b).collect();
            println!("{now} / baseline, per repetition: {}", stats::Spread::of(&ratios).show(3));
        }
        if let Some(page) = std::env::var_os("MERIDIAN_AB_PAGE") {
            // A relative path is the repository's (cargo runs benches in the package's folder).
            let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(page);
            let older = std::env::var("MERIDIAN_BASELINE_LABEL").unwrap_or_else(|_| {
                baseline_bin.as_ref().map(|b| b.to_string_lossy().into_owned()).unwrap_or_default()
            });
            let md = ab::page(&reps, &ab::this_build(), &older);
            std::fs::write(&page, md).unwrap_or_else(|e| panic!("{}: {e}", page.to_string_lossy()));
            println!("wrote {}", page.to_string_lossy());
        }
    }
    drop((bare_reqwest, bare_hyper, baseline, baseline_continued));
    if std::env::args().any(|a| a == "--only-cpu") {
        println!("--only-cpu: the other targets were not measured and the report was not written");
        return;
    }
    // Every budget request should have been continued once; the report says so.
    let continued_requests =
        scrape(&client, &continued.url, "meridian_continuations_total").await - continuations_before;

    let three = [&direct, &via_nginx, &via_meridian];
    phases::latency_at_rate(&client, &three, REPS, &mut reps).await;
    phases::saturation(&client, &three, 3, &mut reps).await;
    phases::big_prompts(&client, &three, 3, &mut reps).await;
    drop((plain, continued, ngx));

    // Memory on fresh processes, so the idle figure is not what earlier runs left.
    let fresh = meridian(&mock, &[]);
    let meridian_memory = hold::measure(&fresh.url, &[fresh.child.id()]).await;
    drop(fresh);
    let ngx = nginx::Nginx::start(port_of(&mock.url), workers()).unwrap_or_else(|e| panic!("nginx: {e}"));
    let nginx_memory = hold::measure(&ngx.h2_url, &ngx.pids()).await;
    drop(ngx);
    for (name, m) in [("meridian", &meridian_memory), ("nginx", &nginx_memory)] {
        match m {
            Ok(h) => println!("memory {name}: {:.1} KiB per stream ({} open)", h.per_stream_kib(), h.open),
            Err(e) => println!("memory {name}: {e}"),
        }
    }

    let fixture = std::fs::read(report::fixture_path()).expect("fixture");
    let (tracking_ns, events) = tracking::cost_ns(&fixture);
    let report = report::Report {
        reps,
        continued_requests,
        meridian_memory,
        nginx_memory,
        tracking_ns,
        fixture_events: events,
        fixture_bytes: fixture.len(),
        workers: workers(),
    };
    let path = report.write();
    println!("wrote {path}");
}

/// The sum of a metric's samples on a meridian's /metrics.
async fn scrape(client: &reqwest::Client, url: &str, name: &str) -> f64 {
    let Ok(resp) = client.get(format!("{url}/metrics")).send().await else { return 0.0 };
    let text = resp.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
