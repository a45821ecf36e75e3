//! The S3 backend on aws-sdk-s3: AWS S3, RustFS, MinIO, SeaweedFS.
//!
//! Conditional writes map to `If-None-Match: *` / `If-Match: "<etag>"` on
//! PutObject and CompleteMultipartUpload. Status mapping (see
//! [`crate::Error`]): 412 → `PreconditionFailed`; 404 on an `If-Match` put →
//! `PreconditionFailed` too (AWS answers 404 where SeaweedFS answers 412);
//! 409 → `Conflict`; 429/503 → `Unavailable` not applied; 500/502/504,
//! timeouts and dispatch failures → `Unavailable` with unknown outcome.
//!
//! The SDK's own retries are disabled: [`crate::open`] wraps this store in a
//! [`crate::RetryStore`], whose policy knows which failures are safe to resend.
//! Bodies are sent from memory with checksums only "when required", which
//! avoids aws-chunked uploads (SeaweedFS would store a stray
//! `Content-Encoding: aws-chunked` on the object).

use std::ops::Range;

use async_trait::async_trait;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use bytes::Bytes;

use crate::config::S3Config;
use crate::error::{Error, Outcome, Result};
use crate::key::{validate_key, validate_prefix};
use crate::object::{ETag, ListEntry, ListPage, Object, ObjectMeta, Op, PutCondition};
use crate::{ObjectStore, LIST_PAGE_KEYS_MAX};

/// An S3 bucket as an [`ObjectStore`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: Client,
    bucket: String,
    endpoint: String,
    multipart_threshold_bytes: usize,
    multipart_part_bytes: usize,
}

impl S3Store {
    /// Builds a client from `config`. Credentials: the static pair if given,
    /// else the standard AWS chain (environment, profile, web identity,
    /// instance metadata). Region: the configured one, else the chain's,
    /// else `us-east-1`. Does not contact the server.
    pub async fn connect(config: &S3Config) -> Result<Self> {
        if config.bucket.is_empty() {
            return Err(Error::Config("the S3 bucket name is empty".to_owned()));
        }
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        match (&config.access_key, &config.secret_key) {
            (Some(access_key), Some(secret_key)) => {
                loader = loader.credentials_provider(Credentials::new(
                    access_key.clone(),
                    secret_key.clone(),
                    None,
                    None,
                    "cellfleet-static",
                ));
            }
            (None, None) => {}
            _ => {
                return Err(Error::Config(
                    "set both the S3 access key and the secret key, or neither".to_owned(),
                ))
            }
        }
        let shared = loader.load().await;
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(config.connect_timeout)
            .operation_attempt_timeout(config.request_timeout)
            .build();
        let mut builder = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(config.path_style)
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if shared.region().is_none() {
            builder = builder.region(Region::new("us-east-1"));
        }
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        Ok(Self {
            client: Client::from_conf(builder.build()),
            bucket: config.bucket.clone(),
            endpoint: config.endpoint.clone().unwrap_or_else(|| "aws".to_owned()),
            multipart_threshold_bytes: config.multipart_threshold_bytes,
            multipart_part_bytes: config.multipart_part_bytes.max(5 * 1024 * 1024),
        })
    }

    /// The bucket name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Creates the bucket unless it exists already (for tests and `dev`).
    pub async fn create_bucket_if_missing(&self) -> Result<()> {
        let mut request = self.client.create_bucket().bucket(&self.bucket);
        let region = self.client.config().region().map(|r| r.to_string());
        if let Some(region) = region.filter(|r| r != "us-east-1") {
            request = request.create_bucket_configuration(
                aws_sdk_s3::types::CreateBucketConfiguration::builder()
                    .location_constraint(aws_sdk_s3::types::BucketLocationConstraint::from(
                        region.as_str(),
                    ))
                    .build(),
            );
        }
        match request.send().await {
            Ok(_) => Ok(()),
            Err(error)
                if matches!(
                    error.code(),
                    Some("BucketAlreadyOwnedByYou" | "BucketAlreadyExists")
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(map_error(Op::Put, &self.bucket, error)),
        }
    }

    async fn put_single(&self, key: &str, body: Bytes, condition: &PutCondition) -> Result<ETag> {
        let op = Op::of_put(condition);
        let (if_none_match, if_match) = precondition(condition);
        let output = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_length(body.len() as i64)
            .body(ByteStream::from(body))
            .set_if_none_match(if_none_match)
            .set_if_match(if_match)
            .send()
            .await
            .map_err(|e| map_error(op, key, e))?;
        reply_etag(key, output.e_tag())
    }

    /// Uploads parts, then completes under the precondition: the object
    /// appears atomically, and only if the precondition holds at completion.
    async fn put_multipart(
        &self,
        key: &str,
        body: Bytes,
        condition: &PutCondition,
    ) -> Result<ETag> {
        let op = Op::of_put(condition);
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_error(op, key, e))?;
        let upload_id = created.upload_id().ok_or_else(|| Error::Corrupt {
            key: key.to_owned(),
            reason: "CreateMultipartUpload reply without an upload id".to_owned(),
        })?;
        let result = self
            .upload_parts_and_complete(key, upload_id, body, condition)
            .await;
        if result.is_err() {
            // Best effort: an unfinished upload is invisible, but holds space.
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .send()
                .await;
        }
        result
    }

    async fn upload_parts_and_complete(
        &self,
        key: &str,
        upload_id: &str,
        body: Bytes,
        condition: &PutCondition,
    ) -> Result<ETag> {
        let op = Op::of_put(condition);
        let mut parts = Vec::new();
        let mut offset = 0;
        while offset < body.len() {
            let end = (offset + self.multipart_part_bytes).min(body.len());
            let part_number = i32::try_from(parts.len() + 1).map_err(|_| Error::Rejected {
                op,
                key: key.to_owned(),
                status: None,
                message: "too many parts".to_owned(),
            })?;
            let chunk = body.slice(offset..end);
            let output = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(part_number)
                .content_length(chunk.len() as i64)
                .body(ByteStream::from(chunk))
                .send()
                .await
                .map_err(|e| map_error(op, key, e))?;
            parts.push(
                CompletedPart::builder()
                    .part_number(part_number)
                    .set_e_tag(output.e_tag().map(str::to_owned))
                    .build(),
            );
            offset = end;
        }
        let (if_none_match, if_match) = precondition(condition);
        let output = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .set_if_none_match(if_none_match)
            .set_if_match(if_match)
            .send()
            .await
            .map_err(|e| map_error(op, key, e))?;
        reply_etag(key, output.e_tag())
    }
}

/// A put's precondition as the request's `If-None-Match` and `If-Match`
/// headers (PutObject and CompleteMultipartUpload take the same two).
fn precondition(condition: &PutCondition) -> (Option<String>, Option<String>) {
    match condition {
        PutCondition::Overwrite => (None, None),
        PutCondition::IfNoneMatch => (Some("*".to_owned()), None),
        PutCondition::IfMatch(etag) => (None, Some(etag.quoted())),
    }
}

fn reply_etag(key: &str, etag: Option<&str>) -> Result<ETag> {
    etag.map(ETag::new).ok_or_else(|| Error::Corrupt {
        key: key.to_owned(),
        reason: "reply without an ETag".to_owned(),
    })
}

/// Total size from a `Content-Range: bytes a-b/total` header.
fn total_size(content_range: Option<&str>) -> Option<u64> {
    content_range?.rsplit('/').next()?.parse().ok()
}

/// Maps an SDK error to the store's error (see the module docs).
fn map_error<E>(op: Op, key: &str, error: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = error
        .raw_response()
        .map(|response| response.status().as_u16());
    let code = error.code().map(str::to_owned);
    let message = format!("{}", DisplayErrorContext(&error));
    let key_owned = key.to_owned();
    let unavailable = |outcome| Error::Unavailable {
        op,
        key: key_owned.clone(),
        outcome,
        message: message.clone(),
    };
    // A failed write may have been applied unless the server refused it.
    let unknown_for_writes = if op.is_idempotent() && !matches!(op, Op::Put | Op::Delete) {
        Outcome::NotApplied
    } else {
        Outcome::Unknown
    };
    match (&error, status, code.as_deref()) {
        (_, Some(412), _) | (_, _, Some("PreconditionFailed")) => Error::PreconditionFailed {
            key: key.to_owned(),
        },
        (_, Some(409), Some("ConditionalRequestConflict")) => Error::Conflict {
            key: key.to_owned(),
        },
        (_, Some(409), _) if !op.is_idempotent() => Error::Conflict {
            key: key.to_owned(),
        },
        (_, Some(404), Some("NoSuchBucket")) => Error::Rejected {
            op,
            key: key.to_owned(),
            status,
            message: format!("the bucket does not exist: {message}"),
        },
        (_, Some(404), _) if op == Op::PutIfMatch => Error::PreconditionFailed {
            key: key.to_owned(),
        },
        (_, Some(404), _) | (_, _, Some("NoSuchKey" | "NotFound")) => Error::NotFound {
            key: key.to_owned(),
        },
        (_, Some(416), _) | (_, _, Some("InvalidRange")) => Error::InvalidRange {
            key: key.to_owned(),
            start: 0,
            end: 0,
            size: 0,
        },
        (_, Some(429 | 503), _) | (_, _, Some("SlowDown" | "RequestTimeout")) => {
            unavailable(Outcome::NotApplied)
        }
        (_, Some(status), _) if status >= 500 => unavailable(unknown_for_writes),
        (SdkError::ConstructionFailure(_), _, _) => Error::Rejected {
            op,
            key: key.to_owned(),
            status: None,
            message,
        },
        (SdkError::ServiceError(_), _, _) => Error::Rejected {
            op,
            key: key.to_owned(),
            status,
            message,
        },
        // Timeouts, dispatch failures, unparseable replies: the request may
        // have reached the server.
        _ => unavailable(unknown_for_writes),
    }
}

/// Collects a GET's body; a failure part-way is retryable (reads change nothing).
async fn read_body(op: Op, key: &str, body: aws_sdk_s3::primitives::ByteStream) -> Result<Bytes> {
    Ok(body
        .collect()
        .await
        .map_err(|e| Error::Unavailable {
            op,
            key: key.to_owned(),
            outcome: Outcome::NotApplied,
            message: format!("reading the body: {e}"),
        })?
        .into_bytes())
}

impl S3Store {
    /// One GET of `key` (of `range`, an HTTP `Range` value, when given):
    /// its ETag, the object's total size when the reply says it, the body.
    async fn fetch(
        &self,
        op: Op,
        key: &str,
        range: Option<String>,
    ) -> Result<(ETag, Option<u64>, Bytes)> {
        let output = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .set_range(range)
            .send()
            .await
            .map_err(|e| map_error(op, key, e))?;
        let etag = reply_etag(key, output.e_tag())?;
        let size = total_size(output.content_range());
        let body = read_body(op, key, output.body).await?;
        Ok((etag, size, body))
    }
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn get(&self, key: &str) -> Result<Object> {
        validate_key(key)?;
        let (etag, _, body) = self.fetch(Op::Get, key, None).await?;
        Ok(Object {
            size: body.len() as u64,
            body,
            etag,
        })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Object> {
        validate_key(key)?;
        if range.start >= range.end {
            return Err(Error::InvalidRange {
                key: key.to_owned(),
                start: range.start,
                end: range.end,
                size: 0,
            });
        }
        let http_range = format!("bytes={}-{}", range.start, range.end - 1);
        let (etag, size, body) = self.fetch(Op::GetRange, key, Some(http_range)).await?;
        let size = size.unwrap_or(range.start + body.len() as u64);
        Ok(Object { body, etag, size })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        validate_key(key)?;
        let output = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_error(Op::Head, key, e))?;
        Ok(ObjectMeta {
            etag: reply_etag(key, output.e_tag())?,
            size: output
                .content_length()
                .and_then(|len| u64::try_from(len).ok())
                .unwrap_or(0),
        })
    }

    async fn put(&self, key: &str, body: Bytes, condition: PutCondition) -> Result<ETag> {
        validate_key(key)?;
        if body.len() >= self.multipart_threshold_bytes {
            self.put_multipart(key, body, &condition).await
        } else {
            self.put_single(key, body, &condition).await
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => match map_error(Op::Delete, key, error) {
                Error::NotFound { .. } => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        validate_prefix(prefix)?;
        let max_keys = max_keys.clamp(1, LIST_PAGE_KEYS_MAX);
        let mut request = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .max_keys(i32::try_from(max_keys).unwrap_or(1000));
        if !prefix.is_empty() {
            request = request.prefix(prefix);
        }
        if let Some(after) = start_after {
            request = request.start_after(after);
        }
        let output = request
            .send()
            .await
            .map_err(|e| map_error(Op::List, prefix, e))?;
        let entries: Vec<ListEntry> = output
            .contents()
            .iter()
            .filter_map(|object| {
                Some(ListEntry {
                    key: object.key()?.to_owned(),
                    size: object
                        .size()
                        .and_then(|size| u64::try_from(size).ok())
                        .unwrap_or(0),
                    etag: object.e_tag().map(ETag::new),
                })
            })
            .collect();
        let next_start_after = if output.is_truncated().unwrap_or(false) {
            entries.last().map(|entry| entry.key.clone())
        } else {
            None
        };
        Ok(ListPage {
            entries,
            next_start_after,
        })
    }

    fn describe(&self) -> String {
        format!("s3 {} bucket {}", self.endpoint, self.bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_total() {
        assert_eq!(total_size(Some("bytes 0-9/100")), Some(100));
        assert_eq!(total_size(Some("bytes 0-9/*")), None);
        assert_eq!(total_size(None), None);
    }
}
