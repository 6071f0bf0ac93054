//! The OpenAI-compatible server as a client sees it: one test binary (one link of the app) for the
//! modules below, which share the support code declared here once.
//!
//! Modules:
//! - `admission`: The engine's one admission check as each real client sees it, on the real
//!   default model
//! - `embeddings`: `/v1/embeddings` against llama-server's vectors, through the official
//!   OpenAI Python client and beside a streaming chat; bad requests refused by name
//! - `openai_python`: The server as the official OpenAI Python client sees it
//!   (tests/python/openai_check.py)
//! - `server`: `tpslab serve` over real HTTP on loopback, with the real default model
//! - `server_fuzz`: Fuzz tests (proptest, fixed seeds so CI runs the same cases every time)
//! - `server_hostile`: `tpslab serve` attacked as a hostile client would attack it, over real
//!   HTTP on loopback with the real default model
//! - `server_limits`: The server's limits over real HTTP on loopback with the real default model
//! - `server_reasoning`: Reasoning over HTTP
//! - `server_responses`: `/v1/responses` through real HTTP to `tpslab serve` on the real default
//!   model
//! - `server_sampling`: The sampling side of the OpenAI API over real HTTP with the real default
//!   model
//! - `server_template`: Copies of the default model with other metadata, behind the real server
//!   over loopback
//! - `server_tools`: Tool calls through real HTTP to `tpslab serve` on the real default model
//!   (SmolLM2-135M)
//! - `structured`: Structured output through real HTTP to `tpslab serve` on the real default
//!   model

#[path = "../support/http_client.rs"]
mod http_client;
#[path = "../support/llamacpp.rs"]
mod llamacpp;
#[path = "../support/runaway.rs"]
mod runaway;

mod admission;
mod embeddings;
mod openai_python;
mod server;
mod server_fuzz;
mod server_hostile;
mod server_limits;
mod server_reasoning;
mod server_responses;
mod server_sampling;
mod server_template;
mod server_tools;
mod structured;
