//! Shutdown signals for the long-running commands (`node`, `dev`): listened for from the moment they are asked for, so a signal sent right after a ready line is never lost.

/// Resolves on SIGTERM or Ctrl-C (SIGINT). Both handlers are installed
/// when this is called, not when the future is first polled, so a signal
/// that arrives in between is kept.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).ok();
        let interrupt = signal(SignalKind::interrupt()).ok();
        async move {
            let term = async {
                match term {
                    Some(mut term) => {
                        term.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let interrupt = async {
                match interrupt {
                    Some(mut interrupt) => {
                        interrupt.recv().await;
                    }
                    None => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            };
            tokio::select! {
                _ = term => {}
                _ = interrupt => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
