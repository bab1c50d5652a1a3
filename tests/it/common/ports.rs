//! Free loopback ports.

use std::net::TcpListener;

/// A loopback port nothing listens on right now. Another process may take it before the
/// caller binds it: starters retry with a new port when their process exits at once.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
