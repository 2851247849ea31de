//! The report's detail sections: the tables behind each target and, where a target is
//! missed, what the measurements say about why.

use std::fmt::Write;

use super::hold::STREAMS;
use super::phases::{self as p, THINK_BUDGET};
use super::report::Report;
use super::stats::Spread;

impl Report {
    pub(crate) fn cpu(&self, md: &mut String) {
        let _ = write!(
            md,
            "## Relay cost per event\n\n\
             Open-loop at {rate} requests/s for {secs} s, {reps} repetitions, one proxy at a time. The mock pauses \
             {gap} ms between events so each reaches the proxy on its own, as tokens from an engine do (back to \
             back, several would share one read and one write, and the cost per event would look smaller \
             than it is). CPU is user plus system time from `/proc/<pid>/stat` over the run, divided by the \
             SSE events the client received. The continuation run asks for a think budget of {budget} tokens \
             (`\"meridian\": {{\"think_budget_tokens\": {budget}}}`) from a meridian started with \
             `--set budget.forcing=continuation`: the proxy cuts the thinking after {budget} reasoning events, \
             ends the upstream request and sends a second one that continues the answer, whose events it \
             relabels and splices into the client's stream; {cont:.0} continuations were counted for its \
             requests. `bare-reqwest` and `bare-hyper` are the same stack as meridian doing nothing but \
             forward (`proxy/examples/bare_relay.rs`: an axum server, and reqwest's client or hyper-util's \
             pooled client without reqwest): the floor under meridian on this stack.\n\n\
             | proxy | CPU µs/event | user µs | system µs | context switches/event | events/request | errors | machine cores busy |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
            rate = 500,
            secs = 4,
            reps = self.reps.values("cpu meridian").len(),
            gap = p::CPU_INTERVAL_MS,
            budget = THINK_BUDGET,
            cont = self.continued_requests,
        );
        let baseline = ["meridian-baseline", "meridian-baseline-continuation"];
        let measured_baseline = !self.reps.values("cpu meridian-baseline").is_empty();
        let names = ["meridian", "meridian-continuation", "nginx", "bare-reqwest", "bare-hyper"];
        for n in names.into_iter().chain(baseline.into_iter().filter(|_| measured_baseline)) {
            let _ = writeln!(
                md,
                "| {n} | {} | {} | {} | {} | {} | {} | {} |",
                self.get(&format!("cpu {n}")).show(2),
                self.get(&format!("user {n}")).show(2),
                self.get(&format!("system {n}")).show(2),
                self.get(&format!("switches {n}")).show(2),
                self.get(&format!("events {n}")).show(1),
                self.get(&format!("errors {n}")).median,
                self.get(&format!("machine {n}")).show(2),
            );
        }
        if measured_baseline {
            let ratio = |now: &str, before: &str| {
                let r: Vec<f64> =
                    self.reps.values(now).iter().zip(self.reps.values(before)).map(|(a, b)| a / b).collect();
                Spread::of(&r).show(3)
            };
            let _ = write!(
                md,
                "\nBefore and after: `meridian-baseline` rows are an older build of meridian \
                 (`MERIDIAN_BASELINE_BIN`), each repetition measured right after this build's. CPU per \
                 event, this build over the older, per repetition: plain {}, continuation {}.\n",
                ratio("cpu meridian", "cpu meridian-baseline"),
                ratio("cpu meridian-continuation", "cpu meridian-baseline-continuation"),
            );
        }
        let (m, n) = (self.get("cpu meridian").median, self.get("cpu nginx").median);
        let (mu, ms) = (self.get("user meridian").median, self.get("system meridian").median);
        let (nu, ns) = (self.get("user nginx").median, self.get("system nginx").median);
        let (msw, nsw) = (self.get("switches meridian").median, self.get("switches nginx").median);
        if m > 5.0 {
            let _ = write!(
                md,
                "\nWhy the plain path misses: meridian spends {m:.1} µs per event against nginx's {n:.1} \
                 ({:.1}×). Of that, {mu:.1} µs is its own code in user space ({:.1}× nginx's {nu:.1}) and \
                 {ms:.1} µs is in the kernel ({:.1}× nginx's {ns:.1}), with {msw:.2} context switches per \
                 event against nginx's {nsw:.2}. The tracking itself (SSE split, JSON look, phase router) \
                 costs {:.2} µs per event in-process (below), so most of the user time is outside it: in \
                 the HTTP server and client stacks and the tasks that carry each event from the upstream \
                 connection to the client's.",
                m / n,
                mu / nu,
                ms / ns,
                self.tracking_ns / 1000.0,
            );
            let (br, bh) = (self.get("cpu bare-reqwest").median, self.get("cpu bare-hyper").median);
            let _ = write!(
                md,
                " The stack alone says how much: forwarding with nothing else costs {br:.1} µs per event \
                 with reqwest's client ({bh:.1} µs with hyper-util's directly), so meridian's own work \
                 (the line reader, tracking, watchers, metrics, timers) adds {:.1} µs on top of the stack \
                 it is built on, the stack itself is {:.1}× nginx, and hyper's client in place of \
                 reqwest would save {:.1} µs.",
                m - br,
                br / n,
                br - bh,
            );
            if n > 5.0 {
                let _ = write!(
                    md,
                    " nginx itself, doing nothing but pass bytes, spends {n:.1} µs per event here, {ns:.1} µs \
                     of it in the kernel: with one read and one write per event on this machine, the \
                     5 µs goal is below what the kernel's share alone costs a plain pass-through."
                );
            }
            md.push('\n');
        }
        md.push('\n');
    }

    /// A side-by-side table (latency at a rate, or big prompts) under `heading`.
    pub(crate) fn latency(&self, md: &mut String, prefix: &str, heading: &str) {
        md.push_str(heading);
        if prefix == "rate" {
            let _ = write!(
                md,
                "Open-loop at {} requests/s for {} s per path (each request on its own schedule, so a slow \
                 proxy shows as latency), 5 repetitions. Times in ms.\n\n",
                p::LATENCY_RATE,
                p::LATENCY_SECONDS
            );
        }
        md.push_str(
            "| path | achieved req/s | TTFB p50 | TTFB p99 | E2E p50 | E2E p99 | added TTFB p50 | added TTFB p99 | added E2E p50 | added E2E p99 | proxy cores busy | machine cores busy | errors |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for n in ["direct", "nginx", "meridian"] {
            let g = |what: &str| self.get(&format!("{prefix} {n} {what}"));
            let added = |what: &str| {
                if n == "direct" { "—".to_owned() } else { g(&format!("added {what}")).to_string() }
            };
            let _ = writeln!(
                md,
                "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                g("req/s").show(0),
                g("ttfb p50"),
                g("ttfb p99"),
                g("e2e p50"),
                g("e2e p99"),
                added("ttfb p50"),
                added("ttfb p99"),
                added("e2e p50"),
                added("e2e p99"),
                if n == "direct" { "—".to_owned() } else { g("cores").show(2) },
                g("machine cores").show(2),
                g("errors").median,
            );
        }
        let missed =
            |what: &str, goal: f64| self.get(&format!("{prefix} meridian added {what}")).median > goal;
        let goal = if prefix == "rate" { [0.1, 0.5] } else { [f64::INFINITY, 1.0] };
        if missed("ttfb p50", goal[0])
            || missed("e2e p50", goal[0])
            || missed("ttfb p99", goal[1])
            || missed("e2e p99", goal[1])
        {
            // CPU per request from the run itself: cores busy over requests completed.
            let per_req = |n: &str| {
                let g = |w: &str| self.get(&format!("{prefix} {n} {w}")).median;
                g("cores") / g("req/s") * 1e6
            };
            let (m, n) = (per_req("meridian"), per_req("nginx"));
            let offered = self.get(&format!("{prefix} direct req/s")).median;
            let _ = writeln!(
                md,
                "\nWhy meridian misses here: it used {m:.0} µs of CPU per request against nginx's {n:.0} \
                 ({:.1}×); at the direct path's {offered:.0} requests/s that is {:.2} cores of the machine's \
                 {} against nginx's {:.2}, while the load generator and the mock need the same cores (the \
                 machine column shows how busy all of it was, other work on the machine included). When \
                 the proxy cannot get the CPU it needs, requests queue in it: the latency added is \
                 queueing behind the relay cost per event above.",
                m / n,
                m * offered / 1e6,
                self.workers,
                n * offered / 1e6,
            );
        }
        md.push('\n');
    }

    pub(crate) fn saturation(&self, md: &mut String) {
        let _ = write!(
            md,
            "## Saturation throughput\n\n{} clients each send one request after another for {} s per path, \
             3 repetitions; plain streams back to back. The direct figure is the ceiling the load generator \
             and the mock reach on this machine without a proxy.\n\n\
             | path | req/s | proxy cores busy | TTFB p99 (ms) | errors |\n|---|---:|---:|---:|---:|\n",
            p::SATURATION_WORKERS,
            p::SATURATION_SECONDS
        );
        for n in ["direct", "nginx", "meridian"] {
            let g = |what: &str| self.get(&format!("saturation {n} {what}"));
            let _ = writeln!(
                md,
                "| {n} | {} | {} | {} | {} |",
                g("req/s").show(0),
                if n == "direct" { "—".to_owned() } else { g("cores").show(2) },
                g("ttfb p99"),
                g("errors").median
            );
        }
        let ratios = self.saturation_ratios();
        let sat = super::stats::Spread::of(&ratios);
        let _ = writeln!(md, "\nmeridian ÷ nginx, per repetition: {}.", sat.show(2));
        if sat.median < 0.5 {
            let per_req = |n: &str| {
                let g = |w: &str| self.get(&format!("saturation {n} {w}")).median;
                g("cores") / g("req/s") * 1e6
            };
            let _ = writeln!(
                md,
                "\nWhy: at saturation meridian used {:.0} µs of CPU per request against nginx's {:.0}, and all \
                 three processes compete for the same cores.",
                per_req("meridian"),
                per_req("nginx")
            );
        }
        md.push('\n');
    }

    pub(crate) fn memory(&self, md: &mut String) {
        let _ = write!(
            md,
            "## Memory per open stream\n\n\
             A fresh proxy, 200 warm-up requests, then its resident memory (idle). Then {STREAMS} streams held \
             open through it at once, each dripping one event every 2 s from the mock; once all have their \
             first event, the median of five samples of its resident memory (held). Per stream: held minus \
             idle, over the streams open. Clients speak HTTP/2 to the proxy, 100 streams per connection: \
             this machine's hard limit of 20,000 file descriptors per process cannot be raised here, and \
             {STREAMS} HTTP/1.1 streams need 20,000 in the proxy (client and upstream sides). The proxy \
             reaches the mock over HTTP/1.1, one connection per stream, as it reaches vLLM. RSS from \
             `/proc/<pid>/status`, summed over nginx's master and workers.\n\n\
             | proxy | idle RSS (MiB) | RSS with streams open (MiB) | streams open | ramp (s) | per stream (KiB) |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for (n, m) in [("meridian", &self.meridian_memory), ("nginx", &self.nginx_memory)] {
            match m {
                Ok(h) => {
                    let _ = writeln!(
                        md,
                        "| {n} | {:.1} | {:.1} | {} | {:.1} | {:.1} |",
                        h.idle_kib as f64 / 1024.0,
                        h.held_kib as f64 / 1024.0,
                        h.open,
                        h.ramp_s,
                        h.per_stream_kib()
                    );
                }
                Err(e) => {
                    let _ = writeln!(md, "| {n} | not measured: {e} | | | | |");
                }
            }
        }
        md.push_str("\nOne run per proxy; the soak page (`scripts/bench-soak.sh`) holds meridian's figure over ten minutes.\n\n");
    }

    pub(crate) fn tracking(&self, md: &mut String) {
        let _ = write!(
            md,
            "## Tracking cost per event, in-process\n\n\
             Phase tracking alone (SSE split, JSON look, phase router) over the recorded stream, in the \
             bench's own process, no I/O: **{:.2} µs** per event. It is part of the CPU per event above.\n",
            self.tracking_ns / 1000.0
        );
    }
}
