//! Envelope signatures checked in batches while requests arrive together.
//!
//! A signature that finds no other being checked is checked at once, on
//! the caller's task, so an idle node adds no hop. One that arrives while
//! others are in flight is handed to one thread, which checks whatever has
//! queued in one call of [`signing::verify_many`]: per signature, 0.79 of
//! `verify_strict`'s instructions in pairs, 0.53 by 8, 0.45 by 64
//! (`scripts/signature-instructions.sh`), with its verdict on every
//! signature `verify_strict` accepts (see there for the one difference).
//! When more than a full batch is already in flight, a caller checks its
//! own, so the one thread never caps a node with many cores.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};

use ed25519_dalek::{Signature, VerifyingKey};
use tokio::sync::oneshot;

use crate::signing;

/// Most signatures checked in one batch (more wait for the next one).
pub const BATCH_SIGNATURES_MAX: usize = 64;

/// One signature waiting for the batch thread.
struct Job {
    message: Vec<u8>,
    signature: Signature,
    key: VerifyingKey,
    verdict: oneshot::Sender<bool>,
}

/// The batching of one verifier (its clones share it).
#[derive(Clone, Debug, Default)]
pub struct SignatureBatches {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Signatures being checked now, inline or queued.
    in_flight: AtomicUsize,
    /// Signatures the batch thread checked two or more at a time.
    batched: Arc<AtomicU64>,
    /// The batch thread's queue, started on first need; the thread ends
    /// when this (the last sender) is dropped.
    queue: OnceLock<Option<Sender<Job>>>,
}

/// Counts a signature in flight until dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SignatureBatches {
    /// Batching that counts the signatures it checks in batches into
    /// `batched`.
    pub fn counting_into(batched: Arc<AtomicU64>) -> Self {
        SignatureBatches {
            shared: Arc::new(Shared {
                batched,
                ..Shared::default()
            }),
        }
    }

    /// Whether `signature` over `message` is valid under `key`.
    pub async fn check(&self, message: Vec<u8>, signature: Signature, key: VerifyingKey) -> bool {
        let others = self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let _in_flight = InFlight(&self.shared.in_flight);
        let strict = |message: &[u8], signature: &Signature, key: &VerifyingKey| {
            key.verify_strict(message, signature).is_ok()
        };
        // Alone: no batch to join. Past a full batch waiting: the thread is
        // saturated, and checking here uses the caller's core (a node with
        // many cores keeps verifying in parallel).
        if others == 0 || others > BATCH_SIGNATURES_MAX {
            return strict(&message, &signature, &key);
        }
        let Some(queue) = self.queue() else {
            return strict(&message, &signature, &key);
        };
        let (verdict, answer) = oneshot::channel();
        let job = Job {
            message,
            signature,
            key,
            verdict,
        };
        match queue.send(job) {
            Ok(()) => answer.await.unwrap_or(false),
            // The thread is gone (it never panics; this is defensive):
            // check here, from the job handed back.
            Err(mpsc::SendError(job)) => strict(&job.message, &job.signature, &job.key),
        }
    }

    fn queue(&self) -> Option<&Sender<Job>> {
        self.shared
            .queue
            .get_or_init(|| {
                let (sender, receiver) = mpsc::channel();
                let batched = self.shared.batched.clone();
                std::thread::Builder::new()
                    .name("cellfleet-signatures".into())
                    .spawn(move || check_batches(&receiver, &batched))
                    .ok()
                    .map(|_| sender)
            })
            .as_ref()
    }
}

/// The batch thread: takes what has queued (at most
/// [`BATCH_SIGNATURES_MAX`]), checks it in one call, answers each.
fn check_batches(queue: &Receiver<Job>, batched: &AtomicU64) {
    while let Ok(first) = queue.recv() {
        let mut jobs = vec![first];
        while jobs.len() < BATCH_SIGNATURES_MAX {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let items: Vec<(&[u8], Signature, VerifyingKey)> = jobs
            .iter()
            .map(|job| (job.message.as_slice(), job.signature, job.key))
            .collect();
        let verdicts = signing::verify_many(&items);
        if items.len() > 1 {
            batched.fetch_add(items.len() as u64, Ordering::Relaxed);
        }
        for (job, valid) in jobs.into_iter().zip(verdicts) {
            let _ = job.verdict.send(valid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    /// Many concurrent checks, valid and damaged: each gets its own
    /// verdict, whether it was checked alone or in a batch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_checks_each_get_their_own_verdict() {
        let batches = SignatureBatches::default();
        let mut tasks = Vec::new();
        for i in 0u8..200 {
            let batches = batches.clone();
            tasks.push(tokio::spawn(async move {
                let key = SigningKey::from_bytes(&[i; 32]);
                let message = vec![i; 40];
                let mut signature = key.sign(&message).to_bytes();
                let damaged = i % 3 == 0;
                if damaged {
                    signature[usize::from(i) % 64] ^= 0x10;
                }
                let valid = batches
                    .check(
                        message,
                        Signature::from_bytes(&signature),
                        key.verifying_key(),
                    )
                    .await;
                (damaged, valid)
            }));
        }
        for task in tasks {
            let (damaged, valid) = task.await.expect("task");
            assert_eq!(valid, !damaged);
        }
        assert_eq!(batches.shared.in_flight.load(Ordering::Acquire), 0);
        // 200 tasks on two threads: some found others in flight.
        assert!(batches.shared.batched.load(Ordering::Relaxed) > 0);
    }
}
