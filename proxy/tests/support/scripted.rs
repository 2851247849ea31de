//! An upstream speaking raw HTTP/1.1, for answers no real engine would give: `GET`s
//! (health checks, the model list) get a model list and a close; every `POST` gets the
//! script's bytes verbatim. It counts the `POST` connections the proxy still holds, to
//! show that no failure leaks one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Who closes a `POST` connection once the script is written.
#[derive(Clone, Copy, PartialEq)]
pub enum Close {
    /// The upstream, at once: a close-delimited body ends there.
    Upstream,
    /// The proxy, when it is done with the response (the script should carry
    /// `connection: close` and a length or chunked framing).
    Proxy,
}

pub struct Scripted {
    pub url: String,
    open: Arc<AtomicUsize>,
    posts: Arc<AtomicUsize>,
}

impl Scripted {
    pub async fn start(script: impl Into<Vec<u8>>, close: Close) -> Scripted {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let script: Arc<[u8]> = script.into().into();
        let open = Arc::new(AtomicUsize::new(0));
        let posts = Arc::new(AtomicUsize::new(0));
        let (open2, posts2) = (open.clone(), posts.clone());
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                let (script, open, posts) = (script.clone(), open2.clone(), posts2.clone());
                tokio::spawn(serve(sock, script, close, open, posts));
            }
        });
        Scripted { url, open, posts }
    }

    /// `POST` connections the proxy has not closed yet.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// `POST` requests received.
    pub fn posts(&self) -> usize {
        self.posts.load(Ordering::SeqCst)
    }
}

async fn serve(
    mut sock: tokio::net::TcpStream,
    script: Arc<[u8]>,
    close: Close,
    open: Arc<AtomicUsize>,
    posts: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let Ok(n) = sock.read(&mut chunk).await else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + length {
        let Ok(n) = sock.read(&mut chunk).await else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    if head.starts_with("get") {
        let body = r#"{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model"}]}"#;
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = sock.write_all(reply.as_bytes()).await;
        let _ = sock.shutdown().await;
        return;
    }
    posts.fetch_add(1, Ordering::SeqCst);
    open.fetch_add(1, Ordering::SeqCst);
    let _ = sock.write_all(&script).await;
    if close == Close::Upstream {
        let _ = sock.shutdown().await;
    } else {
        // Hold the connection until the proxy lets go of it.
        while matches!(sock.read(&mut chunk).await, Ok(n) if n > 0) {}
    }
    open.fetch_sub(1, Ordering::SeqCst);
}
