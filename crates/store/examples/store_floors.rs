//! Benchmark placeholder.
fn main() {}
