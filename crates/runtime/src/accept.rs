//! The accept loop a node's listeners share (its plain HTTP and console listeners, the Durable Streams listener): each connection runs on its own task, at most a bound at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// How long the loop waits after a failed accept (out of file
/// descriptors, say) before it tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Accepts on `listener` until `shutdown` turns true, running
/// `connection` on its own task for each, at most `connections_max` at
/// once (at least one). A connection past the bound goes to `refused`,
/// which may answer it (on a task of its own) or drop it.
pub async fn accept_connections<F, Fut, R>(
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    connections_max: usize,
    refused: R,
    connection: F,
) where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
    R: Fn(TcpStream),
{
    let permits = Arc::new(Semaphore::new(connections_max.max(1)));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused(stream);
            continue;
        };
        let served = connection(stream);
        tokio::spawn(async move {
            let _permit = permit;
            served.await;
        });
    }
}
