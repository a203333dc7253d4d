//! The HTTPS webhooks: validating and mutating admission, and conversion between the API
//! versions. Review handling is transport-free (the server, the benches and the CLI share it);
//! the server adds the body limits and the routes.

pub mod admission;
mod body;
mod budget;
pub mod conversion;
pub(crate) mod metrics;
pub mod review;
mod server;

pub use body::Refusal;
pub(crate) use budget::Budget;
pub use server::Limits;
pub(crate) use server::{AppState, WebhookService};
