//! The Cell behind each Durable Streams subscription: one `ds_subscription` Cell per subscription (its configuration, linked streams with their acknowledged offsets, and the current wake: generation, holder, token digest, deadline). The subscriptions that exist are in the registry ([`super::registry`]).
//!
//! Every decision about a wake is made inside the subscription's Cell, as
//! one command, so it is durable (published by the root CAS) before the
//! server acts on it, and two nodes can never both believe they hold the
//! same generation. Times and fresh identifiers come in the commands (the
//! engine never reads a clock or a random source).

use cellfleet_cell::{KindError, Limits, RejectCode, RustKind};
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

/// The per-subscription kind's name.
pub const SUBSCRIPTION_KIND: &str = "ds_subscription";

/// Streams one subscription may link.
pub const LINKS_MAX: usize = 1_000;

/// A subscription as configured by its creator (compared on re-create).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionConfig {
    /// `webhook` or `pull-wake`.
    #[serde(rename = "type")]
    pub kind: String,
    pub pattern: Option<String>,
    /// Explicit streams given at creation (relative paths).
    pub streams: Vec<String>,
    pub webhook_url: Option<String>,
    /// Relative path of the pull-wake stream.
    pub wake_stream: Option<String>,
    pub lease_ttl_ms: u64,
    pub description: Option<String>,
    /// `http://host/prefix/` the subscription was created through: the base of its callback URLs.
    pub base_url: String,
}

/// Fresh identifiers for a wake the command may start or a token it may grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fresh {
    pub wake_id: String,
    /// SHA-256 (hex) of the bearer token the server holds for this wake.
    pub token_hash: String,
}

/// One acknowledgement: the stream read up to (not including) `offset`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub path: String,
    pub offset: u64,
}

/// A linked stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub path: String,
    /// `glob` or `explicit`.
    pub link_type: String,
    /// Position acknowledged up to; `None`: nothing yet.
    pub acked: Option<u64>,
    /// Last tail seen; `None`: never seen (the stream may not exist).
    pub tail: Option<u64>,
}

impl Link {
    /// Whether the stream has data past the acknowledgement.
    pub fn pending(&self) -> bool {
        self.tail.unwrap_or(0) > self.acked.unwrap_or(0)
    }
}

/// The current wake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    pub generation: u64,
    pub wake_id: String,
    /// `idle`, `waking` (sent, not yet taken) or `live` (taken by `holder`, leased until `deadline_ms`).
    pub state: String,
    pub holder: Option<String>,
    pub deadline_ms: i64,
    /// Deliveries that went untaken in a row (backs off redelivery).
    pub failures: u64,
}

/// A subscription as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    pub config: SubscriptionConfig,
    pub links: Vec<Link>,
    pub wake: Wake,
}

/// `ds_subscription` commands.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum SubscriptionCommand {
    /// PUT: create, or confirm an equal configuration.
    Create {
        config: SubscriptionConfig,
    },
    Delete {},
    /// Explicit links (relative paths).
    AddStreams {
        paths: Vec<String>,
    },
    RemoveStream {
        path: String,
    },
    /// `path`'s tail is `tail` (a create or append was acknowledged); links it when `glob`.
    Observe {
        path: String,
        tail: u64,
        glob: bool,
        fresh: Fresh,
        now_ms: i64,
    },
    /// The webhook answered 2xx: the wake is live until the lease ends.
    Delivered {
        generation: u64,
        now_ms: i64,
    },
    /// The webhook answered `{"done": true}`: acknowledge the delivered snapshot and finish.
    SyncDone {
        generation: u64,
        snapshot: Vec<Ack>,
        fresh: Fresh,
        now_ms: i64,
    },
    /// A holder's callback or pull-wake ack.
    Ack {
        generation: u64,
        wake_id: String,
        token_hash: String,
        acks: Vec<Ack>,
        done: bool,
        tails: Vec<Ack>,
        fresh: Fresh,
        now_ms: i64,
    },
    /// A pull-wake worker takes the wake.
    Claim {
        worker: String,
        tails: Vec<Ack>,
        fresh: Fresh,
        now_ms: i64,
    },
    /// A pull-wake holder hands the wake back.
    Release {
        generation: u64,
        wake_id: String,
        token_hash: String,
        fresh: Fresh,
        now_ms: i64,
    },
    /// The wake at `generation` passed its deadline: wake again (a new generation) or go idle.
    Expire {
        generation: u64,
        fresh: Fresh,
        now_ms: i64,
    },
}

/// `ds_subscription` queries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum SubscriptionQuery {
    Get {},
}

/// What a `ds_subscription` command or query returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SubscriptionOutput {
    Found {
        subscription: Subscription,
    },
    Created {
        subscription: Subscription,
        created: bool,
    },
    Conflict,
    NotFound,
    Deleted,
    Done,
    TooManyLinks,
    /// Nothing to do.
    Unchanged,
    /// A wake started (or restarted): deliver it.
    Woke {
        subscription: Subscription,
    },
    /// Acknowledged; `woke` when a next wake started at once.
    Acked {
        next_wake: bool,
        woke: Option<Subscription>,
    },
    /// The generation or wake is not the current one.
    Fenced {
        generation: u64,
    },
    /// The bearer token is not this wake's.
    Unauthorized,
    /// An acknowledgement past the stream's tail, or of a stream not linked.
    InvalidAck {
        path: String,
    },
    Claimed {
        subscription: Subscription,
    },
    AlreadyClaimed {
        holder: String,
    },
    /// Nothing pending: no wake to claim.
    NothingToClaim,
    Released {
        woke: Option<Subscription>,
    },
}

fn reject(message: impl Into<String>) -> KindError {
    KindError::reject(RejectCode::BadParameters, message)
}

/// The subscription kind.
#[derive(Clone, Debug, Default)]
pub struct SubscriptionKind;

fn tables(conn: &Connection) -> Result<bool, KindError> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'config'",
        )?
        .query_row([], |r| r.get(0))?;
    Ok(n > 0)
}

fn load(conn: &Connection) -> Result<Option<Subscription>, KindError> {
    if !tables(conn)? {
        return Ok(None);
    }
    let config: Option<String> = conn
        .prepare_cached("SELECT json FROM config WHERE id = 1")?
        .query_row([], |r| r.get(0))
        .optional()?;
    let Some(config) = config else {
        return Ok(None);
    };
    let config: SubscriptionConfig =
        serde_json::from_str(&config).map_err(|e| reject(format!("stored config: {e}")))?;
    let mut links = Vec::new();
    let mut statement =
        conn.prepare_cached("SELECT path, link_type, acked, tail FROM links ORDER BY path")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        links.push(Link {
            path: row.get(0)?,
            link_type: row.get(1)?,
            acked: row.get::<_, Option<i64>>(2)?.map(|v| v as u64),
            tail: row.get::<_, Option<i64>>(3)?.map(|v| v as u64),
        });
    }
    let wake = conn
        .prepare_cached(
            "SELECT generation, wake_id, state, holder, deadline_ms, failures FROM wake WHERE id = 1",
        )?
        .query_row([], |r| {
            Ok(Wake {
                generation: r.get::<_, i64>(0)? as u64,
                wake_id: r.get(1)?,
                state: r.get(2)?,
                holder: r.get(3)?,
                deadline_ms: r.get(4)?,
                failures: r.get::<_, i64>(5)? as u64,
            })
        })?;
    Ok(Some(Subscription {
        config,
        links,
        wake,
    }))
}

fn token_hash(conn: &Connection) -> Result<Option<String>, KindError> {
    Ok(conn
        .prepare_cached("SELECT token_hash FROM wake WHERE id = 1")?
        .query_row([], |r| r.get(0))?)
}

fn save_wake(conn: &Connection, wake: &Wake, token_hash: Option<&str>) -> Result<(), KindError> {
    conn.execute(
        "UPDATE wake SET generation = ?1, wake_id = ?2, state = ?3, holder = ?4, deadline_ms = ?5, \
         failures = ?6, token_hash = ?7 WHERE id = 1",
        (
            wake.generation as i64,
            &wake.wake_id,
            &wake.state,
            &wake.holder,
            wake.deadline_ms,
            wake.failures as i64,
            token_hash,
        ),
    )?;
    Ok(())
}

fn link(conn: &Connection, path: &str, link_type: &str) -> Result<bool, KindError> {
    let count: i64 = conn
        .prepare_cached("SELECT count(*) FROM links")?
        .query_row([], |r| r.get(0))?;
    let exists: Option<String> = conn
        .prepare_cached("SELECT link_type FROM links WHERE path = ?1")?
        .query_row([path], |r| r.get(0))
        .optional()?;
    match exists {
        Some(existing) => {
            // An explicit link outranks a glob one (it survives pattern changes).
            if link_type == "explicit" && existing != "explicit" {
                conn.execute(
                    "UPDATE links SET link_type = 'explicit' WHERE path = ?1",
                    [path],
                )?;
            }
            Ok(true)
        }
        None if count as usize >= LINKS_MAX => Ok(false),
        None => {
            conn.execute(
                "INSERT INTO links (path, link_type, acked, tail) VALUES (?1, ?2, NULL, NULL)",
                (path, link_type),
            )?;
            Ok(true)
        }
    }
}

fn set_tail(conn: &Connection, path: &str, tail: u64) -> Result<(), KindError> {
    conn.execute(
        "UPDATE links SET tail = max(coalesce(tail, 0), ?2) WHERE path = ?1",
        (path, tail as i64),
    )?;
    Ok(())
}

fn pending(sub: &Subscription) -> bool {
    sub.links.iter().any(Link::pending)
}

/// How long an untaken delivery waits before the next one: 30 s doubling per failure, at most 15 min.
fn redelivery_ms(failures: u64) -> i64 {
    (30_000i64 << failures.min(5)).min(15 * 60_000)
}

/// Starts a new wake (the next generation) with `fresh`'s identifiers.
fn start(
    conn: &Connection,
    sub: &mut Subscription,
    fresh: &Fresh,
    failures: u64,
    now_ms: i64,
) -> Result<(), KindError> {
    let webhook = sub.config.kind == "webhook";
    sub.wake = Wake {
        generation: sub.wake.generation + 1,
        wake_id: fresh.wake_id.clone(),
        state: "waking".into(),
        holder: None,
        deadline_ms: now_ms + redelivery_ms(failures),
        failures,
    };
    // A webhook wake carries its token; a pull wake gets one when claimed.
    let token = webhook.then_some(fresh.token_hash.as_str());
    save_wake(conn, &sub.wake, token)
}

fn go_idle(conn: &Connection, sub: &mut Subscription) -> Result<(), KindError> {
    sub.wake.state = "idle".into();
    sub.wake.holder = None;
    sub.wake.failures = 0;
    save_wake(conn, &sub.wake, None)
}

fn apply_acks(
    conn: &Connection,
    sub: &mut Subscription,
    acks: &[Ack],
) -> Result<Option<String>, KindError> {
    for ack in acks {
        let Some(link) = sub.links.iter_mut().find(|l| l.path == ack.path) else {
            return Ok(Some(ack.path.clone()));
        };
        if ack.offset > link.tail.unwrap_or(0) {
            return Ok(Some(ack.path.clone()));
        }
        if link.acked.is_none_or(|a| ack.offset > a) {
            link.acked = Some(ack.offset);
            conn.execute(
                "UPDATE links SET acked = ?2 WHERE path = ?1",
                (&ack.path, ack.offset as i64),
            )?;
        }
    }
    Ok(None)
}

fn refresh_tails(
    conn: &Connection,
    sub: &mut Subscription,
    tails: &[Ack],
) -> Result<(), KindError> {
    for t in tails {
        if let Some(link) = sub.links.iter_mut().find(|l| l.path == t.path) {
            if link.tail.is_none_or(|old| t.offset > old) {
                link.tail = Some(t.offset);
                set_tail(conn, &t.path, t.offset)?;
            }
        }
    }
    Ok(())
}

/// Finishes the current wake after acknowledgements: idle, or a new wake at once when work is pending.
fn finish(
    conn: &Connection,
    mut sub: Subscription,
    fresh: &Fresh,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    if pending(&sub) {
        start(conn, &mut sub, fresh, 0, now_ms)?;
        Ok(SubscriptionOutput::Acked {
            next_wake: true,
            woke: Some(sub),
        })
    } else {
        go_idle(conn, &mut sub)?;
        Ok(SubscriptionOutput::Acked {
            next_wake: false,
            woke: None,
        })
    }
}

/// Equal configurations, whatever host each request came through.
fn same_settings(a: &SubscriptionConfig, b: &SubscriptionConfig) -> bool {
    let strip = |c: &SubscriptionConfig| SubscriptionConfig {
        base_url: String::new(),
        ..c.clone()
    };
    strip(a) == strip(b)
}

/// Whether `generation`/`wake_id` name the current, unfinished wake.
fn current(sub: &Subscription, generation: u64, wake_id: Option<&str>) -> bool {
    sub.wake.state != "idle"
        && sub.wake.generation == generation
        && wake_id.is_none_or(|w| w == sub.wake.wake_id)
}

/// The answer to a claim-holder's request (done, release) that does not
/// hold the current wake: `Fenced` from another generation or wake,
/// `Unauthorized` with another token; `None` when it holds it.
fn refuse_holder(
    conn: &Connection,
    sub: &Subscription,
    generation: u64,
    wake_id: &str,
    presented: &str,
) -> Result<Option<SubscriptionOutput>, KindError> {
    if !current(sub, generation, Some(wake_id)) {
        return Ok(Some(SubscriptionOutput::Fenced {
            generation: sub.wake.generation,
        }));
    }
    if token_hash(conn)?.as_deref() != Some(presented) {
        return Ok(Some(SubscriptionOutput::Unauthorized));
    }
    Ok(None)
}

/// Create: confirms an equal configuration, refuses another, or stores a
/// new subscription (keeping a deleted one's generation count).
fn create(conn: &Connection, config: &SubscriptionConfig) -> Result<SubscriptionOutput, KindError> {
    use SubscriptionOutput as Out;
    if let Some(sub) = load(conn)? {
        return Ok(if same_settings(&sub.config, config) {
            Out::Created {
                subscription: sub,
                created: false,
            }
        } else {
            Out::Conflict
        });
    }
    if config.streams.len() > LINKS_MAX {
        return Ok(Out::TooManyLinks);
    }
    conn.execute_batch("DELETE FROM config; DELETE FROM links;")?;
    let json = serde_json::to_string(config).map_err(|e| reject(e.to_string()))?;
    conn.execute("INSERT INTO config (id, json) VALUES (1, ?1)", [json])?;
    // A subscription created again under a deleted one's id keeps
    // counting generations, so the old holders stay fenced.
    conn.execute(
        "INSERT INTO wake (id, generation, wake_id, state, holder, deadline_ms, failures, token_hash) \
         VALUES (1, 0, '', 'idle', NULL, 0, 0, NULL) \
         ON CONFLICT (id) DO UPDATE SET wake_id = '', state = 'idle', holder = NULL, \
         deadline_ms = 0, failures = 0, token_hash = NULL",
        [],
    )?;
    for path in &config.streams {
        link(conn, path, "explicit")?;
    }
    let subscription = load(conn)?.ok_or_else(|| reject("not stored"))?;
    Ok(Out::Created {
        subscription,
        created: true,
    })
}

/// An acknowledged create or append of `path` up to `tail`: links it if
/// the subscription's pattern matches (`glob`), and starts a wake if the
/// subscription was idle with something now pending.
fn observe(
    conn: &Connection,
    sub: &Subscription,
    path: &str,
    tail: u64,
    glob: bool,
    fresh: &Fresh,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    use SubscriptionOutput as Out;
    // A subscription is never woken by its own wake events.
    if sub.config.wake_stream.as_deref() == Some(path) {
        return Ok(Out::Unchanged);
    }
    let linked = sub.links.iter().any(|l| l.path == path);
    if !(linked || (glob && link(conn, path, "glob")?)) {
        return Ok(Out::Unchanged);
    }
    set_tail(conn, path, tail)?;
    let mut sub = load(conn)?.ok_or_else(|| reject("vanished"))?;
    if sub.wake.state == "idle" && pending(&sub) {
        start(conn, &mut sub, fresh, 0, now_ms)?;
        return Ok(Out::Woke { subscription: sub });
    }
    Ok(Out::Unchanged)
}

/// Who a callback says it is: the wake it answers and its bearer token's
/// digest.
struct Holder<'a> {
    generation: u64,
    wake_id: &'a str,
    presented: &'a str,
}

impl<'a> Holder<'a> {
    fn new(generation: u64, wake_id: &'a str, presented: &'a str) -> Self {
        Holder {
            generation,
            wake_id,
            presented,
        }
    }
}

/// A holder's acknowledgements (webhook callback or pull-wake ack):
/// checked against the current wake, applied, and either the wake finished
/// (`done`) or its lease renewed.
#[allow(clippy::too_many_arguments)]
fn ack(
    conn: &Connection,
    mut sub: Subscription,
    holder: Holder<'_>,
    acks: &[Ack],
    done: bool,
    tails: &[Ack],
    fresh: &Fresh,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    use SubscriptionOutput as Out;
    let Holder {
        generation,
        wake_id,
        presented,
    } = holder;
    if let Some(refused) = refuse_holder(conn, &sub, generation, wake_id, presented)? {
        return Ok(refused);
    }
    refresh_tails(conn, &mut sub, tails)?;
    if let Some(path) = apply_acks(conn, &mut sub, acks)? {
        return Ok(Out::InvalidAck { path });
    }
    if done {
        return finish(conn, sub, fresh, now_ms);
    }
    // Any callback from the holder renews its lease.
    sub.wake.state = "live".into();
    sub.wake.deadline_ms = now_ms + sub.config.lease_ttl_ms as i64;
    save_wake(conn, &sub.wake, Some(presented))?;
    Ok(Out::Acked {
        next_wake: false,
        woke: None,
    })
}

/// A pull-wake worker's claim: refused while another's lease is live;
/// otherwise the worker holds the waking wake, fences a lapsed holder, or
/// starts a wake if something is pending.
fn claim(
    conn: &Connection,
    mut sub: Subscription,
    worker: String,
    tails: &[Ack],
    fresh: &Fresh,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    use SubscriptionOutput as Out;
    refresh_tails(conn, &mut sub, tails)?;
    let held = sub.wake.state == "live" && sub.wake.deadline_ms > now_ms;
    if held {
        return Ok(Out::AlreadyClaimed {
            holder: sub.wake.holder.clone().unwrap_or_default(),
        });
    }
    match sub.wake.state.as_str() {
        // An unclaimed wake keeps its generation: its first holder.
        "waking" => {}
        // A lapsed lease: the next holder fences the last one.
        "live" => {
            sub.wake.generation += 1;
            sub.wake.wake_id = fresh.wake_id.clone();
        }
        _ if pending(&sub) => {
            start(conn, &mut sub, fresh, 0, now_ms)?;
        }
        _ => return Ok(Out::NothingToClaim),
    }
    sub.wake.state = "live".into();
    sub.wake.holder = Some(worker);
    sub.wake.failures = 0;
    sub.wake.deadline_ms = now_ms + sub.config.lease_ttl_ms as i64;
    save_wake(conn, &sub.wake, Some(&fresh.token_hash))?;
    Ok(Out::Claimed { subscription: sub })
}

/// A wake's deadline passed: an untaken delivery is retried with backoff,
/// a lapsed lease wakes again at once, and with nothing pending the
/// subscription goes idle.
fn expire(
    conn: &Connection,
    mut sub: Subscription,
    generation: u64,
    fresh: &Fresh,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    use SubscriptionOutput as Out;
    if !current(&sub, generation, None) || sub.wake.deadline_ms > now_ms {
        return Ok(Out::Unchanged);
    }
    if pending(&sub) {
        // Untaken deliveries back off; a lapsed live lease wakes again at once.
        let failures = if sub.wake.state == "waking" {
            sub.wake.failures + 1
        } else {
            0
        };
        start(conn, &mut sub, fresh, failures, now_ms)?;
        Ok(Out::Woke { subscription: sub })
    } else {
        go_idle(conn, &mut sub)?;
        Ok(Out::Unchanged)
    }
}

/// A webhook delivery of the current generation was accepted: the wake
/// is live until the lease runs out.
fn delivered(
    conn: &Connection,
    mut sub: Subscription,
    generation: u64,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    if current(&sub, generation, None) && sub.wake.state == "waking" {
        sub.wake.state = "live".into();
        sub.wake.failures = 0;
        sub.wake.deadline_ms = now_ms + sub.config.lease_ttl_ms as i64;
        let token = token_hash(conn)?;
        save_wake(conn, &sub.wake, token.as_deref())?;
    }
    Ok(SubscriptionOutput::Done)
}

/// A webhook handler finished: its acknowledgements (of streams still
/// linked) apply, then the subscription wakes again or goes idle.
fn sync_done(
    conn: &Connection,
    mut sub: Subscription,
    generation: u64,
    snapshot: Vec<Ack>,
    fresh: &Fresh,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    if !current(&sub, generation, None) {
        return Ok(SubscriptionOutput::Fenced {
            generation: sub.wake.generation,
        });
    }
    // Streams unlinked meanwhile are skipped, not refused.
    let snapshot: Vec<Ack> = snapshot
        .into_iter()
        .filter(|a| sub.links.iter().any(|l| l.path == a.path))
        .collect();
    apply_acks(conn, &mut sub, &snapshot)?;
    finish(conn, sub, fresh, now_ms)
}

/// The holder hands its wake back: a new generation for the next holder
/// if work is pending, else idle.
fn release(
    conn: &Connection,
    mut sub: Subscription,
    holder: Holder<'_>,
    fresh: &Fresh,
    now_ms: i64,
) -> Result<SubscriptionOutput, KindError> {
    if let Some(refused) = refuse_holder(
        conn,
        &sub,
        holder.generation,
        holder.wake_id,
        holder.presented,
    )? {
        return Ok(refused);
    }
    if pending(&sub) {
        // Handed back: a new generation for the next holder.
        start(conn, &mut sub, fresh, 0, now_ms)?;
        Ok(SubscriptionOutput::Released { woke: Some(sub) })
    } else {
        go_idle(conn, &mut sub)?;
        Ok(SubscriptionOutput::Released { woke: None })
    }
}

/// Deletes the subscription: its configuration and links go, and the wake
/// is left idle with no holder or token, so nothing held can act on it.
fn delete(conn: &Connection) -> Result<SubscriptionOutput, KindError> {
    conn.execute_batch(
        "DELETE FROM config; DELETE FROM links; \
         UPDATE wake SET state = 'idle', holder = NULL, token_hash = NULL;",
    )?;
    Ok(SubscriptionOutput::Deleted)
}

/// Links `paths` explicitly (an existing glob link becomes explicit),
/// refusing the command at the first new link past [`LINKS_MAX`].
fn add_streams(conn: &Connection, paths: &[String]) -> Result<SubscriptionOutput, KindError> {
    for path in paths {
        if !link(conn, path, "explicit")? {
            return Err(KindError::reject(
                RejectCode::BadParameters,
                "too many linked streams",
            ));
        }
    }
    Ok(SubscriptionOutput::Done)
}

/// Unlinks the stream at `path` (its acknowledged offset goes with it).
fn remove_stream(conn: &Connection, path: &str) -> Result<SubscriptionOutput, KindError> {
    conn.execute("DELETE FROM links WHERE path = ?1", [path])?;
    Ok(SubscriptionOutput::Done)
}

impl SubscriptionKind {
    fn run(
        conn: &Connection,
        command: SubscriptionCommand,
    ) -> Result<SubscriptionOutput, KindError> {
        use SubscriptionOutput as Out;
        if let SubscriptionCommand::Create { config } = &command {
            return create(conn, config);
        }
        let Some(sub) = load(conn)? else {
            return Ok(Out::NotFound);
        };
        match command {
            SubscriptionCommand::Create { .. } => Ok(Out::NotFound),
            SubscriptionCommand::Delete {} => delete(conn),
            SubscriptionCommand::AddStreams { paths } => add_streams(conn, &paths),
            SubscriptionCommand::RemoveStream { path } => remove_stream(conn, &path),
            SubscriptionCommand::Observe {
                path,
                tail,
                glob,
                fresh,
                now_ms,
            } => observe(conn, &sub, &path, tail, glob, &fresh, now_ms),
            SubscriptionCommand::Delivered { generation, now_ms } => {
                delivered(conn, sub, generation, now_ms)
            }
            SubscriptionCommand::SyncDone {
                generation,
                snapshot,
                fresh,
                now_ms,
            } => sync_done(conn, sub, generation, snapshot, &fresh, now_ms),
            SubscriptionCommand::Ack {
                generation,
                wake_id,
                token_hash: presented,
                acks,
                done,
                tails,
                fresh,
                now_ms,
            } => ack(
                conn,
                sub,
                Holder::new(generation, &wake_id, &presented),
                &acks,
                done,
                &tails,
                &fresh,
                now_ms,
            ),
            SubscriptionCommand::Claim {
                worker,
                tails,
                fresh,
                now_ms,
            } => claim(conn, sub, worker, &tails, &fresh, now_ms),
            SubscriptionCommand::Release {
                generation,
                wake_id,
                token_hash: presented,
                fresh,
                now_ms,
            } => release(
                conn,
                sub,
                Holder::new(generation, &wake_id, &presented),
                &fresh,
                now_ms,
            ),
            SubscriptionCommand::Expire {
                generation,
                fresh,
                now_ms,
            } => expire(conn, sub, generation, &fresh, now_ms),
        }
    }
}

impl RustKind for SubscriptionKind {
    type Command = SubscriptionCommand;
    type Query = SubscriptionQuery;
    type Output = SubscriptionOutput;

    fn name(&self) -> &str {
        SUBSCRIPTION_KIND
    }

    fn migrations(&self) -> Vec<String> {
        vec!["CREATE TABLE config (id INTEGER PRIMARY KEY CHECK (id = 1), json TEXT NOT NULL); \
              CREATE TABLE links (path TEXT PRIMARY KEY, link_type TEXT NOT NULL, acked INTEGER, tail INTEGER); \
              CREATE TABLE wake (id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL, \
              wake_id TEXT NOT NULL, state TEXT NOT NULL, holder TEXT, deadline_ms INTEGER NOT NULL, \
              failures INTEGER NOT NULL, token_hash TEXT)"
            .into()]
    }

    fn limits(&self) -> Limits {
        Limits {
            rows_max: 100_000,
            bytes_max: 8 << 20,
            statements_max: 64,
            payload_bytes_max: 1 << 20,
        }
    }

    fn execute(
        &self,
        conn: &Connection,
        command: SubscriptionCommand,
    ) -> Result<SubscriptionOutput, KindError> {
        Self::run(conn, command)
    }

    fn query(
        &self,
        conn: &Connection,
        query: SubscriptionQuery,
    ) -> Result<SubscriptionOutput, KindError> {
        match query {
            SubscriptionQuery::Get {} => Ok(match load(conn)? {
                Some(subscription) => SubscriptionOutput::Found { subscription },
                None => SubscriptionOutput::NotFound,
            }),
        }
    }
}
