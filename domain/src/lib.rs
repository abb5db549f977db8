//! The domain every service shares, pure: the site catalogue as a read model
//! ([`catalog`], folded from the log's events), catalogue files ([`catalog_file`]),
//! placement ([`placement`]), and the pricing formulas with the calendar-month split
//! ([`pricing`], [`period`]). The router places with it, the intake quotes with it, the
//! ledger bills with it and the site runner finds its site in it: the formula a bill
//! charges is the one an estimate used.
//!
//! The only reads are [`Catalog::catch_up`] and [`catalog_file::apply`], through the
//! `EventLog` trait the caller hands in; everything else is computation on values.

pub mod catalog;
pub mod catalog_file;
pub mod period;
pub mod placement;
pub mod pricing;
mod shape_index;
pub mod tenant_view;

pub use catalog::Catalog;
pub use period::{InvalidPeriod, Period};
