//! QUAIL-B for aisql.
