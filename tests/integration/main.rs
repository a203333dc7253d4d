//! The integration suite, in one binary (each test binary links the whole crate): the folders
//! mirror `src/`. Suites that need a process of their own or external programs stay apart:
//! `hostile` (resource limits), `nginx_proxy` (real nginx), `e2e` and `node`.

#[path = "../support/mod.rs"]
mod support;

mod architecture;
mod cli;
mod controller;
mod deploy;
mod docs;
mod proxy;
mod runtime;
mod spec;
mod webhook;
