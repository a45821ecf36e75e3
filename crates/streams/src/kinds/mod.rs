//! The Rust kinds the streams service runs on: [`stream`] (one Cell per stream), [`subscription`] (one per subscription) and [`registry`] (the one Cell naming every subscription).

pub mod registry;
pub mod stream;
pub mod subscription;
