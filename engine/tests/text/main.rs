//! Text in and out of the model: tokenizers, chat templates, stops, reasoning, constraints: one
//! test binary (one link) for the modules below, which share the support code declared here once.
//!
//! Modules (the render server's test has a binary of its own: starting the server changes how
//! every later render in the process runs):
//! - `chat_template`: Chat template rendering against Hugging Face's reference renderer
//! - `detok`: Incremental detokenizer on the real SmolLM2 tokenizer: streaming equals a full
//!   decode, and text the tokenizer encoded never streams out a broken character
//! - `hf_tokenizer`: Hugging Face folders whose tokenizer.json is not byte-level BPE, encoded by
//!   the file's own pipeline (the `tokenizers` crate): SentencePiece-style byte-fallback ...
//! - `reasoning`: The reasoning splitter: what a thinking model writes is split into reasoning
//!   and answer the same way whole and streamed in any pieces (tags cut across tokens, one ...
//! - `stop`: Stop criteria: stop strings that span token boundaries (real tokenizer and arbitrary
//!   chunking), hold-back of possible stop-string prefixes, stop tokens and token limits
//! - `template_budget`: Runaway chat templates (a template is a program inside a model file) stop
//!   within a few seconds with one clear error naming the model and the limit, and leave ...
//! - `tokenizer`: Tokenizer parity with llama.cpp on the real default model
//!   (SmolLM2-135M-Instruct), plus metadata validation and pre-tokenizer behaviour on small hand-
//!   made ...
//! - `tool_templates`: Tool calls through the real chat templates (llama.cpp's models/templates/,
//!   the ones tests/data/chat_templates.json was made from, plus Mistral Small 3.2 for ...
//! - `constraint`: Structured output in the engine on the real default model: the 20 schemas of
//!   `tests/data/schemas/` through one batch (greedy and sampled), every output validated ...

#[path = "../support/default_model.rs"]
mod default_model;
#[path = "../../../tests/support/llamacpp.rs"]
mod llamacpp;
#[path = "../support/temp_dir.rs"]
mod temp_dir;
#[allow(dead_code)] // each module uses part of it
#[path = "../support/tiny_model.rs"]
mod tiny_model;

mod chat_template;
mod constraint;
mod detok;
mod hf_tokenizer;
mod reasoning;
mod stop;
mod template_budget;
mod tokenizer;
mod tool_templates;
