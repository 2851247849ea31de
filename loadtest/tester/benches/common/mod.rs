//! What the load tester's benches share: settings from the environment, the workspace's
//! release binaries started as child processes (stopped when dropped), the client, and
//! reading a metric from a Prometheus page.

#![allow(dead_code)] // each bench uses part of it

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A setting from the environment variable `name`, else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A child process, killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where the bench's own binary was built, and the workspace's binaries beside it.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Starts the workspace binary `bin` with `args` and `env`, and waits for the line it
/// prints when it listens ("listening on ADDR"): its URL. `script` is what builds it.
pub fn start(bin: &str, args: &[&str], env: &[(&str, &str)], script: &str) -> (Proc, String) {
    let path = target_dir().join(bin);
    let mut child = Command::new(&path)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{} ({e}): run {script}, which builds it", path.display()));
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("exited before listening").unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().trim_end_matches('/').to_owned();
        }
    };
    // Keep reading its output, so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let url = if url.starts_with("http") { url } else { format!("http://{url}") };
    (Proc(child), url)
}

/// The HTTP client the benches send with: no proxy, no Nagle, a deep pool.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().tcp_nodelay(true).pool_max_idle_per_host(4096).build().unwrap()
}

/// The sum of the samples of metric `name` whose line contains `labels` ("" for every
/// series) in a Prometheus text page.
pub fn sample(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
