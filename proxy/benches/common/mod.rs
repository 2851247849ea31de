//! What the proxy's benchmarks share: the release binaries as child processes, and what
//! /proc says about them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;

/// The recorded vLLM answer the mock replays for the benchmarks' requests.
pub const FIXTURE: &str = "qwen3-reasoning";

/// A streamed chat request for the recorded answer; the mock's own headers
/// (`x-mock-interval-ms`, …) can be added to it.
pub fn chat_request(client: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
    let body = r#"{"model":"Qwen/Qwen3-8B","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-mock-fixture", FIXTURE)
        .body(body)
}

/// One streamed request read to its end: time to first byte and to the last.
pub async fn one_request(client: &reqwest::Client, url: &str) -> Result<(Duration, Duration), String> {
    let start = Instant::now();
    let resp = chat_request(client, url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(resp.status().to_string());
    }
    let mut stream = resp.bytes_stream();
    let mut first = None;
    let mut bytes = 0;
    while let Some(c) = stream.next().await {
        let c = c.map_err(|e| e.to_string())?;
        first.get_or_insert_with(|| start.elapsed());
        bytes += c.len();
    }
    if bytes == 0 {
        return Err("empty".into());
    }
    Ok((first.unwrap_or_default(), start.elapsed()))
}

/// A child process (killed on drop) and the URL it printed.
pub struct Proc {
    pub child: Child,
    pub url: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin` and waits for its "listening on URL" line.
pub fn spawn(bin: &Path, args: &[&str]) -> Proc {
    use std::io::BufRead;
    let mut child = Command::new(bin)
        .args(args)
        .env("MERIDIAN_LOG_LEVEL", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (run the bench's script, which builds it)", bin.display()));
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("process exited before listening").unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.trim().to_owned();
        }
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Proc { child, url }
}

/// The directory holding the release binaries (this bench runs from target/release/deps).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// User plus system CPU seconds of a process.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// Resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Open file descriptors of a process.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// A process's open TCP sockets, by which side they face: `(accepted on local_port,
/// connected to remote_port, others)`.
pub fn sockets_by_side(pid: u32, local_port: u16, remote_port: u16) -> (usize, usize, usize) {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
        .collect();
    let port = |addr: &str| addr.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    let (mut accepted, mut connected, mut other) = (0, 0, 0);
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) = (f.get(1), f.get(2), f.get(9)) else { continue };
            if !inodes.contains(*inode) {
                continue;
            }
            if port(remote) == Some(remote_port) {
                connected += 1;
            } else if port(local) == Some(local_port) && port(remote) != Some(0) {
                accepted += 1;
            } else {
                other += 1;
            }
        }
    }
    (accepted, connected, other)
}

/// The port of a URL like `http://127.0.0.1:8080`.
pub fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).unwrap_or(0)
}

/// What glibc's allocator holds in a process, read with `malloc_info` through gdb:
/// `(bytes obtained from the system, bytes of those free for reuse)`. `None` without gdb.
pub fn malloc_held(pid: u32) -> Option<(u64, u64)> {
    let file = std::env::temp_dir().join(format!("meridian-malloc-info-{pid}.xml"));
    let path = file.to_str()?;
    let status = Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch"])
        .args(["-ex", &format!("call (void*)fopen(\"{path}\", \"w\")")])
        .args(["-ex", "call (int)malloc_info(0, $1)", "-ex", "call (int)fclose($1)"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    let xml = std::fs::read_to_string(&file).ok().filter(|_| status.success())?;
    let _ = std::fs::remove_file(&file);
    // The totals over every arena follow the last `</heap>`.
    let totals = &xml[xml.rfind("</heap>")?..];
    let attr = |line: &str, name: &str| -> Option<u64> {
        let rest = &line[line.find(&format!("{name}=\""))? + name.len() + 2..];
        rest[..rest.find('"')?].parse().ok()
    };
    let mut system = None;
    let mut free = 0;
    for line in totals.lines() {
        if line.contains("<system type=\"current\"") {
            system = attr(line, "size");
        } else if line.contains("<total type=\"fast\"") || line.contains("<total type=\"rest\"") {
            free += attr(line, "size").unwrap_or(0);
        }
    }
    Some((system?, free))
}
