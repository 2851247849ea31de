//! nginx as a plain pass-through proxy in front of the same mock upstream, the yardstick
//! the issue sets: Debian's build (scripts/bench-proxy.sh installs it), a config written
//! to a temporary directory, run in the foreground as a master with its workers.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// HTTP/1.1 listener.
    pub url: String,
    /// HTTP/2 without TLS (prior knowledge), for the 10,000-stream hold.
    pub h2_url: String,
}

/// Where Debian puts the binary; `NGINX` overrides.
fn binary() -> PathBuf {
    std::env::var_os("NGINX").map_or_else(|| PathBuf::from("/usr/sbin/nginx"), PathBuf::from)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(0, |a| a.port())
}

/// The config: no access log, no buffering of responses (tokens pass as they come),
/// HTTP/1.1 with keep-alive to the upstream, request bodies held in memory up to 512 KiB
/// (so a 220 KB prompt is not spooled to a temporary file), and a descriptor limit just
/// under this machine's hard limit of 20,000.
fn config(dir: &Path, upstream_port: u16, port: u16, h2_port: u16, workers: usize) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process on;\nworker_processes {workers};\nworker_rlimit_nofile 19500;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log error;\n\
         events {{ worker_connections 19000; }}\n\
         http {{\n  access_log off;\n\
           client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           client_max_body_size 16m; client_body_buffer_size 512k;\n\
           keepalive_requests 1000000; http2_max_concurrent_streams 128;\n\
           upstream mock {{ server 127.0.0.1:{upstream_port}; keepalive 1024; keepalive_requests 1000000; }}\n\
           server {{\n    listen 127.0.0.1:{port} backlog=4096;\n    listen 127.0.0.1:{h2_port} http2 backlog=4096;\n\
             location / {{\n      proxy_pass http://mock;\n      proxy_http_version 1.1;\n\
               proxy_set_header Connection \"\";\n      proxy_buffering off;\n    }}\n  }}\n}}\n"
    )
}

impl Nginx {
    pub fn start(upstream_port: u16, workers: usize) -> Result<Nginx, String> {
        let dir = std::env::temp_dir().join(format!("meridian-bench-nginx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let (port, h2_port) = (free_port(), free_port());
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(&dir, upstream_port, port, h2_port, workers))
            .map_err(|e| e.to_string())?;
        let child = Command::new(binary())
            .args(["-e", "stderr", "-p"])
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{}: {e} (scripts/bench-proxy.sh installs nginx)", binary().display()))?;
        let nginx = Nginx {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
            h2_url: format!("http://127.0.0.1:{h2_port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in [port, h2_port] {
            while TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], p))).is_err() {
                if Instant::now() > deadline {
                    return Err(format!("nginx did not listen on {p}"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Wait for every worker to be forked, so CPU and memory count them all.
        while nginx.pids().len() < workers + 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nginx)
    }

    /// The master and its workers.
    pub fn pids(&self) -> Vec<u32> {
        super::procs::with_children(self.child.id())
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM to the master stops its workers too; killing the master alone would
        // leave them running.
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `nginx/1.22.1` or the like, for the report.
pub fn version() -> String {
    Command::new(binary())
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stderr).split("version: ").nth(1).map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "nginx (version unknown)".into())
}
