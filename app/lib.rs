//! TPS Lab app.
