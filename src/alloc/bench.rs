//! Allocation benchmark (placeholder).
