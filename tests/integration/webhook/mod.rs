//! The HTTPS webhook server over real sockets.

mod server;
