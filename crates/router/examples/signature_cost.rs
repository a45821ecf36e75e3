//! What checking one envelope signature costs, alone and in batches, for
//! an instruction count (`scripts/signature-instructions.sh` runs this
//! under callgrind).
//!
//! Signs `N` distinct messages of 200 bytes with 16 keys, then checks
//! them: `sign` not at all (the baseline the script subtracts), `strict`
//! one by one with `verify_strict`, `batch B` in groups of `B` with
//! `signing::verify_many` (what a busy node's batch thread does). Every
//! signature must verify, or the run fails.
//!
//! ```text
//! signature_cost sign N
//! signature_cost strict N
//! signature_cost batch B N
//! ```

use cellfleet_router::signing::{self, Domain};
use ed25519_dalek::{Signature, SigningKey, VerifyingKey};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: signature_cost sign|strict N | signature_cost batch B N";
    let (check, batch, count) = match args.as_slice() {
        [mode, count] if mode == "sign" => (false, None, count.parse::<usize>()?),
        [mode, count] if mode == "strict" => (true, None, count.parse::<usize>()?),
        [mode, size, count] if mode == "batch" => (
            true,
            Some(size.parse::<usize>()?.max(1)),
            count.parse::<usize>()?,
        ),
        _ => return Err(usage.into()),
    };
    let keys: Vec<SigningKey> = (0u8..16)
        .map(|i| SigningKey::from_bytes(&[i + 1; 32]))
        .collect();
    let signed: Vec<(Vec<u8>, Signature, VerifyingKey)> = (0..count)
        .map(|i| {
            let key = &keys[i % keys.len()];
            let mut body = vec![0u8; 200];
            body[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let message = signing::signed_message(Domain::Command, &body);
            let signature = signing::sign(Domain::Command, &body, key);
            let signature = Signature::from_bytes(&signature);
            (message, signature, key.verifying_key())
        })
        .collect();
    if !check {
        println!("{} signatures made", signed.len());
        return Ok(());
    }
    let mut valid = 0usize;
    match batch {
        None => {
            for (message, signature, key) in &signed {
                valid += usize::from(key.verify_strict(message, signature).is_ok());
            }
        }
        Some(size) => {
            for group in signed.chunks(size) {
                let items: Vec<(&[u8], Signature, VerifyingKey)> = group
                    .iter()
                    .map(|(message, signature, key)| (message.as_slice(), *signature, *key))
                    .collect();
                valid += signing::verify_many(&items)
                    .into_iter()
                    .filter(|ok| *ok)
                    .count();
            }
        }
    }
    if valid != count {
        return Err(format!("{valid} of {count} signatures verified").into());
    }
    println!("{count} signatures verified");
    Ok(())
}
