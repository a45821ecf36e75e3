//! `cellfleet bench-streams`: the Durable Streams HTTP protocol under load, a Cellfleet node and a reference server side by side in one run, same machine, same load generator.
//!
//! Targets: a `cellfleet node` child process with its streams listener (on
//! the local-directory store or S3), the reference server binary given with
//! `--reference` (Electric's `durable-streams-server`, started on a fresh
//! data directory in its default WAL mode; `scripts/durable-streams.sh`
//! installs it), and any running server given with `--url NAME=URL`.
//!
//! Measurements, each repeated `--repeats` times with the targets
//! interleaved (A B A B ...), reported per repeat and as the median:
//!
//! 1. long-poll append-to-delivery: a reader long-polls the tail of one
//!    stream, a writer appends once the read is parked; the time from
//!    sending the append to having the reader's whole response;
//! 2. SSE fan-out: `--subscribers` SSE connections on one stream, appends
//!    spaced by `--sse-interval-ms`; the time from sending each append to
//!    each subscriber's receipt of its event;
//! 3. appends/s: `--writers` closed-loop writers (one HTTP/1.1 connection
//!    each) appending `--append-bytes` to streams chosen uniformly among the
//!    first N, for each N of `--streams` (created before, and the creation
//!    rate reported too);
//! 4. footprint, after the appends at each stream count, of every server
//!    the bench started: RSS, open files against its limit, and disk
//!    blocks and files per part of its directory. A server that cannot
//!    create the next count leaves the run; the others go on.
//!
//! Correctness is checked on the way (never timings): a long-poll must
//! deliver exactly the append it waited for, every SSE subscriber must get
//! every append once and in order, and every append must be acknowledged
//! with a 2xx. The stream names carry a random run id, so a `--url` server
//! can be measured again without a reset.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::cluster::{node_env, StoreSetup};
use crate::StoreKind;

/// Longest any one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a started server may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Wait between sending a long-poll and the append that should wake it, so
/// the read is parked on the server.
const PARK_DELAY: Duration = Duration::from_millis(20);
/// Longest an SSE subscriber waits for the last append after it was sent.
const SSE_DRAIN: Duration = Duration::from_secs(15);
/// SSE connections opened at once while subscribing.
const SSE_CONNECTS_CONCURRENT: usize = 50;
/// Cells a bench node may own beyond its streams (latency streams, the
/// subscription registry, anything the node keeps for itself).
const CELLS_OWNED_MARGIN: usize = 1_000;
/// Concurrent stream creations.
const CREATE_CONCURRENCY: usize = 64;
/// Attempts per stream creation.
const CREATE_ATTEMPTS: usize = 8;
/// Bounds of the options (the bench's own queues and connection counts).
const WRITERS_MAX: usize = 1_024;
const SUBSCRIBERS_MAX: usize = 10_000;
const STREAMS_MAX: usize = 1_000_000;
const CONTENT_TYPE: &str = "text/plain";
const MIB: f64 = 1024.0 * 1024.0;
/// Largest latency a histogram holds, in microseconds (longer ones are clamped).
const HISTOGRAM_MAX_MICROS: u64 = 120_000_000;
/// Pause of a writer after a failed append, so a failing server is not spun on.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Error messages kept per window (the count is kept in full).
const ERROR_SAMPLES_MAX: usize = 3;

/// Warm-up and measured durations of one appends/s window.
#[derive(Clone, Copy, Debug)]
struct Window {
    warmup: Duration,
    duration: Duration,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_MICROS, 3).expect("constant bounds are valid")
}

#[derive(Debug, Args)]
pub struct StreamsBenchArgs {
    /// Stream counts the appends are spread over, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    streams: Vec<usize>,
    /// Concurrent writers (closed loop, one connection each).
    #[arg(long, default_value_t = 64)]
    writers: usize,
    /// Bytes per append.
    #[arg(long, default_value_t = 256)]
    append_bytes: usize,
    /// Measured seconds of each appends/s window.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Unmeasured seconds before each appends/s window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Repeats of every measurement (targets interleaved); the medians are reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Long-poll deliveries measured per repeat.
    #[arg(long, default_value_t = 100)]
    long_polls: usize,
    /// SSE subscribers on the fan-out stream.
    #[arg(long, default_value_t = 1000)]
    subscribers: usize,
    /// Appends per SSE fan-out repeat.
    #[arg(long, default_value_t = 20)]
    sse_appends: usize,
    /// Milliseconds between SSE fan-out appends.
    #[arg(long, default_value_t = 250)]
    sse_interval_ms: u64,
    /// The store of the Cellfleet node.
    #[arg(long, value_enum, default_value_t = StoreKind::Local)]
    store: StoreKind,
    /// The started node's `cells_open_max`, with its `memory_bytes_max`
    /// raised to the node's default memory per Cell if lower (that bound
    /// would apply first);
    /// without it, the node's defaults. Its start line, with the bound
    /// it applies, is printed.
    #[arg(long)]
    cells_open_max: Option<usize>,
    /// Do not start a Cellfleet node (measure only --reference and --url targets).
    #[arg(long)]
    no_cellfleet: bool,
    /// The reference server binary (durable-streams-server) to start beside the node.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// A running server to measure too, as NAME=http://HOST:PORT (repeatable).
    #[arg(long)]
    url: Vec<String>,
    /// Send the appends of target NAME's long-poll and SSE measurements to
    /// another node of its cluster, as NAME=http://HOST:PORT (repeatable):
    /// its readers then wait on one node for appends made through another.
    #[arg(long)]
    writer: Vec<String>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One server under test.
#[derive(Debug)]
struct Target {
    name: String,
    /// `HOST:PORT`, connected to and sent as `Host`.
    authority: String,
    /// Path prefix before `/v1/stream/...` (empty for a server at the root).
    prefix: String,
    description: String,
    /// `HOST:PORT` the latency measurements' appends go to (`--writer`).
    writer: String,
    /// The process and directory of a server this bench started, whose
    /// footprint it samples.
    started: Option<Started>,
}

/// A server the bench started: its process id and its directory (data,
/// and for a Cellfleet node on the local-directory store the store too).
#[derive(Debug, Clone)]
struct Started {
    pid: u32,
    dir: PathBuf,
}

/// What a started server holds at one moment.
#[derive(Debug, Default, PartialEq)]
struct Footprint {
    rss_bytes: u64,
    rss_peak_bytes: u64,
    open_files: u64,
    /// The soft open-file limit of the process (`None`: unlimited).
    open_files_limit: Option<u64>,
    /// Bytes allocated on disk (blocks, as `du` counts) and files, per
    /// top-level entry of the server's directory.
    disk: BTreeMap<String, (u64, u64)>,
}

impl Footprint {
    /// Reads `/proc/PID/status`, `/proc/PID/fd` and walks the directory.
    fn sample(started: &Started) -> anyhow::Result<Footprint> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", started.pid))
            .with_context(|| format!("reading /proc/{}/status", started.pid))?;
        let (rss_bytes, rss_peak_bytes) = rss_of_status(&status);
        let open_files = std::fs::read_dir(format!("/proc/{}/fd", started.pid))?.count() as u64;
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", started.pid))?;
        let mut disk = BTreeMap::new();
        for entry in std::fs::read_dir(&started.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            disk.insert(name, usage(&entry.path()));
        }
        Ok(Footprint {
            rss_bytes,
            rss_peak_bytes,
            open_files,
            open_files_limit: open_files_limit(&limits),
            disk,
        })
    }

    fn disk_total(&self) -> (u64, u64) {
        self.disk
            .values()
            .fold((0, 0), |(b, f), (bytes, files)| (b + bytes, f + files))
    }
}

/// `VmRSS` and `VmHWM` of a `/proc/PID/status` text, in bytes (0 where
/// absent).
fn rss_of_status(status: &str) -> (u64, u64) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The soft limit of `Max open files` in a `/proc/PID/limits` text.
fn open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Bytes allocated and regular files under `path` (files vanishing during
/// the walk are skipped: the server keeps running).
fn usage(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return (0, 0);
    };
    if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            return (meta.blocks() * 512, 0);
        };
        entries
            .filter_map(Result::ok)
            .map(|e| usage(&e.path()))
            .fold((meta.blocks() * 512, 0), |(b, f), (bytes, files)| {
                (b + bytes, f + files)
            })
    } else {
        (meta.blocks() * 512, u64::from(meta.is_file()))
    }
}

impl Target {
    fn parse(name: &str, url: &str, description: String) -> anyhow::Result<Self> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("{url}: give an http:// URL");
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            bail!("{url}: no host");
        }
        Ok(Target {
            name: name.to_owned(),
            authority: authority.to_owned(),
            prefix: prefix.to_owned(),
            description,
            writer: authority.to_owned(),
            started: None,
        })
    }

    /// Sends the latency measurements' appends to `url` (`--writer`).
    fn write_through(&mut self, url: &str) -> anyhow::Result<()> {
        let writer = Target::parse(&self.name, url, String::new())?;
        if writer.prefix != self.prefix {
            bail!(
                "--writer {url}: the path prefix differs from {}'s",
                self.name
            );
        }
        self.description
            .push_str(&format!("; its long-poll and SSE appends through {url}"));
        self.writer = writer.authority;
        Ok(())
    }

    fn path(&self, run: &str, stream: &str) -> String {
        format!("{}/v1/stream/bench-{run}-{stream}", self.prefix)
    }
}

/// A server process the bench started; killed when dropped.
struct Server {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Server {
    /// SIGTERM, a bounded wait, then SIGKILL (the bench measures no drain).
    fn stop(mut self) {
        crate::cluster::terminate(&self.child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// A response read whole.
struct Reply {
    status: StatusCode,
    next_offset: Option<String>,
    body: Bytes,
}

async fn connect(target: &Target) -> Result<Sender, String> {
    connect_to(&target.authority).await
}

async fn connect_to(authority: &str) -> Result<Sender, String> {
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(authority))
        .await
        .map_err(|_| format!("connecting to {authority}: timed out"))?
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

fn build(target: &Target, method: Method, path: &str, body: Bytes) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", &target.authority);
    if !body.is_empty() {
        builder = builder.header("content-type", CONTENT_TYPE);
    }
    builder
        .body(Full::new(body))
        .expect("method, path and headers are valid")
}

/// Sends one request on `sender` and reads the whole response.
async fn send(sender: &mut Sender, request: Request<Full<Bytes>>) -> Result<Reply, String> {
    let exchange = async {
        sender
            .ready()
            .await
            .map_err(|e| format!("connection: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        read_reply(response).await
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
}

async fn read_reply(response: hyper::Response<hyper::body::Incoming>) -> Result<Reply, String> {
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(Reply {
        status: parts.status,
        next_offset: parts
            .headers
            .get("stream-next-offset")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
    })
}

/// The 256-byte (or `size`) append body carrying its sequence number.
fn payload(sequence: usize, size: usize) -> Bytes {
    let mut text = format!("seq={sequence:08};");
    while text.len() < size {
        text.push('x');
    }
    Bytes::from(text)
}

/// Every `seq=NNNNNNNN` in `text`, in order.
fn sequences(text: &str) -> Vec<usize> {
    text.match_indices("seq=")
        .filter_map(|(i, _)| text.get(i + 4..i + 12)?.parse().ok())
        .collect()
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn quantile_ms(histogram: &Histogram<u64>, q: f64) -> f64 {
    if histogram.is_empty() {
        return 0.0;
    }
    ms(histogram.value_at_quantile(q))
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn record(histogram: &mut Histogram<u64>, duration: Duration) {
    histogram.saturating_record(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX));
}

/// Creates streams `from..to` (PUT, idempotent), `CREATE_CONCURRENCY` at a time.
async fn create_streams(
    target: &Arc<Target>,
    run: &str,
    from: usize,
    to: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(from));
    let tasks: Vec<_> = (0..CREATE_CONCURRENCY.min(to.saturating_sub(from)).max(1))
        .map(|_| {
            let target = target.clone();
            let next = next.clone();
            let run = run.to_owned();
            tokio::spawn(async move {
                let mut sender: Option<Sender> = None;
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= to {
                        return Ok::<(), String>(());
                    }
                    let path = target.path(&run, &index.to_string());
                    let mut last = String::new();
                    let mut created = false;
                    for attempt in 0..CREATE_ATTEMPTS {
                        if attempt > 0 {
                            // A 503 is back-pressure (a bound, a passivation
                            // in progress): back off instead of failing at once.
                            let backoff = 50u64 << attempt.min(5);
                            tokio::time::sleep(Duration::from_millis(backoff)).await;
                        }
                        if sender.is_none() {
                            sender = Some(connect(&target).await?);
                        }
                        let request = build(&target, Method::PUT, &path, Bytes::new());
                        let request = with_content_type(request);
                        match send(sender.as_mut().expect("connected"), request).await {
                            Ok(reply) if reply.status.is_success() => {
                                created = true;
                                break;
                            }
                            Ok(reply) => {
                                last = format!(
                                    "PUT {path}: {} {}",
                                    reply.status,
                                    String::from_utf8_lossy(&reply.body).trim()
                                )
                            }
                            Err(e) => {
                                sender = None;
                                last = format!("PUT {path}: {e}");
                            }
                        }
                    }
                    if !created {
                        return Err(last);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await
            .context("a creating task failed")?
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("creating streams on {}", target.name))?;
    }
    Ok(started.elapsed())
}

fn with_content_type(mut request: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    request.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static(CONTENT_TYPE),
    );
    request
}

/// The tail offset of a stream (HEAD).
async fn tail(target: &Target, path: &str) -> anyhow::Result<String> {
    let mut sender = connect(target).await.map_err(anyhow::Error::msg)?;
    let reply = send(&mut sender, build(target, Method::HEAD, path, Bytes::new()))
        .await
        .map_err(anyhow::Error::msg)?;
    if !reply.status.is_success() {
        bail!("HEAD {path} on {}: {}", target.name, reply.status);
    }
    reply
        .next_offset
        .with_context(|| format!("HEAD {path} on {}: no Stream-Next-Offset", target.name))
}

/// One appends/s window.
struct AppendResult {
    count: u64,
    errors: u64,
    appends_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    error_samples: Vec<String>,
}

/// `writers` closed-loop writers, each on its own connection, appending to
/// streams chosen uniformly among the first `streams`. An append is
/// measured if it was sent inside the window; the rate is the measured
/// count over the time from the window's start to the last measured answer.
async fn appends(
    target: &Arc<Target>,
    run: &str,
    streams: usize,
    writers: usize,
    append_bytes: usize,
    window: Window,
) -> AppendResult {
    let body = payload(0, append_bytes);
    let start = Instant::now() + window.warmup;
    let end = start + window.duration;
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let (target, body, run) = (target.clone(), body.clone(), run.to_owned());
            tokio::spawn(
                async move { append_writer(&target, &run, streams, body, (start, end)).await },
            )
        })
        .collect();
    let mut total = histogram();
    let mut errors = 0;
    let mut error_samples = Vec::new();
    let mut last_done = start;
    for task in tasks {
        match task.await {
            Ok((latencies, e, samples, done)) => {
                total
                    .add(&latencies)
                    .expect("histograms of the same bounds add");
                errors += e;
                error_samples.extend(samples);
                last_done = last_done.max(done);
            }
            Err(e) => {
                errors += 1;
                error_samples.push(format!("writer failed: {e}"));
            }
        }
    }
    error_samples.truncate(ERROR_SAMPLES_MAX);
    let wall = last_done
        .saturating_duration_since(start)
        .max(window.duration);
    let count = total.len();
    AppendResult {
        count,
        errors,
        appends_per_s: count as f64 / wall.as_secs_f64(),
        p50_ms: quantile_ms(&total, 0.5),
        p99_ms: quantile_ms(&total, 0.99),
        error_samples,
    }
}

/// One closed-loop writer of [`appends`] on its own connection (opened
/// again after a transport error): `(latencies, errors, error samples,
/// last measured answer)`.
async fn append_writer(
    target: &Target,
    run: &str,
    streams: usize,
    body: Bytes,
    (start, end): (Instant, Instant),
) -> (Histogram<u64>, u64, Vec<String>, Instant) {
    let mut latencies = histogram();
    let mut errors = 0u64;
    let mut samples = Vec::new();
    let mut last_done = start;
    let mut sender: Option<Sender> = None;
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        let measured = sent >= start;
        let path = target.path(run, &rand::random_range(0..streams).to_string());
        let outcome = match &mut sender {
            Some(s) => send(s, build(target, Method::POST, &path, body.clone())).await,
            None => match connect(target).await {
                Ok(s) => {
                    sender = Some(s);
                    continue;
                }
                Err(e) => Err(e),
            },
        };
        let error = match outcome {
            Ok(reply) if reply.status.is_success() => {
                if measured {
                    record(&mut latencies, sent.elapsed());
                    last_done = Instant::now();
                }
                continue;
            }
            Ok(reply) => format!(
                "POST {path}: {}: {}",
                reply.status,
                String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)])
            ),
            Err(e) => {
                sender = None;
                format!("POST {path}: {e}")
            }
        };
        if measured {
            errors += 1;
        }
        if samples.len() < ERROR_SAMPLES_MAX {
            samples.push(error);
        }
        tokio::time::sleep(ERROR_BACKOFF).await;
    }
    (latencies, errors, samples, last_done)
}

/// Latencies of one long-poll or SSE repeat, with what was wrong.
struct LatencyResult {
    histogram: Histogram<u64>,
    expected: u64,
    /// Deliveries that were missing, repeated, out of order or of the wrong append.
    wrong: u64,
    /// SSE only: subscribers that could not connect.
    unconnected: u64,
}

impl LatencyResult {
    fn json(&self) -> Value {
        json!({
            "samples": self.histogram.len(),
            "expected": self.expected,
            "wrong": self.wrong,
            "unconnected": self.unconnected,
            "p50_ms": quantile_ms(&self.histogram, 0.5),
            "p99_ms": quantile_ms(&self.histogram, 0.99),
            "max_ms": ms(self.histogram.max()),
        })
    }
}

async fn long_poll(
    target: &Target,
    path: &str,
    samples: usize,
    append_bytes: usize,
) -> anyhow::Result<LatencyResult> {
    let mut offset = tail(target, path).await?;
    let mut writer = connect_to(&target.writer)
        .await
        .map_err(anyhow::Error::msg)?;
    let mut reader = connect(target).await.map_err(anyhow::Error::msg)?;
    let mut result = LatencyResult {
        histogram: histogram(),
        expected: samples as u64,
        wrong: 0,
        unconnected: 0,
    };
    for sequence in 0..samples {
        reader
            .ready()
            .await
            .map_err(|e| anyhow::anyhow!("reader connection: {e}"))?;
        let read = reader.send_request(build(
            target,
            Method::GET,
            &format!("{path}?offset={offset}&live=long-poll"),
            Bytes::new(),
        ));
        let delivered = tokio::spawn(async move {
            let response = tokio::time::timeout(REQUEST_TIMEOUT, read)
                .await
                .map_err(|_| "long-poll: no answer".to_owned())?
                .map_err(|e| format!("long-poll: {e}"))?;
            let reply = read_reply(response).await?;
            Ok::<_, String>((Instant::now(), reply))
        });
        tokio::time::sleep(PARK_DELAY).await;
        let sent = Instant::now();
        let appended = send(
            &mut writer,
            build(target, Method::POST, path, payload(sequence, append_bytes)),
        )
        .await
        .map_err(anyhow::Error::msg)?;
        if !appended.status.is_success() {
            bail!("append on {}: {}", target.name, appended.status);
        }
        let (at, reply) = delivered
            .await
            .context("the long-poll task failed")?
            .map_err(anyhow::Error::msg)?;
        let body = String::from_utf8_lossy(&reply.body);
        if reply.status == StatusCode::OK && sequences(&body) == [sequence] {
            record(&mut result.histogram, at.saturating_duration_since(sent));
        } else {
            result.wrong += 1;
        }
        offset = match reply.next_offset.or(appended.next_offset) {
            Some(next) => next,
            None => bail!("{}: no Stream-Next-Offset on a long-poll", target.name),
        };
    }
    Ok(result)
}

/// One server-sent event: its `event:` name and its `data:` lines joined by `\n`.
#[derive(Debug, PartialEq, Eq)]
struct SseEvent {
    kind: String,
    data: String,
}

/// Removes every complete event (ended by a blank line) from the front of
/// `buffer`; an incomplete one stays for the next chunk. Lines may end in
/// LF or CRLF; a space after the colon is dropped, as SSE readers do.
fn take_events(buffer: &mut String) -> Vec<SseEvent> {
    if buffer.contains('\r') {
        *buffer = buffer.replace("\r\n", "\n");
    }
    let mut events = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut kind = String::new();
        let mut data = Vec::new();
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => kind = value.to_owned(),
                "data" => data.push(value),
                _ => {}
            }
        }
        events.push(SseEvent {
            kind,
            data: data.join("\n"),
        });
    }
    events
}

/// What one SSE subscriber received: (sequence, when) per append.
type Received = Vec<(usize, Instant)>;

async fn subscribe(
    target: Arc<Target>,
    path: String,
    offset: String,
    appends: usize,
    ready: Arc<AtomicUsize>,
    connects: Arc<Semaphore>,
    deadline: Arc<OnceLock<tokio::time::Instant>>,
) -> Result<Received, String> {
    let response = {
        let _permit = connects.acquire().await.map_err(|e| e.to_string())?;
        let mut sender = connect(&target).await?;
        sender.ready().await.map_err(|e| e.to_string())?;
        let request = build(
            &target,
            Method::GET,
            &format!("{path}?offset={offset}&live=sse"),
            Bytes::new(),
        );
        let response = tokio::time::timeout(REQUEST_TIMEOUT, sender.send_request(request))
            .await
            .map_err(|_| "sse: no answer".to_owned())?
            .map_err(|e| format!("sse: {e}"))?;
        if response.status() != StatusCode::OK {
            return Err(format!("sse: {}", response.status()));
        }
        // The connection task keeps running once `sender` is dropped, as
        // long as the response body is being read.
        response
    };
    let mut body = response.into_body();
    let mut buffer = String::new();
    let mut received = Received::new();
    let mut announced = false;
    loop {
        let wait = match deadline.get() {
            Some(at) => tokio::time::timeout_at(*at, body.frame()).await,
            None => tokio::time::timeout(SSE_DRAIN * 8, body.frame()).await,
        };
        let frame = match wait {
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => return Err(format!("sse body: {e}")),
            Ok(None) | Err(_) => return Ok(received),
        };
        let at = Instant::now();
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buffer.push_str(&String::from_utf8_lossy(&data));
        for event in take_events(&mut buffer) {
            if event.kind == "control" && !announced {
                announced = true;
                ready.fetch_add(1, Ordering::SeqCst);
            }
            if event.kind == "data" {
                received.extend(sequences(&event.data).into_iter().map(|s| (s, at)));
            }
        }
        if received.len() >= appends {
            return Ok(received);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn sse_fanout(
    target: &Arc<Target>,
    path: &str,
    subscribers: usize,
    appends: usize,
    interval: Duration,
    append_bytes: usize,
) -> anyhow::Result<LatencyResult> {
    let offset = tail(target, path).await?;
    let ready = Arc::new(AtomicUsize::new(0));
    let connects = Arc::new(Semaphore::new(SSE_CONNECTS_CONCURRENT));
    let deadline = Arc::new(OnceLock::new());
    let tasks: Vec<_> = (0..subscribers)
        .map(|_| {
            tokio::spawn(subscribe(
                target.clone(),
                path.to_owned(),
                offset.clone(),
                appends,
                ready.clone(),
                connects.clone(),
                deadline.clone(),
            ))
        })
        .collect();
    // Every subscriber is connected and has its first control event, or
    // has failed, before the first append.
    let connected_by = Instant::now() + START_TIMEOUT;
    while ready.load(Ordering::SeqCst) + tasks.iter().filter(|t| t.is_finished()).count()
        < subscribers
        && Instant::now() < connected_by
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut writer = connect_to(&target.writer)
        .await
        .map_err(anyhow::Error::msg)?;
    let mut sent = Vec::with_capacity(appends);
    for sequence in 0..appends {
        let at = Instant::now();
        let reply = send(
            &mut writer,
            build(target, Method::POST, path, payload(sequence, append_bytes)),
        )
        .await
        .map_err(anyhow::Error::msg)?;
        if !reply.status.is_success() {
            bail!("append on {}: {}", target.name, reply.status);
        }
        sent.push(at);
        tokio::time::sleep(interval).await;
    }
    let _ = deadline.set(tokio::time::Instant::now() + SSE_DRAIN);
    let mut result = LatencyResult {
        histogram: histogram(),
        expected: (subscribers * appends) as u64,
        wrong: 0,
        unconnected: 0,
    };
    for task in tasks {
        let received = match task.await {
            Ok(Ok(received)) => received,
            Ok(Err(_)) | Err(_) => {
                result.unconnected += 1;
                result.wrong += appends as u64;
                continue;
            }
        };
        let in_order = received.iter().map(|(s, _)| *s).eq(0..received.len());
        if !in_order || received.len() != appends {
            let good = if in_order { received.len() } else { 0 };
            result.wrong += (appends - good.min(appends)) as u64;
        }
        for (sequence, at) in received {
            if let Some(sent) = in_order.then(|| sent.get(sequence)).flatten() {
                record(&mut result.histogram, at.saturating_duration_since(*sent));
            }
        }
    }
    Ok(result)
}

/// Starts one `cellfleet node` with its streams listener on a kernel-chosen port.
fn start_cellfleet(
    exe: &Path,
    store: &StoreSetup,
    streams_max: usize,
    cells_open_max: Option<usize>,
) -> anyhow::Result<(Server, Target)> {
    let dir = tempfile::Builder::new()
        .prefix("cellfleet-bench-streams-")
        .tempdir()
        .context("creating the node directory")?;
    let configs = crate::cluster::write_cluster_files(exe, dir.path(), 1, 5_000)?;
    let config = configs.first().context("dev wrote no node config")?;
    // The node owns every stream plus the latency streams' and the
    // subscription registry's Cells; the default bound (100,000) would
    // refuse the last few of a 100k run.
    let text = std::fs::read_to_string(config)?;
    let mut file: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", config.display()))?;
    let limits = file
        .entry("limits")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .context("the node config's `limits` is not a table")?;
    let owned = streams_max.max(100_000) + CELLS_OWNED_MARGIN;
    limits.insert(
        "cells_owned_max".into(),
        toml::Value::Integer(i64::try_from(owned)?),
    );
    if let Some(open) = cells_open_max {
        limits.insert(
            "cells_open_max".into(),
            toml::Value::Integer(i64::try_from(open)?),
        );
        let defaults = cellfleet_runtime::NodeLimits::default();
        let memory = u64::try_from(open)?
            .saturating_mul(defaults.memory_bytes_per_open_cell(1))
            .max(defaults.memory_bytes_max);
        limits.insert(
            "memory_bytes_max".into(),
            toml::Value::Integer(i64::try_from(memory)?),
        );
    }
    std::fs::write(config, toml::to_string(&file)?)?;
    let log_path = dir.path().join("n1.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = Command::new(exe)
        .arg("node")
        .arg("--config")
        .arg(config)
        .envs(node_env(store))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log.try_clone()?))
        .spawn()
        .context("starting cellfleet node")?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let (found, address) = mpsc::channel();
    std::thread::spawn(move || {
        let mut log = log;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(log, "{line}");
            if let Some(url) = line.split(" streams=").nth(1) {
                let _ = found.send(url.trim().to_owned());
            }
        }
    });
    let server = Server { child, _dir: dir };
    let url = address.recv_timeout(START_TIMEOUT).with_context(|| {
        format!(
            "the node printed no streams address; its log:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        )
    })?;
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    if let Some(line) = log_text.lines().find(|l| l.contains("cells open at most")) {
        eprintln!("bench-streams: {line}");
    }
    let description = match store {
        StoreSetup::Local => "cellfleet node, local-directory store".to_owned(),
        StoreSetup::S3 { config, .. } => format!(
            "cellfleet node, S3 store {}",
            config.endpoint.as_deref().unwrap_or("(aws)")
        ),
    };
    let mut target = Target::parse("cellfleet", &url, description)?;
    target.started = Some(Started {
        pid: server.child.id(),
        dir: server._dir.path().to_owned(),
    });
    Ok((server, target))
}

/// Starts the reference server on a fresh data directory, default flags
/// (WAL durability), on a free loopback port.
fn start_reference(binary: &PathBuf) -> anyhow::Result<(Server, Target)> {
    let dir = tempfile::Builder::new()
        .prefix("cellfleet-bench-reference-")
        .tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = std::fs::File::create(dir.path().join("server.log"))?;
    let child = Command::new(binary)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let server = Server { child, _dir: dir };
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + START_TIMEOUT;
    while std::net::TcpStream::connect(&address).is_err() {
        if Instant::now() > deadline {
            bail!("{} did not listen on {address}", binary.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut target = Target::parse(
        "reference",
        &format!("http://{address}"),
        format!("{} (default flags: WAL durability)", binary.display()),
    )?;
    target.started = Some(Started {
        pid: server.child.id(),
        dir: server._dir.path().to_owned(),
    });
    Ok((server, target))
}

fn check(args: &StreamsBenchArgs) -> anyhow::Result<()> {
    if args.streams.is_empty() || args.streams.iter().any(|n| *n < 2 || *n > STREAMS_MAX) {
        bail!("--streams: give counts 2..={STREAMS_MAX}, like 1000,10000");
    }
    if args.streams.windows(2).any(|w| w[0] > w[1]) {
        bail!("--streams: give the counts in increasing order");
    }
    if args.writers == 0 || args.writers > WRITERS_MAX {
        bail!("--writers must be 1..={WRITERS_MAX}");
    }
    if args.subscribers == 0 || args.subscribers > SUBSCRIBERS_MAX {
        bail!("--subscribers must be 1..={SUBSCRIBERS_MAX}");
    }
    if !(16..=1 << 20).contains(&args.append_bytes) {
        bail!("--append-bytes must be 16..=1048576");
    }
    if args.repeats == 0 || args.repeats > 100 {
        bail!("--repeats must be 1..=100");
    }
    if args.long_polls == 0 || args.sse_appends == 0 {
        bail!("--long-polls and --sse-appends must be positive");
    }
    Ok(())
}

fn seconds(value: f64, name: &str) -> anyhow::Result<Duration> {
    if !value.is_finite() || !(0.0..=3600.0).contains(&value) {
        bail!("--{name} {value}: give seconds between 0 and 3600");
    }
    Ok(Duration::from_secs_f64(value))
}

/// Runs `cellfleet bench-streams`; `exe` is the `cellfleet` binary whose
/// node it starts.
pub fn run(exe: &Path, args: StreamsBenchArgs) -> anyhow::Result<ExitCode> {
    check(&args)?;
    let window = Window {
        warmup: seconds(args.warmup, "warmup")?,
        duration: seconds(args.duration, "duration")?,
    };
    if window.duration.is_zero() {
        bail!("--duration must be positive");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut servers = Vec::new();
    let mut targets = Vec::new();
    if !args.no_cellfleet {
        let store = StoreSetup::resolve(args.store, "bench-streams", &runtime)?;
        eprintln!(
            "bench-streams: starting a cellfleet node ({:?} store)",
            args.store
        );
        let streams_max = args.streams.iter().copied().max().unwrap_or(0);
        let (server, target) = start_cellfleet(exe, &store, streams_max, args.cells_open_max)?;
        servers.push(server);
        targets.push(target);
    }
    if let Some(binary) = &args.reference {
        eprintln!("bench-streams: starting {}", binary.display());
        let (server, target) = start_reference(binary)?;
        servers.push(server);
        targets.push(target);
    }
    for spec in &args.url {
        let Some((name, url)) = spec.split_once('=') else {
            bail!("--url {spec}: give NAME=http://HOST:PORT");
        };
        targets.push(Target::parse(name, url, format!("running server {url}"))?);
    }
    for spec in &args.writer {
        let Some((name, url)) = spec.split_once('=') else {
            bail!("--writer {spec}: give NAME=http://HOST:PORT");
        };
        let Some(target) = targets.iter_mut().find(|t| t.name == name) else {
            bail!("--writer {spec}: no target named {name}");
        };
        target.write_through(url)?;
    }
    if targets.is_empty() {
        bail!("nothing to measure: no cellfleet node, --reference or --url");
    }
    let targets: Vec<Arc<Target>> = targets.into_iter().map(Arc::new).collect();
    // Rows measured before a failure are kept and reported with the error.
    let run = format!("{:08x}", rand::random::<u32>());
    let mut rows = Vec::new();
    let outcome = runtime.block_on(measure(&args, &targets, window, &run, &mut rows));
    eprintln!("bench-streams: stopping the servers");
    for server in servers {
        server.stop();
    }
    let report = report(&args, &targets, window, &run, rows, outcome.as_ref().err());
    print!("{}", table(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench-streams: wrote {}", path.display());
    }
    outcome?;
    let wrong = report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|row| row["wrong"].as_u64().unwrap_or(0) > 0);
    if wrong {
        eprintln!("bench-streams: some deliveries were missing, repeated or wrong");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Everything between "servers ready" and "stop the servers"; each
/// measurement adds a row to `rows`.
async fn measure(
    args: &StreamsBenchArgs,
    targets: &[Arc<Target>],
    window: Window,
    run: &str,
    rows: &mut Vec<Value>,
) -> anyhow::Result<()> {
    let mut created = vec![0usize; targets.len()];
    let first = args.streams[0];
    for (target, created) in targets.iter().zip(created.iter_mut()) {
        eprintln!("bench-streams: {} creating {first} streams", target.name);
        let took = create_streams(target, run, 0, first).await?;
        rows.push(create_row(target, 0, first, took));
        *created = first;
    }
    measure_latencies(args, targets, run, rows).await?;
    // A target that cannot create the next stream count (a server that
    // keeps a file open per stream runs out of descriptors) leaves the
    // run; the others go on to the larger counts.
    let mut failed = vec![false; targets.len()];
    for &streams in &args.streams {
        for (i, (target, created)) in targets.iter().zip(created.iter_mut()).enumerate() {
            if *created < streams && !failed[i] {
                eprintln!(
                    "bench-streams: {} creating streams {}..{streams}",
                    target.name, *created
                );
                let started = Instant::now();
                match create_streams(target, run, *created, streams).await {
                    Ok(took) => {
                        rows.push(create_row(target, *created, streams, took));
                        *created = streams;
                    }
                    Err(error) => {
                        eprintln!("bench-streams: {} leaves the run: {error:#}", target.name);
                        rows.push(json!({
                            "measure": "create_failed",
                            "target": target.name,
                            "from": *created,
                            "to": streams,
                            "seconds": started.elapsed().as_secs_f64(),
                            "error": format!("{error:#}"),
                        }));
                        failed[i] = true;
                    }
                }
            }
        }
        if failed.iter().all(|f| *f) {
            bail!("no target could create {streams} streams");
        }
        let live: Vec<&Arc<Target>> = targets
            .iter()
            .zip(&failed)
            .filter(|(_, failed)| !**failed)
            .map(|(target, _)| target)
            .collect();
        for repeat in 0..args.repeats {
            for target in &live {
                eprintln!(
                    "bench-streams: {} appends over {streams} streams #{repeat}",
                    target.name
                );
                let result = appends(
                    target,
                    run,
                    streams,
                    args.writers,
                    args.append_bytes,
                    window,
                )
                .await;
                rows.push(append_row(target, streams, repeat, args.writers, result));
            }
        }
        for target in live {
            if let Some(started) = &target.started {
                match Footprint::sample(started) {
                    Ok(footprint) => rows.push(footprint_row(target, streams, &footprint)),
                    // Reported, and the appends rows say whether it still served.
                    Err(error) => rows.push(json!({
                        "measure": "footprint_failed",
                        "target": target.name,
                        "streams": streams,
                        "error": format!("{error:#}"),
                    })),
                }
            }
        }
    }
    Ok(())
}

/// What a started server holds after the appends over `streams` streams.
fn footprint_row(target: &Target, streams: usize, footprint: &Footprint) -> Value {
    let (disk_bytes, disk_files) = footprint.disk_total();
    json!({
        "measure": "footprint",
        "target": target.name,
        "streams": streams,
        "rss_bytes": footprint.rss_bytes,
        "rss_peak_bytes": footprint.rss_peak_bytes,
        "open_files": footprint.open_files,
        "open_files_limit": footprint.open_files_limit,
        "disk_bytes": disk_bytes,
        "disk_files": disk_files,
        "disk_bytes_per_stream": disk_bytes as f64 / streams as f64,
        "disk_files_per_stream": disk_files as f64 / streams as f64,
        "disk": footprint.disk.iter().map(|(name, (bytes, files))| {
            (name.clone(), json!({ "bytes": bytes, "files": files }))
        }).collect::<serde_json::Map<_, _>>(),
    })
}

/// The long-poll and SSE fan-out repeats on every target. The latency
/// streams are the first two of the pool, so a node's owned Cells are
/// exactly the largest stream count.
async fn measure_latencies(
    args: &StreamsBenchArgs,
    targets: &[Arc<Target>],
    run: &str,
    rows: &mut Vec<Value>,
) -> anyhow::Result<()> {
    let long_poll_path = |t: &Target| t.path(run, "0");
    let sse_path = |t: &Target| t.path(run, "1");
    for repeat in 0..args.repeats {
        for target in targets {
            eprintln!("bench-streams: {} long-poll #{repeat}", target.name);
            let result = long_poll(
                target,
                &long_poll_path(target),
                args.long_polls,
                args.append_bytes,
            )
            .await?;
            rows.push(latency_row("long_poll", target, repeat, &result));
        }
        for target in targets {
            eprintln!(
                "bench-streams: {} sse fan-out to {} #{repeat}",
                target.name, args.subscribers
            );
            let result = sse_fanout(
                target,
                &sse_path(target),
                args.subscribers,
                args.sse_appends,
                Duration::from_millis(args.sse_interval_ms),
                args.append_bytes,
            )
            .await?;
            rows.push(latency_row("sse_fanout", target, repeat, &result));
        }
    }
    Ok(())
}

/// One appends repeat as a report row.
fn append_row(
    target: &Target,
    streams: usize,
    repeat: usize,
    writers: usize,
    result: AppendResult,
) -> Value {
    json!({
        "measure": "appends",
        "target": target.name,
        "streams": streams,
        "repeat": repeat,
        "writers": writers,
        "count": result.count,
        "errors": result.errors,
        "appends_per_s": result.appends_per_s,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "error_samples": result.error_samples,
    })
}

/// The report as JSON: configuration, targets, every row, the medians and
/// ratios, and the error that ended the run early, if any.
fn report(
    args: &StreamsBenchArgs,
    targets: &[Arc<Target>],
    window: Window,
    run: &str,
    rows: Vec<Value>,
    error: Option<&anyhow::Error>,
) -> Value {
    let summary = summarize(targets, &args.streams, &rows);
    json!({
        "run": run,
        "error": error.map(|e| format!("{e:#}")),
        "config": {
            "streams": args.streams,
            "writers": args.writers,
            "append_bytes": args.append_bytes,
            "duration_s": window.duration.as_secs_f64(),
            "warmup_s": window.warmup.as_secs_f64(),
            "repeats": args.repeats,
            "long_polls": args.long_polls,
            "subscribers": args.subscribers,
            "sse_appends": args.sse_appends,
            "sse_interval_ms": args.sse_interval_ms,
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        },
        "targets": targets.iter().map(|t| json!({
            "name": t.name, "authority": t.authority, "description": t.description,
        })).collect::<Vec<_>>(),
        "rows": rows,
        "summary": summary,
    })
}

fn create_row(target: &Target, from: usize, to: usize, took: Duration) -> Value {
    json!({
        "measure": "create",
        "target": target.name,
        "from": from,
        "to": to,
        "seconds": took.as_secs_f64(),
        "creates_per_s": (to - from) as f64 / took.as_secs_f64().max(1e-9),
    })
}

fn latency_row(measure: &str, target: &Target, repeat: usize, result: &LatencyResult) -> Value {
    let mut row = result.json();
    row["measure"] = json!(measure);
    row["target"] = json!(target.name);
    row["repeat"] = json!(repeat);
    row
}

/// Medians over repeats per target, the ratios of every target to the
/// first one, and the cardinality goal (appends/s at the largest stream
/// count ≥ 80% of the smallest).
fn summarize(targets: &[Arc<Target>], levels: &[usize], rows: &[Value]) -> Value {
    let values = |measure: &str, target: &str, field: &str, streams: Option<usize>| {
        rows.iter()
            .filter(|r| r["measure"] == measure && r["target"] == target)
            .filter(|r| streams.is_none_or(|n| r["streams"] == n))
            .filter_map(|r| r[field].as_f64())
            .collect::<Vec<_>>()
    };
    let mut per_target = BTreeMap::new();
    for target in targets {
        let name = target.name.as_str();
        let mut entry = serde_json::Map::new();
        for &n in levels {
            // Only what was measured: a target that left the run before
            // `n` streams has no entry for `n`.
            for (measure, field, key) in [
                ("appends", "appends_per_s", "appends_per_s"),
                ("appends", "p50_ms", "append_p50_ms"),
                ("footprint", "rss_bytes", "rss_bytes"),
                ("footprint", "open_files", "open_files"),
                (
                    "footprint",
                    "disk_bytes_per_stream",
                    "disk_bytes_per_stream",
                ),
            ] {
                let sampled = values(measure, name, field, Some(n));
                if !sampled.is_empty() {
                    entry.insert(format!("{key}_{n}"), json!(median(sampled)));
                }
            }
        }
        for measure in ["long_poll", "sse_fanout"] {
            for q in ["p50_ms", "p99_ms"] {
                entry.insert(
                    format!("{measure}_{q}"),
                    json!(median(values(measure, name, q, None))),
                );
            }
        }
        let low = median(values("appends", name, "appends_per_s", Some(levels[0])));
        let largest = *levels.last().expect("levels are checked non-empty");
        let high = median(values("appends", name, "appends_per_s", Some(largest)));
        if values("appends", name, "appends_per_s", Some(largest)).is_empty() {
            // It left the run before the largest count: not measured.
            entry.insert("cardinality_ratio".into(), Value::Null);
            entry.insert("cardinality_goal_met".into(), Value::Null);
        } else {
            let ratio = if low > 0.0 { high / low } else { 0.0 };
            entry.insert("cardinality_ratio".into(), json!(ratio));
            entry.insert("cardinality_goal_met".into(), json!(ratio >= 0.8));
        }
        per_target.insert(name.to_owned(), Value::Object(entry));
    }
    let mut ratios = BTreeMap::new();
    if let Some(base) = targets.first() {
        for other in &targets[1..] {
            let mut entry = serde_json::Map::new();
            let a = &per_target[&base.name];
            let b = &per_target[&other.name];
            if let (Value::Object(a), Value::Object(b)) = (a, b) {
                for (key, value) in a {
                    if let (Some(x), Some(y)) = (value.as_f64(), b.get(key).and_then(Value::as_f64))
                    {
                        if y > 0.0 && !key.starts_with("cardinality") {
                            entry.insert(key.clone(), json!(x / y));
                        }
                    }
                }
            }
            ratios.insert(
                format!("{}/{}", base.name, other.name),
                Value::Object(entry),
            );
        }
    }
    json!({ "median": per_target, "ratios": ratios })
}

fn table(report: &Value) -> String {
    let mut out = String::new();
    let empty = Vec::new();
    let rows = report["rows"].as_array().unwrap_or(&empty);
    out.push_str(
        "measure      target       streams repeat   rate/s    p50 ms    p99 ms  errors/wrong\n",
    );
    for row in rows {
        let measure = row["measure"].as_str().unwrap_or("");
        let line = match measure {
            "create" => format!(
                "{:<12} {:<12} {:>7} {:>6} {:>8.0} {:>9} {:>9}  (from {} in {:.1} s)\n",
                "create",
                row["target"].as_str().unwrap_or(""),
                row["to"],
                "-",
                row["creates_per_s"].as_f64().unwrap_or(0.0),
                "-",
                "-",
                row["from"],
                row["seconds"].as_f64().unwrap_or(0.0),
            ),
            "create_failed" => format!(
                "{:<12} {:<12} {:>7} {:>6}  failed after {:.1} s, leaves the run: {}\n",
                "create",
                row["target"].as_str().unwrap_or(""),
                row["to"],
                "-",
                row["seconds"].as_f64().unwrap_or(0.0),
                row["error"].as_str().unwrap_or(""),
            ),
            "footprint_failed" => format!(
                "{:<12} {:<12} {:>7} {:>6}  not sampled: {}\n",
                "footprint",
                row["target"].as_str().unwrap_or(""),
                row["streams"],
                "-",
                row["error"].as_str().unwrap_or(""),
            ),
            "footprint" => format!(
                "{:<12} {:<12} {:>7} {:>6}  RSS {:.0} MiB (peak {:.0}), {} open files (limit {}), {:.0} MiB and {} files on disk ({:.1} KiB, {:.2} files per stream)\n",
                measure,
                row["target"].as_str().unwrap_or(""),
                row["streams"],
                "-",
                row["rss_bytes"].as_f64().unwrap_or(0.0) / MIB,
                row["rss_peak_bytes"].as_f64().unwrap_or(0.0) / MIB,
                row["open_files"],
                row["open_files_limit"]
                    .as_u64()
                    .map_or("unlimited".to_owned(), |n| n.to_string()),
                row["disk_bytes"].as_f64().unwrap_or(0.0) / MIB,
                row["disk_files"],
                row["disk_bytes_per_stream"].as_f64().unwrap_or(0.0) / 1024.0,
                row["disk_files_per_stream"].as_f64().unwrap_or(0.0),
            ),
            "appends" => format!(
                "{:<12} {:<12} {:>7} {:>6} {:>8.0} {:>9.2} {:>9.2}  {}\n",
                measure,
                row["target"].as_str().unwrap_or(""),
                row["streams"],
                row["repeat"],
                row["appends_per_s"].as_f64().unwrap_or(0.0),
                row["p50_ms"].as_f64().unwrap_or(0.0),
                row["p99_ms"].as_f64().unwrap_or(0.0),
                row["errors"],
            ),
            _ => format!(
                "{:<12} {:<12} {:>7} {:>6} {:>8} {:>9.2} {:>9.2}  {} of {} wrong, {} unconnected\n",
                measure,
                row["target"].as_str().unwrap_or(""),
                "-",
                row["repeat"],
                row["samples"],
                row["p50_ms"].as_f64().unwrap_or(0.0),
                row["p99_ms"].as_f64().unwrap_or(0.0),
                row["wrong"],
                row["expected"],
                row["unconnected"],
            ),
        };
        out.push_str(&line);
    }
    if let Some(error) = report["error"].as_str() {
        out.push_str(&format!("\nthe run ended early: {error}\n"));
    }
    out.push_str("\nmedians over repeats:\n");
    if let Value::Object(targets) = &report["summary"]["median"] {
        for (name, values) in targets {
            out.push_str(&format!("  {name}: {values}\n"));
        }
    }
    if let Value::Object(ratios) = &report["summary"]["ratios"] {
        for (pair, values) in ratios {
            out.push_str(&format!("  ratio {pair}: {values}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_has_the_size_and_carries_its_sequence() {
        let body = payload(42, 256);
        assert_eq!(body.len(), 256);
        assert_eq!(sequences(&String::from_utf8_lossy(&body)), [42]);
    }

    #[test]
    fn sequences_are_found_in_joined_appends_in_order() {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&payload(7, 32)),
            String::from_utf8_lossy(&payload(8, 32))
        );
        assert_eq!(sequences(&text), [7, 8]);
        assert_eq!(sequences("seq=12"), Vec::<usize>::new());
    }

    #[test]
    fn targets_parse_host_port_and_prefix() {
        let t = Target::parse("a", "http://127.0.0.1:4437/base/", String::new()).unwrap();
        assert_eq!(t.authority, "127.0.0.1:4437");
        assert_eq!(t.path("r", "3"), "/base/v1/stream/bench-r-3");
        assert!(Target::parse("a", "https://x", String::new()).is_err());
    }

    #[test]
    fn a_writer_is_another_node_under_the_same_prefix() {
        let mut t = Target::parse("a", "http://127.0.0.1:4437/base", String::new()).unwrap();
        assert_eq!(t.writer, "127.0.0.1:4437", "by default the reader's node");
        t.write_through("http://127.0.0.1:4438/base/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.writer.as_str()),
            ("127.0.0.1:4437", "127.0.0.1:4438")
        );
        assert!(t
            .description
            .contains("through http://127.0.0.1:4438/base/"));
        assert!(t.write_through("http://127.0.0.1:4438/other").is_err());
    }

    #[test]
    fn events_split_across_chunks_are_taken_whole() {
        let mut buffer = String::from("event: data\ndata:seq=00000001;xx\n\nevent: con");
        let events = take_events(&mut buffer);
        assert_eq!(
            events,
            [SseEvent {
                kind: "data".into(),
                data: "seq=00000001;xx".into()
            }]
        );
        assert_eq!(buffer, "event: con");
        buffer.push_str("trol\r\ndata: {}\r\n\r\n");
        let events = take_events(&mut buffer);
        assert_eq!(events[0].kind, "control");
        assert_eq!(events[0].data, "{}");
        assert!(buffer.is_empty());
    }

    proptest::proptest! {
        /// Whatever a server sends, parsing never panics and never grows
        /// the buffer.
        #[test]
        fn any_bytes_parse_without_panic(chunks in proptest::collection::vec(".{0,64}", 0..8)) {
            let mut buffer = String::new();
            for chunk in chunks {
                buffer.push_str(&chunk);
                let before = buffer.len();
                for event in take_events(&mut buffer) {
                    let _ = sequences(&event.data);
                }
                proptest::prop_assert!(buffer.len() <= before);
            }
        }

        /// Data events carrying appends, cut into arbitrary chunks, give
        /// back every sequence once and in order.
        #[test]
        fn chunked_events_give_back_every_sequence(
            sequences_sent in proptest::collection::vec(0usize..100_000_000, 1..20),
            cuts in proptest::collection::vec(1usize..50, 1..40),
        ) {
            let mut wire = String::new();
            for s in &sequences_sent {
                wire.push_str("event: data\ndata:");
                wire.push_str(&String::from_utf8_lossy(&payload(*s, 40)));
                wire.push_str("\n\nevent: control\ndata:{\"upToDate\":true}\n\n");
            }
            let mut buffer = String::new();
            let mut got = Vec::new();
            let mut rest = wire.as_str();
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (chunk, tail) = rest.split_at((*cut).min(rest.len()));
                rest = tail;
                buffer.push_str(chunk);
                for event in take_events(&mut buffer) {
                    if event.kind == "data" {
                        got.extend(sequences(&event.data));
                    }
                }
            }
            proptest::prop_assert_eq!(got, sequences_sent);
            proptest::prop_assert!(buffer.is_empty());
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }

    #[test]
    fn rss_is_read_from_proc_status_in_bytes() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t3\n";
        assert_eq!(rss_of_status(status), (1024 * 1024, 2048 * 1024));
        assert_eq!(rss_of_status("Name:\tzombie\n"), (0, 0));
    }

    #[test]
    fn the_soft_open_file_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             63840                63840                processes\n\
                      Max open files            20000                40000                files\n";
        assert_eq!(open_files_limit(limits), Some(20_000));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(open_files_limit(unlimited), None);
        let own = std::fs::read_to_string("/proc/self/limits").unwrap();
        assert!(open_files_limit(&own).is_some_and(|n| n > 0), "{own}");
    }

    #[test]
    fn a_footprint_counts_this_process_and_every_file_per_part() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data/a/b")).unwrap();
        std::fs::write(dir.path().join("data/a/b/one"), vec![1u8; 10_000]).unwrap();
        std::fs::write(dir.path().join("data/two"), b"x").unwrap();
        std::fs::write(dir.path().join("server.log"), b"").unwrap();
        let started = Started {
            pid: std::process::id(),
            dir: dir.path().to_owned(),
        };
        let held = std::fs::File::open(dir.path().join("data/two")).unwrap();
        let footprint = Footprint::sample(&started).unwrap();
        drop(held);
        assert!(footprint.rss_bytes > 0 && footprint.rss_peak_bytes >= footprint.rss_bytes);
        assert!(footprint.open_files >= 4, "{footprint:?}");
        let (data_bytes, data_files) = footprint.disk["data"];
        assert_eq!(data_files, 2);
        assert!(data_bytes >= 10_000, "{footprint:?}");
        assert_eq!(footprint.disk["server.log"].1, 1);
        assert_eq!(footprint.disk_total().1, 3);
    }
}
