//! Ingress of a Cellfleet node (being written).
