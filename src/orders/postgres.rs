//! A [`Handler`](super::Handler) that writes orders into PostgreSQL, one row per request id.
