//! Text in and out of a model: its tokenizer, the incremental detokenizer, and chat templates.
//!
//! Modules:
//! - [`tokenizer`]: the model's tokenizer built from GGUF metadata as llama.cpp builds it
//!   (byte-level BPE or SentencePiece), over [`vocab`] (tokens, attributes, special ids),
//!   [`special`] (cutting special tokens out of text), [`bpe`] and [`spm`]; its metadata read
//!   and checked in `tokenizer_parts`, its error type in `tokenizer_error`; long text is encoded in pieces cut where the ids cannot change
//!   (`pieces`), so its memory follows the piece, not the prompt. A Hugging Face
//!   `tokenizer.json` that is not byte-level BPE is encoded by its own pipeline instead
//!   (`hf_model`, the `tokenizers` crate), over the same vocabulary and decoding.
//! - [`detok`]: incremental detokenizer that emits only complete UTF-8 text.
//! - [`chat`]: chat templates rendered with minijinja as Hugging Face transformers renders them,
//!   with what a render takes in `chat_message` (messages, tools, options), its `tojson` in
//!   `chat_json` and its clock in `chat_time`.
//! - [`reasoning`]: splits a thinking model's output into its reasoning and its answer as the
//!   tokens stream.
//! - [`tool_calls`]: finds the tool calls a model writes in its family's format (Hermes, Llama 3
//!   JSON, Mistral, gpt-oss's harmony in `tool_calls/harmony`) and splits them from the
//!   answer's text, whole or streamed.
//! - [`chat_budget`]: the budgets of a template render (fuel, output, time, memory) and the
//!   isolated render that enforces them (with its render server, `chat_zygote`).

pub(crate) mod bpe;
pub mod chat;
pub mod chat_budget;
mod chat_json;
mod chat_message;
mod chat_time;
pub mod detok;
pub(crate) mod hf_model;
mod pieces;
pub mod reasoning;
pub(crate) mod special;
pub(crate) mod spm;
pub mod tokenizer;
mod tokenizer_error;
pub(crate) mod tokenizer_parts;
pub mod tool_calls;
pub(crate) mod vocab;
