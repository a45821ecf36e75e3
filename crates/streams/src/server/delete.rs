//! DELETE: removing a stream, or marking a source with live forks deleted (410) until its last fork goes.

use super::error::Error;
use super::http::respond;
use super::{Body, Streams};
use crate::clock::now_ms;
use crate::kinds::stream::{StreamCommand, StreamOutput};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

impl Streams {
    /// DELETE. A stream with forks is only marked deleted (410 from then
    /// on) and goes with its last fork. A fork removed for good releases
    /// its reference on its source afterwards: a crash between the two
    /// steps leaves the source holding a reference to a fork that is gone,
    /// so a soft-deleted source is kept (410) rather than removed under a
    /// live fork.
    pub(super) async fn delete(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let response = match self
            .execute(&path, StreamCommand::Delete { now_ms: now_ms() })
            .await
        {
            Ok(StreamOutput::Deleted { release }) => {
                if let Some(source) = release {
                    self.release(source, path.clone()).await;
                }
                respond(StatusCode::NO_CONTENT, "")
            }
            Ok(StreamOutput::NotFound) => Error::NotFound.into(),
            Ok(StreamOutput::Gone) => self.gone_at(&path).into(),
            Ok(_) => Error::status(StatusCode::INTERNAL_SERVER_ERROR, "unexpected output").into(),
            Err(e) => e.into(),
        };
        self.notifier.changed(&path);
        response
    }

    /// 410 for soft-deleted `path`, after starting a sweep of its fork
    /// references in the background: a fork that expired (or whose path
    /// now holds another stream) gives its reference back, so a deleted
    /// source does not outlive forks that ended by expiry. A fork path with
    /// no stream at all keeps its reference: it may be a fork being
    /// created, or one whose release was cut short by a crash (the source
    /// is then kept, 410, rather than removed too early).
    pub(super) fn gone_at(&self, path: &str) -> Error {
        let service = self.clone();
        let path = path.to_owned();
        tokio::spawn(async move { service.sweep(path).await });
        Error::Gone
    }
}
