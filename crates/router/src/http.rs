//! The node's plain HTTP listener: `/metrics` (OpenMetrics text, which Prometheus reads), `/healthz` (alive: not stopped for good by a replaced or retired lease) and `/readyz` (serving: lease live, not draining).
//!
//! A deliberately small HTTP/1.1 responder: one request per connection,
//! the request head bounded by [`REQUEST_HEAD_BYTES_MAX`] and
//! [`REQUEST_TIMEOUT`], at most [`CONNECTIONS_MAX`] connections at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cellfleet_runtime::accept::accept_connections;
use cellfleet_runtime::lease::ServingMode;
use cellfleet_runtime::NodeHandle;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::service_admin::DrainState;

/// Largest request head read.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// Longest a client may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
pub const CONNECTIONS_MAX: usize = 64;

/// Serves until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    node: NodeHandle,
    drain: Arc<DrainState>,
    shutdown: watch::Receiver<bool>,
) {
    accept(listener, shutdown, move |stream| {
        let (node, drain) = (node.clone(), drain.clone());
        async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &node, &drain)).await;
        }
    })
    .await
}

/// Accepts until `shutdown` turns true, running `connection` on its own
/// task for each, at most [`CONNECTIONS_MAX`] at once (one more is closed
/// unanswered).
pub(crate) async fn accept<F, Fut>(
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    connection: F,
) where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    accept_connections(listener, shutdown, CONNECTIONS_MAX, drop, connection).await
}

async fn answer(
    mut stream: TcpStream,
    node: &NodeHandle,
    drain: &DrainState,
) -> std::io::Result<()> {
    let head = read_head(&mut stream).await?;
    let (method, path) = request_line(&head).unwrap_or_default();
    let (status, content_type, body) = if method != "GET" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        )
    } else {
        match path.as_str() {
            "/metrics" => (
                "200 OK",
                cellfleet_runtime::EXPOSITION_CONTENT_TYPE,
                node.metrics_text(),
            ),
            "/healthz" => liveness(node),
            "/readyz" => readiness(node, drain),
            _ => (
                "404 Not Found",
                "text/plain",
                "try /metrics, /healthz or /readyz (the web console is on listen.console)\n"
                    .to_owned(),
            ),
        }
    };
    write_response(&mut stream, status, content_type, &[], body.as_bytes()).await
}

/// Reads a request head: up to the blank line, at most
/// [`REQUEST_HEAD_BYTES_MAX`] bytes (a longer one is cut there).
pub(crate) async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REQUEST_HEAD_BYTES_MAX {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    Ok(head)
}

/// The method and request target of a request head's first line, `None`
/// when it has fewer than two words.
pub fn request_line(head: &[u8]) -> Option<(String, String)> {
    let line = head.split(|b| *b == b'\r' || *b == b'\n').next()?;
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let method = words.next()?.to_owned();
    let target = words.next()?.to_owned();
    Some((method, target))
}

/// Writes one response and closes the connection.
pub(crate) async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

/// Alive unless the node has stopped serving for good (its lease was
/// replaced by another session or retired): a process in that state must
/// be restarted, so liveness fails. A renewal that is merely overdue is
/// not death (readiness says so).
fn liveness(node: &NodeHandle) -> (&'static str, &'static str, String) {
    match node.lease().mode() {
        ServingMode::Stopped(reason) => (
            "503 Service Unavailable",
            "text/plain",
            format!("stopped serving: {reason}\n"),
        ),
        ServingMode::Live | ServingMode::SelfFenced => ("200 OK", "text/plain", "ok\n".into()),
    }
}

fn readiness(node: &NodeHandle, drain: &DrainState) -> (&'static str, &'static str, String) {
    if drain.draining.load(Ordering::SeqCst) {
        return ("503 Service Unavailable", "text/plain", "draining\n".into());
    }
    match node.lease().mode() {
        ServingMode::Live => ("200 OK", "text/plain", "ready\n".into()),
        ServingMode::SelfFenced => (
            "503 Service Unavailable",
            "text/plain",
            "lease renewal overdue\n".into(),
        ),
        ServingMode::Stopped(reason) => (
            "503 Service Unavailable",
            "text/plain",
            format!("lease lost: {reason}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_request_line_is_method_and_target() {
        assert_eq!(
            request_line(b"GET /ui/api/cells?q=a HTTP/1.1\r\nhost: x\r\n\r\n"),
            Some(("GET".into(), "/ui/api/cells?q=a".into()))
        );
        assert_eq!(request_line(b"GET\r\n\r\n"), None);
        assert_eq!(request_line(b""), None);
    }

    proptest! {
        #[test]
        fn any_head_parses_without_panicking(head in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Some((method, target)) = request_line(&head) {
                prop_assert!(!method.is_empty() && !target.is_empty());
                prop_assert!(!method.contains(char::is_whitespace));
            }
        }
    }
}
