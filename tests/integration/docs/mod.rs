//! The documentation against the code: the generated API reference, the command-line page
//! against clap, every command example run as written, and every link resolving.

mod api;
mod change_map;
mod cli;
mod examples;
mod gateway_api;
mod links;
mod quick_start;
