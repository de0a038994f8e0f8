//! One module per screen.

pub mod audit;
pub mod clients;
pub mod history;
pub mod overview;
pub mod rule_form;
pub mod rules;
