//! A canary that runs itself, as pure decisions: each step's gates judged on what the proxy
//! pods measured ([`gates`]), the step machine ([`progress`]) and the weights it puts on the
//! wire ([`split`]). The controller feeds them what it observed and writes what they decide.

pub mod gates;
pub mod progress;
pub mod split;
