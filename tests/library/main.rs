//! Models from outside: one test binary (one link of the app) for the modules below, which share
//! the support code declared here once.
//!
//! Modules:
//! - `hub`: Downloading from the Hub into the model library, over real HTTP against a Hub-shaped
//!   server on 127.0.0.1 (tests/support/hub_server.rs) serving the default model's GGUF ...
//! - `hub_fit`: The fit verdict before a download
//! - `hub_hostile`: A hostile Hub on 127.0.0.1 (tests/support/hub_server.rs, its `Hostile` modes)
//!   against the real client
//! - `hub_import`: The library admits only models the engine can load, whether imported by path
//!   or pulled from a Hub on 127.0.0.1
//! - `model_refs`: Model references through the real binary
//! - `crash`: Nothing is lost on a crash
//! - `export`: `tpslab export` end to end

#[path = "../support/cli_bin.rs"]
mod cli_bin;
#[path = "../support/gui_wait.rs"]
mod gui_wait;
#[path = "../support/http_client.rs"]
mod http_client;
#[allow(dead_code)] // each module uses part of it
#[path = "../support/hub_fixtures.rs"]
mod hub_fixtures;
#[allow(dead_code)] // each module uses part of it
#[path = "../support/hub_server.rs"]
mod hub_server;
#[path = "../../engine/tests/support/split.rs"]
mod split;
#[path = "../../engine/tests/support/temp_dir.rs"]
mod temp_dir;
#[allow(dead_code)] // each module uses part of it
#[path = "../../engine/tests/support/tiny_model.rs"]
mod tiny_model;

mod crash;
mod export;
mod hub;
mod hub_fit;
mod hub_hostile;
mod hub_import;
mod model_refs;
