//! What a spec means: every validation rule, and properties of defaulting, validation and
//! the admission review over generated input.

mod properties;
mod rules;
