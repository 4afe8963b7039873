//! Parser and detection tests.
