//! Property tests of the admission rules, the defaults, the AdmissionReview handling and the
//! conversion between API versions, over generated input (`strategies`).

mod conversion;
mod defaulting;
mod review;
mod strategies;
