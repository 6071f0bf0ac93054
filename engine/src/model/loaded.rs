//! A loaded model bundle: the model with its tokenizer, chat template and precision, as every
//! front end (window, CLI, server, engine) holds it.

use std::path::{Path, PathBuf};

use crate::formats::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::precision::Precision;
use crate::model::{Model, ModelError};
use crate::text::chat::{ChatError, ChatMessage, ChatTemplate, RenderOptions};
use crate::text::tokenizer::{TEXT_MARK, Tokenizer, TokenizerError};

/// Why a model bundle could not be loaded, or a prompt not built from it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// A prompt whose text alone is more tokens than the context holds: refused before it is
    /// tokenized (tokenizing costs ~140 bytes of memory a byte of text).
    #[error(
        "the prompt is {bytes} bytes of text, at least {tokens} tokens, past the model's \
         context of {context} tokens"
    )]
    PastContext {
        bytes: usize,
        tokens: usize,
        context: usize,
    },
}

/// Everything needed to turn text into tokens and tokens into logits.
pub struct LoadedModel {
    pub path: PathBuf,
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Weight precision of the matrices: the file's dominant type ("Q4_1"), or what a synthetic
    /// model or a re-quantization was built with.
    pub precision: Precision,
}

impl std::fmt::Debug for LoadedModel {
    /// A summary: the weights and vocabulary are far too large to print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("path", &self.path)
            .field("arch", &self.model.cfg.arch)
            .field("precision", &self.precision)
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let mut file = GgufFile::open(path).map_err(ModelError::from)?;
        let cfg = ModelConfig::from_gguf(&file).map_err(ModelError::from)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file, &tokenizer)?;
        // The vocabulary and merges (~100k strings) are in the tokenizer now; freeing them and
        // the tokenizer's build-time garbage before the weights arrive keeps the peak RSS down.
        file.metadata
            .retain(|k, _| !k.starts_with("tokenizer.ggml."));
        release_free_memory();
        let model = Model::from_file(&file, cfg)?;
        release_free_memory();
        // A file that loaded has matrices the kernels run; were its dominant type one they
        // don't (tensors the model never reads), the embedding's type stands in.
        let precision = Precision::of_file(&file).unwrap_or_else(|| model.weights.embed.ty.into());
        Ok(Self {
            path: path.to_path_buf(),
            model,
            tokenizer,
            template,
            precision,
        })
    }

    /// Prompt tokens for raw text: no template, BOS only if the model's metadata asks for it.
    pub fn raw_prompt(&self, text: &str) -> Result<Vec<u32>, LoadError> {
        self.check_fits(text.len())?;
        Ok(self.tokenizer.encode_prompt(text, false)?)
    }

    /// Prompt tokens for a conversation, through the model's chat template with the options of a
    /// conversation nobody configured ([`RenderOptions::conversation`], as the server and the
    /// window render).
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, LoadError> {
        Ok(self
            .chat_tokens(messages, &RenderOptions::conversation())?
            .1)
    }

    /// A conversation rendered by the model's template and tokenized: the text (for the
    /// answer's reasoning splitter) and its tokens. Control tokens count only where the
    /// template wrote them: the messages of users and tools, and the documents, are text even
    /// where they spell one ([`Tokenizer::escape_control`]). The template writes BOS itself
    /// where the model wants one. Blocking: the render may take up to its time limit.
    pub fn chat_tokens(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<(String, Vec<u32>), LoadError> {
        let tok = &self.tokenizer;
        let messages: Vec<ChatMessage> = messages
            .iter()
            .map(|m| match &m.content {
                Some(c) if !speaks_for_the_template(&m.role) => ChatMessage {
                    content: Some(tok.escape_control(c).into_owned()),
                    ..m.clone()
                },
                _ => m.clone(),
            })
            .collect();
        let mut opts = opts.clone();
        if let Some(docs) = &mut opts.documents {
            docs.iter_mut().for_each(|d| escape_strings(tok, d));
        }
        let text = self.template.render_with(&messages, &opts)?;
        let marks = text.matches(TEXT_MARK).count() * TEXT_MARK.len_utf8();
        self.check_fits(text.len() - marks)?;
        let tokens = tok.encode_chat(&text)?;
        Ok((text, tokens))
    }

    /// The budget of a text about to be tokenized: one that could only be more tokens than the
    /// context holds (its bytes over the longest token's) is refused unread.
    pub fn check_fits(&self, bytes: usize) -> Result<(), LoadError> {
        let tokens = bytes / self.tokenizer.max_token_bytes();
        let context = self.model.cfg.context_len;
        if tokens > context {
            return Err(LoadError::PastContext {
                bytes,
                tokens,
                context,
            });
        }
        Ok(())
    }
}

/// Roles whose text is the application's or the model's own (system prompts, earlier answers
/// as they were generated), kept as written; every other role's text is escaped.
fn speaks_for_the_template(role: &str) -> bool {
    matches!(role, "system" | "developer" | "assistant")
}

/// Escapes every string inside a JSON value (a document), in place.
fn escape_strings(tok: &Tokenizer, v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => {
            if let std::borrow::Cow::Owned(e) = tok.escape_control(s) {
                *s = e;
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| escape_strings(tok, x)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| escape_strings(tok, x)),
        _ => {}
    }
}

/// Hands freed heap memory back to the OS (glibc keeps it otherwise, and it counts as resident):
/// called after loading a model, whose parsing leaves tens of MB of freed buffers behind.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: malloc_trim only returns free heap pages to the OS; it has no preconditions.
        unsafe {
            malloc_trim(0);
        }
    }
}
