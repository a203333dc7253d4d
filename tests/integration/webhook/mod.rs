//! The HTTPS webhook server over real sockets: admission and the server's limits (`server`), and
//! conversion.

mod conversion;
mod server;
