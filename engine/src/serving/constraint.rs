//! Structured output: a grammar (JSON schema, regex, Lark, GBNF) compiled by llguidance against
//! this engine's own vocabulary, and the per-request run that masks each logits row and
//! advances with each committed token, its next mask computed on a worker pool while the next
//! forward pass runs.
//!
//! One [`Compiler`] per loaded model ([`compiler_for`] caches it by tokenizer): the token trie
//! holds each token's bytes as the detokenizer produces them, control tokens behind llguidance's
//! `0xFF` marker so no grammar text can match them, and the model's end-of-generation tokens as
//! its EOS set. A [`Constraint`] is one compiled grammar, ready to run; front ends compile it
//! before submitting (a bad grammar is the request's error, never the engine's) and put it in
//! [`crate::serving::engine::Request::constraint`].
//!
//! Budgets: llguidance's [`ParserLimits`] bound the compile (lexer fuel, grammar size, lexer
//! states) and every mask (step fuel, Earley items), so a hostile schema fails with a message
//! instead of stalling the engine; panics inside the library are caught by it and come back as
//! errors.
//!
//! Stack: llguidance compiles a chain of references (`$ref` to `$ref`, rule to rule) by
//! recursion, about 3.4 KiB of stack a link, so a few hundred links in a 20 KB body overflowed
//! a 2 MiB thread and aborted the whole process. A grammar's structure (its brackets and
//! definitions, [`structure`]) bounds how deep that recursion can go: past
//! [`MAX_GRAMMAR_STRUCTURE`] the grammar is refused before compiling, and every compile runs on
//! a thread of its own whose stack ([`COMPILE_STACK`]) holds that bound with room to spare
//! (measured, and held by `engine/tests/text/constraint.rs` at the bound). Masks are computed by
//! llguidance's Earley parser without recursion: they run on the usual worker threads.
//!
//! Upstream report for llguidance 1.9.1 (written here because this project's machines cannot
//! reach GitHub; file it from one that can): (1) the Lark compiler recurses per rule link
//! (`lark/compiler.rs`: `do_rule` -> `do_expansions` -> `do_atom` -> `do_rule`), and the JSON
//! schema compiler per `$ref` link: `start: r0`, then `r{i}: r{i+1}` for i < 3000 and
//! `r3000: "a"`, overflows an 8 MiB stack and aborts the process; (2) integer and number bounds
//! go through a saturating `as i64` (`normalize_integer_bounds`, `rx_float_range`):
//! `{"type": "integer", "minimum": 1e30}` admits integers the schema excludes. This engine
//! refuses both before they reach the library ([`structure`], `check_bounds`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::sched::stop::FinishReason;
use crate::text::tokenizer::Tokenizer;

pub use super::gbnf::gbnf_to_lark;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON schema; `strict: false` lets llguidance ignore keywords it does not support
    /// instead of refusing the schema.
    JsonSchema { schema: Value, strict: bool },
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark dialect (vLLM's `guided_grammar`).
    Lark(String),
    /// A llama.cpp GBNF grammar (converted to Lark by [`gbnf_to_lark`]).
    Gbnf(String),
}

impl Grammar {
    /// The kind, as messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "json_object",
            Grammar::JsonSchema { .. } => "json_schema",
            Grammar::Regex(_) => "regex",
            Grammar::Lark(_) => "lark grammar",
            Grammar::Gbnf(_) => "GBNF grammar",
        }
    }

    /// Constrain to this JSON schema, strictly (the call other features use: a named tool's
    /// arguments, `tool_choice: required`).
    pub fn json_schema(schema: Value) -> Self {
        Grammar::JsonSchema {
            schema,
            strict: true,
        }
    }

    /// A grammar text: GBNF when it defines rules with `::=`, llguidance's Lark otherwise
    /// (vLLM's `guided_grammar` is GBNF under xgrammar and Lark under guidance; both are read).
    pub fn from_grammar_text(text: &str) -> Self {
        if text.contains("::=") {
            Grammar::Gbnf(text.to_string())
        } else {
            Grammar::Lark(text.to_string())
        }
    }

    fn to_llguidance(&self) -> Result<TopLevelGrammar, ConstraintError> {
        Ok(match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(json!({"type": "object"}), true))
            }
            Grammar::JsonSchema { schema, strict } => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(ConstraintError::Grammar(
                        "a JSON schema must be an object or a boolean".into(),
                    ));
                }
                check_bounds(schema)?;
                TopLevelGrammar::from_json_schema(compact(schema.clone(), *strict))
            }
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Gbnf(g) => TopLevelGrammar::from_lark(
                gbnf_to_lark(g).map_err(|e| ConstraintError::Grammar(format!("GBNF: {e}")))?,
            ),
        })
    }
}

/// The largest bound a schema may set on a number: llguidance writes a range's regex through
/// `i64` (`1e30 as i64` saturates), so `minimum: 1e30` would admit 9223372036854775807, which
/// breaks the schema. Past 2^53 a JSON number is not an exact integer anyway.
pub const MAX_NUMBER_BOUND: f64 = 9_007_199_254_740_992.0;

/// Refuses numeric bounds past [`MAX_NUMBER_BOUND`] (the keywords' values, not data under
/// `const`, `enum`, `default` or `examples`), walked without recursion.
fn check_bounds(schema: &Value) -> Result<(), ConstraintError> {
    const BOUNDS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
    const DATA: [&str; 4] = ["const", "enum", "default", "examples"];
    let mut todo = vec![schema];
    while let Some(v) = todo.pop() {
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    if let (true, Some(n)) = (BOUNDS.contains(&k.as_str()), x.as_f64())
                        && n.abs() > MAX_NUMBER_BOUND
                    {
                        return Err(ConstraintError::Grammar(format!(
                            "json_schema: {k} = {x} is past 2^53, the numbers this server \
                             can constrain exactly"
                        )));
                    }
                    if !DATA.contains(&k.as_str()) {
                        todo.push(x);
                    }
                }
            }
            Value::Array(a) => todo.extend(a),
            _ => {}
        }
    }
    Ok(())
}

/// JSON without free whitespace unless the schema asks for it (`x-guidance`): with flexible
/// whitespace a small model can emit newlines until `max_tokens` and never close the object.
fn compact(mut schema: Value, strict: bool) -> Value {
    if let Some(o) = schema.as_object_mut()
        && !o.contains_key("x-guidance")
    {
        o.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
                "lenient": !strict,
            }),
        );
    }
    schema
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    /// The vocabulary cannot be turned into a token trie.
    #[error("structured output is unavailable for this model: {0}")]
    Vocab(String),
    /// The grammar or schema is invalid, unsupported, or past a compile budget.
    #[error("{0}")]
    Grammar(String),
}

/// The most structure ([`structure`]) a grammar may have: far beyond real schemas and grammars
/// (the largest of `tests/data/schemas` has 36), far below what overflows [`COMPILE_STACK`].
pub const MAX_GRAMMAR_STRUCTURE: usize = 16_384;

/// The compile thread's stack. Measured worst case: 3.3 KiB per unit of structure (a Lark rule
/// chain `a0: a1`, one unit a link), so 54 MiB at the bound; only the pages a compile touches
/// are ever resident, and the thread ends with its compile.
pub const COMPILE_STACK: usize = 128 << 20;

/// The units of structure a compile may recurse through, counted without recursion: each
/// bracket, and each `:` (a rule or terminal definition, a JSON key) in a grammar's text; each
/// object, array and key of a JSON schema. Every level of llguidance's recursion stands on at
/// least one of them (a rule or definition is on the recursion's path at most once), so this
/// bounds its depth.
pub fn structure(grammar: &Grammar) -> usize {
    let text = |t: &str| t.bytes().filter(|b| b"{[(:".contains(b)).count();
    match grammar {
        Grammar::JsonObject => 1,
        Grammar::JsonSchema { schema, .. } => {
            let mut n = 0usize;
            let mut todo = vec![schema];
            while let Some(v) = todo.pop() {
                match v {
                    Value::Object(o) => {
                        n = n.saturating_add(1 + o.len());
                        for (k, x) in o {
                            n = n.saturating_add(text(k));
                            todo.push(x);
                        }
                    }
                    Value::Array(a) => {
                        n = n.saturating_add(1);
                        todo.extend(a);
                    }
                    Value::String(s) => n = n.saturating_add(text(s)),
                    _ => {}
                }
            }
            n
        }
        Grammar::Regex(t) | Grammar::Lark(t) | Grammar::Gbnf(t) => text(t),
    }
}

/// The compile and per-mask budgets. llguidance's defaults, with a lower compile fuel and
/// grammar size: a request body is capped at a few MiB anyway, and a compile runs on the
/// server's preparation pool, where a second of work per request is already a lot.
fn limits() -> ParserLimits {
    ParserLimits {
        initial_lexer_fuel: 500_000,
        max_grammar_size: 250_000,
        // Errors name the problem without echoing the whole grammar and token history back.
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// The engine's tokenizer as llguidance sees it: the trie, and real tokenization for the
/// tokens a grammar forces.
struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one model's vocabulary (built once per model; cheap to share).
pub struct Compiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish_non_exhaustive()
    }
}

impl Compiler {
    /// The token trie from `tokenizer`'s vocabulary and llguidance's slicer over it (tens of
    /// milliseconds for a 50k vocabulary).
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, ConstraintError> {
        let n = tokenizer.vocab_size();
        let vocab =
            u32::try_from(n).map_err(|_| ConstraintError::Vocab("too many tokens".into()))?;
        let stops = tokenizer.stop_token_ids();
        let eos = tokenizer
            .eos_id()
            .or_else(|| stops.first().copied())
            .ok_or_else(|| ConstraintError::Vocab("the vocabulary has no end token".into()))?;
        if eos >= vocab {
            return Err(ConstraintError::Vocab(format!(
                "end token {eos} is outside the vocabulary"
            )));
        }
        let words: Vec<Vec<u8>> = (0..vocab)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if tokenizer.is_special(id) {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(bytes);
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        // The trie builder asserts on what a hostile vocabulary could hold (a token longer than
        // its 8-bit... length fields): caught, it is this model's error, not a crash.
        let built = std::panic::catch_unwind(|| {
            let mut eog: Vec<TokenId> = stops.iter().copied().filter(|&t| t < vocab).collect();
            if !eog.contains(&eos) {
                eog.insert(0, eos);
            }
            TokTrie::from(&TokRxInfo::new(vocab, eos), &words).with_eos_tokens(&eog)
        });
        let trie =
            built.map_err(|_| ConstraintError::Vocab("cannot build the token trie".into()))?;
        let env: llguidance::toktrie::TokEnv = Arc::new(Env {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocab(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Self { factory })
    }

    /// Compiles `grammar` into a constraint ready to run (a bad grammar, an unsupported schema
    /// keyword or a budget run past is the error, with llguidance's message). Refuses a grammar
    /// past [`MAX_GRAMMAR_STRUCTURE`]; compiles on a thread with a [`COMPILE_STACK`] stack.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let units = structure(grammar);
        if units > MAX_GRAMMAR_STRUCTURE {
            return Err(ConstraintError::Grammar(format!(
                "{} too large: {units} nested parts (brackets, definitions, keys) past the \
                 limit of {MAX_GRAMMAR_STRUCTURE}",
                grammar.kind()
            )));
        }
        std::thread::scope(|s| {
            let compile = std::thread::Builder::new()
                .name("tpslab-grammar".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(s, || self.compile_here(grammar))
                .map_err(|e| {
                    ConstraintError::Grammar(format!("cannot start the grammar compiler: {e}"))
                })?;
            compile.join().unwrap_or_else(|_| {
                Err(ConstraintError::Grammar(format!(
                    "{}: the grammar compiler failed",
                    grammar.kind()
                )))
            })
        })
    }

    /// The compile itself, on the caller's stack.
    fn compile_here(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let tlg = grammar.to_llguidance()?;
        let parser = self
            .factory
            .create_parser(tlg)
            .map_err(|e| ConstraintError::Grammar(format!("{}: {e}", grammar.kind())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Grammar(format!("{}: {e}", grammar.kind())));
        }
        Ok(Constraint {
            matcher: Box::new(matcher),
            kind: grammar.kind(),
        })
    }
}

/// Compilers of the vocabularies in use, newest last: a few at most (the window can hold one
/// model while a second loads), each with the tokenizer it was built from.
static COMPILERS: Mutex<Vec<(Tokenizer, Arc<Compiler>)>> = Mutex::new(Vec::new());
const KEEP_COMPILERS: usize = 2;

/// The compiler for a loaded model's tokenizer: built on first use (tens of milliseconds), then
/// shared by every request on that model and by every copy of its bundle (a precision change
/// keeps the tokenizer, so it keeps the compiler).
pub fn compiler_for(tokenizer: &Tokenizer) -> Result<Arc<Compiler>, ConstraintError> {
    let mut cache = COMPILERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(i) = cache.iter().position(|(t, _)| t.same_as(tokenizer)) {
        let hit = cache.remove(i);
        let c = Arc::clone(&hit.1);
        cache.push(hit);
        return Ok(c);
    }
    let c = Arc::new(Compiler::new(tokenizer)?);
    if cache.len() >= KEEP_COMPILERS {
        cache.remove(0);
    }
    cache.push((tokenizer.clone(), Arc::clone(&c)));
    Ok(c)
}

/// One compiled grammar at its start state.
#[derive(Clone)]
pub struct Constraint {
    /// Boxed: a matcher is over a kilobyte, and requests travel by value through channels.
    matcher: Box<Matcher>,
    kind: &'static str,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("kind", &self.kind)
            .finish()
    }
}

/// Process-wide mask costs (for the benchmark and `/metrics`-style reports): masks computed,
/// nanoseconds computing them on the workers, and nanoseconds the engine step waited for one.
static MASKS: AtomicU64 = AtomicU64::new(0);
static MASK_NS: AtomicU64 = AtomicU64::new(0);
static WAIT_NS: AtomicU64 = AtomicU64::new(0);

/// Totals since the process started (see [`mask_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaskStats {
    pub masks: u64,
    /// Time computing masks, on the workers.
    pub compute_ns: u64,
    /// Time the engine step spent waiting for a mask that was not ready.
    pub wait_ns: u64,
}

pub fn mask_stats() -> MaskStats {
    MaskStats {
        masks: MASKS.load(Ordering::Relaxed),
        compute_ns: MASK_NS.load(Ordering::Relaxed),
        wait_ns: WAIT_NS.load(Ordering::Relaxed),
    }
}

type MaskResult = Result<SimpleVob, String>;

/// Why a constrained request cannot go on: its matcher failed, a budget ran out, or the
/// grammar allows no token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MaskError(pub String);

/// A constraint as one request runs it in the engine: the next mask is computed on rayon's
/// pool as soon as a token is committed, so it overlaps the next forward pass; the step only
/// waits when the forward was faster.
pub(crate) struct ConstraintRun {
    matcher: Arc<Mutex<Matcher>>,
    /// The mask for the current state, once known.
    mask: Option<MaskResult>,
    /// The mask being computed for the current state.
    pending: Option<Receiver<MaskResult>>,
}

fn lock_err() -> String {
    "the grammar matcher failed earlier".into()
}

impl ConstraintRun {
    /// Starts computing the first mask (it overlaps the prompt's prefill).
    pub fn start(c: Constraint) -> Self {
        let mut run = Self {
            matcher: Arc::new(Mutex::new(*c.matcher)),
            mask: None,
            pending: None,
        };
        run.spawn_mask();
        run
    }

    fn spawn_mask(&mut self) {
        let (tx, rx) = mpsc::channel();
        let matcher = Arc::clone(&self.matcher);
        rayon::spawn(move || {
            let t = Instant::now();
            let r = match matcher.lock() {
                Ok(mut m) => m.compute_mask_or_eos().map_err(|e| e.to_string()),
                Err(_) => Err(lock_err()),
            };
            MASKS.fetch_add(1, Ordering::Relaxed);
            MASK_NS.fetch_add(elapsed_ns(t), Ordering::Relaxed);
            let _ = tx.send(r);
        });
        self.pending = Some(rx);
    }

    /// The mask for the current state (waits for the worker when it is not done yet).
    fn mask(&mut self) -> &MaskResult {
        if self.mask.is_none() {
            let t = Instant::now();
            let r = match self.pending.take() {
                Some(rx) => rx
                    .recv()
                    .unwrap_or_else(|_| Err("the mask worker stopped".into())),
                None => Err("no mask was started".into()),
            };
            WAIT_NS.fetch_add(elapsed_ns(t), Ordering::Relaxed);
            self.mask = Some(r);
        }
        self.mask.get_or_insert_with(|| Err(lock_err()))
    }

    /// Sets every logit the grammar forbids to -inf (ids past the vocabulary too), before
    /// penalties and sampling. An error (the matcher failed, a budget ran out) fails the
    /// request; a mask that allows nothing is one too.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), MaskError> {
        let mask = self.mask().as_ref().map_err(|e| MaskError(e.clone()))?;
        // Ids past the vocabulary the mask covers (an embedding padded past the tokenizer's).
        let n = mask.len().min(logits.len());
        let (inside, past) = logits.split_at_mut(n);
        past.fill(f32::NEG_INFINITY);
        let words = mask.as_slice();
        let mut any = false;
        for (i, chunk) in inside.chunks_mut(32).enumerate() {
            let w = words.get(i).copied().unwrap_or(0);
            if w == u32::MAX && chunk.len() == 32 {
                any = true;
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if w & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                } else {
                    any = true;
                }
            }
        }
        if any {
            Ok(())
        } else {
            Err(MaskError("the grammar allows no token here".into()))
        }
    }

    /// Advances by the committed token and starts the next mask; `Some(Stop)` when the grammar
    /// is complete and admits nothing more. A token the grammar refuses (it cannot be one the
    /// mask let through) fails the request at its next step.
    pub fn advance(&mut self, token: u32) -> Option<FinishReason> {
        let r = match self.matcher.lock() {
            Ok(mut m) => m
                .consume_token(token)
                .map(|()| m.is_stopped())
                .map_err(|e| e.to_string()),
            Err(_) => Err(lock_err()),
        };
        match r {
            Ok(true) => Some(FinishReason::Stop),
            Ok(false) => {
                self.mask = None;
                self.spawn_mask();
                None
            }
            Err(e) => {
                self.pending = None;
                self.mask = Some(Err(format!("the grammar refused token {token}: {e}")));
                None
            }
        }
    }
}

fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
