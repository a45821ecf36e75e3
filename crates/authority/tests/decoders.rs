//! Decoders of untrusted bytes (roots, leases) return typed errors, never panic, and only accept records that validate.

use cellfleet_authority::lease::acquire_record;
use cellfleet_authority::transition::{self, Holder, NewCell};
use cellfleet_authority::{
    CellId, Endpoints, LeaseConfig, LeaseRecord, LtxRef, NodeId, RootRecord, SessionId, Txid,
};
use proptest::prelude::*;

fn valid_root() -> RootRecord {
    let me = Holder {
        node: NodeId::new("n1").unwrap(),
        session: SessionId::from_u128(5),
    };
    let new = NewCell {
        cell_id: CellId::for_kind_key("kv", b"k"),
        kind: "kv".into(),
        key: Some("k".into()),
        page_size: 4096,
        schema_version: 1,
    };
    let root = transition::create(&new, &me, 10);
    let delta = LtxRef {
        key: format!("p/cells/{}/ltx/0000000000000001/a.ltx", new.cell_id),
        min_txid: Txid(1),
        max_txid: Txid(3),
        size: 10,
        file_checksum: 1,
        post_apply_checksum: 2,
    };
    transition::publish(&root, &me, root.epoch, delta, 11).unwrap()
}

fn valid_lease() -> LeaseRecord {
    acquire_record(
        None,
        NodeId::new("n1").unwrap(),
        SessionId::from_u128(5),
        Endpoints {
            grpc: "https://127.0.0.1:1".into(),
            peer: "https://127.0.0.1:3".into(),
            http: "http://127.0.0.1:2".into(),
        },
        1_000,
        &LeaseConfig::default(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn root_decoder_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(root) = RootRecord::decode(&bytes) {
            prop_assert!(root.validate().is_ok());
        }
    }

    #[test]
    fn lease_decoder_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(lease) = LeaseRecord::decode(&bytes) {
            prop_assert!(lease.validate().is_ok());
        }
    }

    /// Mutated valid records: either refused, or a record that validates and
    /// re-encodes to something that decodes to the same record.
    #[test]
    fn mutated_roots_are_refused_or_valid(position in any::<prop::sample::Index>(), byte in any::<u8>(), truncate in any::<bool>()) {
        let mut bytes = valid_root().encode().unwrap();
        let at = position.index(bytes.len());
        if truncate { bytes.truncate(at) } else { bytes[at] = byte }
        if let Ok(root) = RootRecord::decode(&bytes) {
            let again = root.encode().expect("a decoded root encodes");
            prop_assert_eq!(RootRecord::decode(&again).unwrap(), root);
        }
    }

    #[test]
    fn mutated_leases_are_refused_or_valid(position in any::<prop::sample::Index>(), byte in any::<u8>(), truncate in any::<bool>()) {
        let mut bytes = valid_lease().encode().unwrap();
        let at = position.index(bytes.len());
        if truncate { bytes.truncate(at) } else { bytes[at] = byte }
        if let Ok(lease) = LeaseRecord::decode(&bytes) {
            let again = lease.encode().expect("a decoded lease encodes");
            prop_assert_eq!(LeaseRecord::decode(&again).unwrap(), lease);
        }
    }
}

#[test]
fn valid_records_decode() {
    let root = valid_root();
    assert_eq!(RootRecord::decode(&root.encode().unwrap()).unwrap(), root);
    let lease = valid_lease();
    assert_eq!(
        LeaseRecord::decode(&lease.encode().unwrap()).unwrap(),
        lease
    );
    assert!(RootRecord::decode(b"").is_err());
    assert!(LeaseRecord::decode(b"null").is_err());
}
