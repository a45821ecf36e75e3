//! The LTX file format.
