//! The `cellfleet` command-line tool.
fn main() {}
