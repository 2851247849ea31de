//! What the proxy adds, measured side by side on one machine in one run: the same
//! recorded vLLM stream fetched from the mock upstream directly, through nginx as a
//! plain pass-through proxy, and through `meridian`, for every target of issue 15:
//! proxy CPU per relayed event (plain and under a think budget ended by continuation),
//! latency added at 2,000 requests/s, saturation throughput, 220 KB prompts at 150
//! concurrent requests, and memory per open stream at 10,000 streams. Writes
//! docs/src/benchmarks/proxy-overhead.md.
//!
//!   scripts/bench-proxy.sh       (installs nginx, builds the release binaries, runs this)

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

    let direct = Path { name: "direct", url: mock.url.clone(), pids: vec![] };
    let via_nginx = Path { name: "nginx", url: ngx.url.clone(), pids: ngx.pids() };
    let via_meridian = Path { name: "meridian", url: plain.url.clone(), pids: vec![plain.child.id()] };
    let via_continued =
        Path { name: "meridian-continuation", url: continued.url.clone(), pids: vec![continued.child.id()] };

    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(4096)
        .build()
        .expect("http client");
    for p in [&direct, &via_nginx, &via_meridian, &via_continued] {
        for _ in 0..200 {
            let _ = load::one(&client, &p.url, &load::Shape::plain()).await;
        }
    }

    let mut reps = Reps::default();
    let continuations_before = scrape(&client, &continued.url, "meridian_continuations_total").await;
    phases::cpu_per_event(
        &client,
        &[
            (&via_meridian, load::Shape::spaced(phases::CPU_INTERVAL_MS)),
            (&via_continued, load::Shape::budget(phases::CPU_INTERVAL_MS, phases::THINK_BUDGET)),
            (&via_nginx, load::Shape::spaced(phases::CPU_INTERVAL_MS)),
        ],
        3,
        &mut reps,
    )
    .await;
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
